"""Threads on the export path: a sampled call is touched by its own thread and ONE worker,
which makes the spans and calls every exporter in order (no thread per exporter)."""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

import profkit
from profkit import WindowSummary


@profkit.profiled("work")
def work() -> int:
    return 1


class SpanThreads(SpanProcessor):
    """Records the thread that ends each span (the span step's)."""

    def __init__(self) -> None:
        self.idents: set[int] = set()

    def on_end(self, span: ReadableSpan) -> None:
        self.idents.add(threading.get_ident())


class LoggerThreads:
    """A structlog-style logger that records the thread of each event (the "log" exporter's)."""

    def __init__(self) -> None:
        self.idents: set[int] = set()

    def info(self, event: str, **fields: Any) -> None:
        self.idents.add(threading.get_ident())

    warning = info


class ExporterThreads:
    """An exporter of the application's that records the thread of each export."""

    name = "threads"

    def __init__(self) -> None:
        self.idents: set[int] = set()
        self.windows: list[int] = []

    def export(self, summary: WindowSummary) -> None:
        self.idents.add(threading.get_ident())
        self.windows.append(summary.window_id)


def _profkit_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("profkit")}


def test_a_sampled_call_is_touched_by_its_thread_and_one_worker() -> None:
    """Spans, log events and an extra exporter all run on one worker thread, no other."""
    spans, logger, extra = SpanThreads(), LoggerThreads(), ExporterThreads()
    provider = TracerProvider()
    provider.add_span_processor(spans)
    profkit.configure(
        sample_every=1,
        cold_calls=0,
        max_per_minute=None,
        exporters=("otel", "log"),
        tracer_provider=provider,
        logger=logger,
        extra_exporters=(extra,),
    )
    for _ in range(20):
        work()
    before_flush = _profkit_threads()
    assert profkit.force_flush(10.0) is True
    assert 20 == profkit.stats()["exported"]
    workers = spans.idents | logger.idents | extra.idents
    assert 1 == len(workers)
    assert threading.get_ident() not in workers
    assert {"profkit-export"} == before_flush


class Hanging:
    """Blocks its first export until released (far past the export timeout)."""

    name = "hang"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.windows: list[int] = []

    def export(self, summary: WindowSummary) -> None:
        if not self.entered.is_set():
            self.entered.set()
            self.release.wait(30)
        self.windows.append(summary.window_id)


def _settled(timeout: float = 10.0) -> dict[str, Any]:
    """stats() once every sampled call is counted (polled, no flush)."""
    import time

    end = time.monotonic() + timeout
    while True:
        stats: dict[str, Any] = dict(profkit.stats())
        if stats["sampled"] == stats["exported"] + stats["dropped"] or time.monotonic() > end:
            return stats
        time.sleep(0.02)


def test_a_hung_exporter_is_cut_by_the_next_sampled_call_and_its_worker_exits() -> None:
    """The next window offered notices the overrun: the hung window is counted, a fresh
    worker takes over (the others still get every window), and the stuck worker exits once
    the exporter returns, its late result discarded."""
    import time

    hanging, after = Hanging(), ExporterThreads()
    profkit.configure(
        sample_every=1,
        cold_calls=0,
        max_per_minute=None,
        exporters=(),
        extra_exporters=(hanging, after),
        export_timeout=0.2,
    )
    try:
        work()
        assert hanging.entered.wait(10)
        time.sleep(0.3)  # past export_timeout: the next sampled call notices
        work()
        stats = _settled()
        assert (2, 0, 2) == (stats["sampled"], stats["exported"], stats["dropped"])
        assert {"export_timeout:hang": 2} == stats["dropped_reasons"]
        assert 2 == len(_workers())  # the stuck one and the fresh one
    finally:
        hanging.release.set()
    end = time.monotonic() + 10
    while len(_workers()) > 1 and time.monotonic() < end:
        time.sleep(0.02)
    assert 1 == len(_workers())
    assert [1, 2] == after.windows  # the exporter after the hung one still got both
    work()
    assert profkit.force_flush(10.0) is False  # windows were lost since the last flush
    stats = profkit.stats()
    assert (1, 2) == (stats["exported"], stats["dropped"])
    assert [1, 3] == hanging.windows  # the late result of window 1 was discarded, not counted


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "profkit-export" and t.is_alive()]
