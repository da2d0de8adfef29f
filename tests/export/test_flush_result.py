"""force_flush() and shutdown() say True only when every window handed off since the last
call was exported by every exporter (and the span step); each way a window is lost says False."""

from __future__ import annotations

import threading
import time
import warnings

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

import profkit
from profkit import WindowSummary
from profkit.testing import CaptureExporter


@profkit.profiled("work")
def work() -> int:
    return 1


def _calls(n: int) -> None:
    for _ in range(n):
        work()


def _balanced(stats: profkit.StatsSnapshot) -> bool:
    return stats["sampled"] == stats["exported"] + stats["dropped"]


class Flaky:
    """Raises on every window while ``failing`` is set."""

    name = "flaky"

    def __init__(self) -> None:
        self.failing = True

    def export(self, summary: WindowSummary) -> None:
        if self.failing:
            raise RuntimeError("down")


def _settings() -> dict[str, object]:
    return {"sample_every": 1, "max_per_minute": None}


@pytest.mark.usefixtures("swallow_internal_errors")
def test_an_exporter_that_fails_every_window_makes_flush_false_then_true_again() -> None:
    flaky = Flaky()
    profkit.configure(**_settings(), exporters=(), extra_exporters=(flaky,))  # type: ignore[arg-type]
    _calls(5)
    assert profkit.force_flush(10.0) is False
    stats = profkit.stats()
    assert 0 == stats["exported"]
    assert stats["dropped"] == stats["sampled"] > 0
    flaky.failing = False
    _calls(3)
    assert profkit.force_flush(10.0) is True  # only what was handed off since the last call
    assert profkit.shutdown(10.0) is True


def test_a_clean_run_flushes_true() -> None:
    cap = CaptureExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    profkit.configure(
        **_settings(),  # type: ignore[arg-type]
        exporters=("otel",),
        tracer_provider=provider,
        extra_exporters=(cap,),
    )
    _calls(5)
    assert profkit.force_flush(10.0) is True
    assert profkit.force_flush(10.0) is True  # nothing new: still True
    assert profkit.shutdown(10.0) is True
    assert _balanced(profkit.stats())


@pytest.mark.parametrize("with_capture", [False, True])
def test_a_sampler_that_drops_every_span_makes_flush_false(with_capture: bool) -> None:
    provider = TracerProvider(sampler=ALWAYS_OFF)
    extra = (CaptureExporter(),) if with_capture else ()
    profkit.configure(
        **_settings(),  # type: ignore[arg-type]
        exporters=("otel",),
        tracer_provider=provider,
        extra_exporters=extra,
    )
    _calls(5)
    assert profkit.force_flush(10.0) is False  # the span step exported nothing
    _calls(2)
    assert profkit.shutdown(10.0) is False
    assert _balanced(profkit.stats())


def test_no_exporter_at_all_makes_flush_false() -> None:
    profkit.configure(**_settings(), exporters=())  # type: ignore[arg-type]
    _calls(3)
    assert profkit.force_flush(10.0) is False
    stats = profkit.stats()
    assert stats["dropped_reasons"].get("no_exporter", 0) == stats["sampled"] > 0


def test_otel_without_a_tracer_provider_warns_once_and_flushes_false(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)  # the API's default: nothing set
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profkit.configure(**_settings(), exporters=("otel",))  # type: ignore[arg-type]
        for _ in range(3):
            _calls(2)
            assert profkit.force_flush(10.0) is False
    ours = [w for w in caught if issubclass(w.category, profkit.ProfkitConfigWarning)]
    assert 1 == len(ours), [str(w.message) for w in caught]
    assert "tracer_provider" in str(ours[0].message)
    assert profkit.stats()["dropped_reasons"].get("span_not_recording", 0) > 0


class Stuck:
    """Blocks in export until released."""

    name = "stuck"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def export(self, summary: WindowSummary) -> None:
        self.entered.set()
        self.release.wait(30)


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("swallow_internal_errors")
def test_shutdown_with_a_stuck_exporter_counts_the_window_in_flight() -> None:
    stuck = Stuck()
    profkit.configure(
        **_settings(),  # type: ignore[arg-type]
        exporters=(),
        extra_exporters=(stuck,),
        export_timeout=30.0,
    )
    try:
        work()
        assert stuck.entered.wait(10)
        assert profkit.shutdown(0.5) is False
        stats = profkit.stats()
        assert 1 == stats["sampled"]
        assert _balanced(stats), stats
        assert 1 == stats["dropped_reasons"].get("shutdown")
    finally:
        stuck.release.set()
    time.sleep(0.3)  # the worker finishes the window: it is not counted twice
    assert _balanced(profkit.stats()), profkit.stats()


def test_shutdown_whose_deadline_passes_before_a_sampled_call_ends_says_false() -> None:
    """A sampled call on another thread outlives shutdown's timeout: the call is lost to
    the exporters (dropped, reason ``shutdown``, when it ends), so shutdown says False."""
    collected = CaptureExporter()
    profkit.configure(
        **_settings(),  # type: ignore[arg-type]
        exporters=(),
        extra_exporters=(collected,),
    )
    inside, leave = threading.Event(), threading.Event()

    @profkit.profiled("long")
    def long_call() -> int:
        inside.set()
        leave.wait(10)
        return 2

    worker = threading.Thread(target=long_call)
    worker.start()
    try:
        assert inside.wait(10)
        assert profkit.shutdown(0.2) is False
    finally:
        leave.set()
        worker.join(10)
    time.sleep(0.2)
    stats = profkit.stats()
    assert _balanced(stats), stats
    assert 1 == stats["dropped_reasons"].get("shutdown")
    assert [] == collected.calls


def test_force_flush_exports_an_idle_window_of_its_own_thread() -> None:
    """``window=3``, four calls: the second window is open, waiting for two more calls.
    ``force_flush()`` on its thread closes it and exports its call: once it says True,
    nothing that ended is pending."""
    collected = CaptureExporter()
    profkit.configure(
        **_settings(),  # type: ignore[arg-type]
        exporters=(),
        extra_exporters=(collected,),
        window=3,
    )
    _calls(4)
    assert profkit.force_flush(10.0) is True
    stats = profkit.stats()
    assert 4 == stats["sampled"]
    assert _balanced(stats), stats
    assert 4 == len(collected.calls)
    _calls(3)  # sampling goes on in fresh windows
    assert profkit.shutdown(10.0) is True
    assert 7 == len(collected.calls)


def test_force_flush_from_another_thread_says_false_while_a_window_waits() -> None:
    """The idle window belongs to a thread that is still alive: another thread cannot close
    a thread-local profiler, so the window's call stays pending and the result says so."""
    collected = CaptureExporter()
    profkit.configure(
        **_settings(),  # type: ignore[arg-type]
        exporters=(),
        extra_exporters=(collected,),
        window=2,
    )
    work()  # this thread's window waits for its second call
    results: list[bool] = []
    flusher = threading.Thread(target=lambda: results.append(profkit.force_flush(5.0)))
    flusher.start()
    flusher.join(10)
    assert [False] == results
    work()  # the window is full: handed off
    assert profkit.force_flush(10.0) is True
    assert 2 == len(collected.calls)
    profkit.shutdown(10.0)


@profkit.profiled("flushing")
def flushing(results: list[tuple[bool, int, int]]) -> None:
    """Flushes from inside the call, and notes what the flush said and the counts then."""
    flushed = profkit.force_flush(5.0)
    stats = profkit.stats()
    results.append((flushed, stats["sampled"], stats["exported"]))


def test_force_flush_inside_a_windows_later_call_says_false_for_its_ended_calls() -> None:
    """``window=3``: a flush inside the second call cannot export the first one, which
    ended before it (the window records on): it says False; the flush after says True."""
    collected = CaptureExporter()
    profkit.configure(
        **_settings(),  # type: ignore[arg-type]
        exporters=(),
        extra_exporters=(collected,),
        window=3,
    )
    results: list[tuple[bool, int, int]] = []
    work()  # the window's first call ends: recorded, pending until the window closes
    flushing(results)
    assert [(False, 2, 0)] == results
    work()  # the window is full: handed off
    assert profkit.force_flush(10.0) is True
    assert 3 == len(collected.calls)
    profkit.shutdown(10.0)


def test_force_flush_while_a_window_runs_its_later_call_on_another_thread_says_false() -> None:
    """``window=2``, its second call running on its thread: a flush from another thread
    cannot export the first call, which ended before it, and says False."""
    collected = CaptureExporter()
    profkit.configure(
        **_settings(),  # type: ignore[arg-type]
        exporters=(),
        extra_exporters=(collected,),
        window=2,
    )
    results: list[bool] = []

    @profkit.profiled("work")
    def work_flushed_elsewhere() -> None:
        flusher = threading.Thread(target=lambda: results.append(profkit.force_flush(5.0)))
        flusher.start()
        flusher.join(10)

    work()
    work_flushed_elsewhere()  # the window's second call: the flush runs while it runs
    assert [False] == results
    assert profkit.force_flush(10.0) is True
    assert 2 == len(collected.calls)
    profkit.shutdown(10.0)


def test_calls_into_a_shut_down_provider_are_dropped_not_exported() -> None:
    """However the provider is shut down, spans made after that count as dropped."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    profkit.configure(**_settings(), exporters=("otel",), tracer_provider=provider)  # type: ignore[arg-type]
    _calls(2)
    assert profkit.force_flush(10.0) is True
    delivered = len(spans.get_finished_spans())
    provider.shutdown()
    _calls(3)
    assert profkit.force_flush(10.0) is False
    stats = profkit.stats()
    assert stats["exported"] == delivered == 2
    assert stats["dropped_reasons"] == {"provider_shut_down": 3}
