"""What force_flush() and shutdown() return, and what the counters say when it is False:
a flush that failed says why, a flush that timed out holds up no later span, a bad timeout
changes nothing, nothing pending flushes in no time, and a slow exporter within its timeout
delays the next one but drops nothing."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import profkit
from profkit import WindowSummary
from profkit._export.fanout import Fanout


@profkit.profiled("work")
def work() -> int:
    return 1


def _settings() -> dict[str, object]:
    return {"sample_every": 1, "cold_calls": 0, "max_per_minute": None}


class Sink:
    name = "sink"

    def __init__(self) -> None:
        self.windows = 0

    def export(self, summary: WindowSummary) -> None:
        self.windows += 1


class RaisingFlush(Sink):
    name = "raising"

    def force_flush(self, timeout: float) -> bool:
        raise OSError("disk full while flushing")


class FlushWithoutTimeout(Sink):
    name = "no_timeout"

    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def force_flush(self) -> bool:
        self.flushes += 1
        return True


@pytest.mark.usefixtures("swallow_internal_errors")
def test_an_exporters_flush_that_raises_is_counted() -> None:
    profkit.configure(**_settings(), exporters=(), extra_exporters=(RaisingFlush(),))  # type: ignore[arg-type]
    work()
    assert profkit.force_flush(5.0) is False
    stats = profkit.stats()
    assert 1 == stats["exported"]
    assert 1 == stats["error_reasons"].get("flush_error:raising")


def test_a_flush_without_a_timeout_parameter_is_called() -> None:
    exporter = FlushWithoutTimeout()
    profkit.configure(**_settings(), exporters=(), extra_exporters=(exporter,))  # type: ignore[arg-type]
    work()
    assert profkit.force_flush(5.0) is True
    assert 1 == exporter.flushes
    assert {} == profkit.stats()["error_reasons"]


class NoTimeoutSubclass(profkit.exporters.Exporter):
    """OpenTelemetry's style in an ``Exporter`` subclass: ``force_flush(self)``, and a
    ``shutdown(self, timeout_millis)``."""

    name = "subclass"

    def __init__(self) -> None:
        self.windows = self.flushes = 0
        self.shut_millis: int | None = None

    def export(self, summary: WindowSummary) -> None:
        self.windows += 1

    def force_flush(self) -> bool:  # type: ignore[override]
        self.flushes += 1
        return True

    def shutdown(self, timeout_millis: int = 30_000) -> None:  # type: ignore[override]
        self.shut_millis = timeout_millis


def test_an_exporter_subclass_whose_methods_take_no_seconds_is_called_as_they_are() -> None:
    """Its flush and shutdown were called with seconds by position: both failed (a
    ``TypeError``, counted ``flush_error:subclass`` / ``shutdown_error:subclass``)."""
    exporter = NoTimeoutSubclass()
    profkit.configure(**_settings(), exporters=(), extra_exporters=(exporter,))  # type: ignore[arg-type]
    work()
    assert profkit.force_flush(5.0) is True
    assert profkit.shutdown(4.0) is True
    assert (exporter.windows, exporter.flushes) == (1, 1)
    assert exporter.shut_millis is not None
    assert 0 < exporter.shut_millis <= 4000
    assert {} == profkit.stats()["error_reasons"]


class Hanging(SpanExporter):
    """A span exporter whose export blocks until released (a collector that never answers)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.spans = 0

    def export(self, spans: object) -> SpanExportResult:
        self.entered.set()
        self.release.wait(30)
        self.spans += len(spans)  # type: ignore[arg-type]
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.release.wait(timeout_millis / 1000)


@pytest.fixture
def hanging() -> Iterator[Hanging]:
    exporter = Hanging()
    yield exporter
    exporter.release.set()


def test_a_timed_out_flush_holds_up_no_later_span(hanging: Hanging) -> None:
    """force_flush() times out on a hung span processor; the calls after it still get their
    spans made (the span step is not stuck behind the provider's flush)."""
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))

    class Stuck(SpanProcessor):  # its flush hangs, like a batch one's with a dead collector
        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return hanging.force_flush(30_000)

    provider.add_span_processor(Stuck())
    profkit.configure(**_settings(), exporters=("otel",), tracer_provider=provider)
    work()
    assert profkit.force_flush(0.5) is False  # the provider's flush is still hung
    for _ in range(3):
        work()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and profkit.stats()["exported"] < 4:
        time.sleep(0.05)
    stats = profkit.stats()
    assert 4 == stats["exported"], stats
    assert 0 == stats["dropped"], stats["dropped_reasons"]
    assert 4 == sum(1 for s in memory.get_finished_spans() if s.name == "work")
    hanging.release.set()


def test_spans_missing_beside_another_exporter_say_why() -> None:
    """The provider shut down: the log of calls still reaches the other exporter (exported),
    and the missing spans are counted, so flush's False has a reason."""
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    sink = Sink()
    profkit.configure(
        **_settings(), exporters=("otel",), tracer_provider=provider, extra_exporters=(sink,)
    )  # type: ignore[arg-type]
    work()
    assert profkit.force_flush(5.0) is True
    provider.shutdown()
    for _ in range(3):
        work()
    assert profkit.force_flush(5.0) is False
    stats = profkit.stats()
    assert 4 == stats["exported"]
    assert 3 == stats["error_reasons"].get("provider_shut_down")
    assert 1 == sum(1 for s in memory.get_finished_spans() if s.name == "work")


@pytest.mark.parametrize("bad", ["5", float("nan"), True, object()])
def test_a_bad_timeout_raises_before_anything_changes(bad: object) -> None:
    class Slow(Sink):
        def export(self, summary: WindowSummary) -> None:
            time.sleep(0.2)
            super().export(summary)

    slow = Slow()
    profkit.configure(**_settings(), exporters=(), extra_exporters=(slow,))  # type: ignore[arg-type]
    for _ in range(3):
        work()
    for fn in (profkit.force_flush, profkit.shutdown):
        with pytest.raises(ValueError, match="timeout"):
            fn(bad)  # type: ignore[arg-type]
    assert profkit.get_config() is not None  # still installed: shutdown changed nothing
    assert profkit.shutdown(10.0) is True
    stats = profkit.stats()
    assert 3 == stats["sampled"] == stats["exported"] == slow.windows


def test_none_waits_and_a_negative_timeout_is_no_time() -> None:
    profkit.configure(**_settings(), exporters=(), extra_exporters=(Sink(),))  # type: ignore[arg-type]
    work()
    assert profkit.force_flush(None) is True
    assert profkit.force_flush(-1) is True  # nothing pending: nothing to wait for
    assert profkit.force_flush(np.int64(2)) is True  # any real number, numpy's too
    assert profkit.force_flush(np.float32(2.0)) is True
    assert profkit.force_flush(10**400) is True  # past any float: as long as it takes
    assert profkit.shutdown(np.int64(5)) is True


def test_nothing_pending_flushes_in_no_time() -> None:
    """force_flush(0) with nothing sampled, or everything already flushed, is True."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    profkit.configure(**_settings(), tracer_provider=provider)
    assert profkit.force_flush(0) is True
    work()
    assert profkit.force_flush(5.0) is True
    assert profkit.force_flush(0) is True


def test_a_slow_exporter_within_its_timeout_delays_but_drops_nothing() -> None:
    """The worker calls exporters in order: a slow one (within ``export_timeout``) delays
    the next one's window, and every window still reaches both, in order."""
    seen: list[tuple[str, int]] = []

    class Slow(Sink):
        name = "slow"

        def export(self, summary: WindowSummary) -> None:
            time.sleep(0.05)
            seen.append((self.name, summary.window_id))
            super().export(summary)

    class Fast(Sink):
        name = "fast"

        def export(self, summary: WindowSummary) -> None:
            seen.append((self.name, summary.window_id))
            super().export(summary)

    slow, fast = Slow(), Fast()
    profkit.configure(**_settings(), exporters=(), extra_exporters=(slow, fast))  # type: ignore[arg-type]
    work()
    work()
    assert profkit.force_flush(20.0) is True
    assert [("slow", 1), ("fast", 1), ("slow", 2), ("fast", 2)] == seen
    assert 2 == slow.windows == fast.windows


def test_an_opentelemetry_style_exporter_gets_milliseconds() -> None:
    """``force_flush(timeout_millis)`` / ``shutdown(timeout_millis)``, OpenTelemetry's
    spelling, are given milliseconds (5 s, not 5 ms)."""
    got: dict[str, int] = {}

    class Millis(Sink):
        name = "millis"

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            got["flush"] = timeout_millis
            return True

        def shutdown(self, timeout_millis: int = 30000) -> None:
            got["shutdown"] = timeout_millis

    profkit.configure(**_settings(), exporters=(), extra_exporters=(Millis(),))  # type: ignore[arg-type]
    work()
    assert profkit.force_flush(5.0) is True
    assert profkit.shutdown(5.0) is True
    assert 4000 <= got["flush"] <= 5000
    assert 0 < got["shutdown"] <= 5000
    assert isinstance(got["flush"], int)


def test_a_flush_racing_an_export_does_not_mark_it_flushed() -> None:
    """A window exported while a flush runs (its spans not yet at the provider when the
    provider flushed) is flushed by the next force_flush, not skipped as already flushed."""
    memory = InMemorySpanExporter()
    release = threading.Event()

    class SlowEnd(SpanProcessor):  # a span processor that takes its time
        def on_end(self, span: object) -> None:
            release.wait(10)

    provider = TracerProvider()
    provider.add_span_processor(SlowEnd())
    provider.add_span_processor(BatchSpanProcessor(memory, schedule_delay_millis=60_000))
    profkit.configure(**_settings(), exporters=("otel",), tracer_provider=provider)

    def tracer(frame: Any, event: str, arg: Any) -> None:
        # as the flushing thread enters the fan-out's flush (its wait for pending windows
        # over), another thread's sampled call ends and the worker takes its window up
        if event == "call" and frame.f_code is Fanout.flush.__code__:
            sys.settrace(None)
            thread = threading.Thread(target=work)
            thread.start()
            thread.join()
            deadline = time.monotonic() + 10
            while not release.is_set() and time.monotonic() < deadline:
                if profkit.stats()["sampled"] and _span_step_started(frame.f_locals["self"]):
                    break
                time.sleep(0.001)

    sys.settrace(tracer)
    profkit.force_flush(5.0)
    sys.settrace(None)
    release.set()
    deadline = time.monotonic() + 10
    while profkit.stats()["exported"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert profkit.force_flush(5.0) is True
    assert ["work"] == [s.name for s in memory.get_finished_spans()]


def _span_step_started(fanout: Fanout) -> bool:
    return fanout._spans is not None and fanout._spans.busy


def test_a_window_arriving_during_an_exporters_flush_waits_for_it() -> None:
    """An exporter busy flushing (a file being synced) is not stuck: a window exported
    meanwhile queues behind the flush instead of being dropped as ``export_timeout``."""
    flushing = threading.Event()

    class SlowFlush(Sink):
        name = "file"

        def force_flush(self, timeout: float = 5.0) -> bool:
            flushing.set()
            time.sleep(0.3)
            return True

    exporter = SlowFlush()
    profkit.configure(**_settings(), exporters=(), extra_exporters=(exporter,))  # type: ignore[arg-type]
    work()
    flusher = threading.Thread(target=profkit.force_flush, args=(5.0,))
    flusher.start()
    assert flushing.wait(10)
    work()  # a sampled call that ends while the exporter flushes
    flusher.join()
    assert profkit.force_flush(5.0) is True
    stats = profkit.stats()
    assert (2, 0) == (stats["exported"], stats["dropped"]), stats["dropped_reasons"]
    assert 2 == exporter.windows
