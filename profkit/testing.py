"""Helpers for tests, profkit's own and yours: capture summaries, spans and log events.

Example::

    from profkit.testing import capture

    def test_predict_is_profiled():
        with capture(sample_every=1) as cap:
            predict(batch)
        assert cap.calls[0].label == "predict"
        assert cap.spans()[0].name == "predict"
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from . import _errors
from ._config import build_config
from ._global import forget, get_session, install, shutdown
from ._model import CallSummary, WindowSummary
from ._session import Session
from ._stats import Stats, StatsSnapshot
from .exporters import Exporter

__all__ = ["Capture", "CaptureExporter", "capture", "raise_internal_errors", "reset"]


class CaptureExporter(Exporter):
    """An exporter that keeps every summary it is given, in memory."""

    name = "capture"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.windows: list[WindowSummary] = []

    def export(self, summary: WindowSummary) -> None:
        with self._lock:
            self.windows.append(summary)

    @property
    def calls(self) -> list[CallSummary]:
        with self._lock:
            return [c for w in self.windows for c in w.calls]


class Capture:
    """What :func:`capture` collects: summaries, finished spans and the session's stats."""

    def __init__(self, exporter: CaptureExporter, spans: InMemorySpanExporter) -> None:
        self.exporter = exporter
        self.span_exporter = spans
        self.stats: StatsSnapshot = Stats().snapshot()

    @property
    def calls(self) -> list[CallSummary]:
        return self.exporter.calls

    @property
    def windows(self) -> list[WindowSummary]:
        return list(self.exporter.windows)

    def spans(self) -> tuple[ReadableSpan, ...]:
        return tuple(self.span_exporter.get_finished_spans())


@contextmanager
def capture(**settings: Any) -> Iterator[Capture]:
    """Install a global session that exports into memory; on exit flush it, shut it down and
    put back the session that was global before (if any).

    Spans go to a private TracerProvider with an ``InMemorySpanExporter`` unless
    ``tracer_provider`` is given; ``exporters`` defaults to ``("otel",)`` plus the capture.
    ``max_per_minute`` defaults to None (no rate cap), so that a test profiles exactly the
    calls the sampler picks, however fast it runs; with ``capture_slow``, ``max_overhead``
    defaults to 1.0, so that speculative windows open as the test's calls allow (a
    session's default, with no ``max_overhead``, pays them from 1% of the process's CPU).
    ``Capture.stats`` holds the session's final counters once the block has ended.
    """
    spans = InMemorySpanExporter()
    provider = settings.pop("tracer_provider", None)
    if provider is None:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
    exporter = CaptureExporter()
    settings.setdefault("exporters", ("otel",))
    settings.setdefault("max_per_minute", None)
    if settings.get("capture_slow"):
        settings.setdefault("max_overhead", 1.0)
    extra = tuple(settings.pop("extra_exporters", ()))
    config = build_config(
        # first: the worker calls exporters in order, and a hung one of the test's own
        # must not keep the summaries from the capture
        {"tracer_provider": provider, "extra_exporters": (exporter, *extra), **settings}
    )
    session = Session(config)
    previous = install(session)
    cap = Capture(exporter, spans)
    try:
        yield cap
    finally:
        session.force_flush(10.0)
        cap.stats = session.stats.snapshot()
        if get_session() is session and previous is None:
            shutdown(10.0)  # stats() then keeps reporting this session's final counters
        else:
            if get_session() is session:
                install(previous)
            session.shutdown(10.0)


def reset() -> None:
    """Shut the global session down (flushing briefly) and forget it and its counters."""
    shutdown(2.0)
    forget()


def raise_internal_errors(enabled: bool = True) -> bool:
    """Make profkit re-raise its internal errors (for test suites); returns the old value."""
    old = _errors.raise_internal
    _errors.raise_internal = enabled
    return old
