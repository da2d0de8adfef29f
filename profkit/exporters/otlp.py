"""OTLP on the wire: a ``BatchSpanProcessor`` around the real OTLP span exporter, with counts.

profkit makes spans through an ordinary OpenTelemetry ``TracerProvider``; getting them to a
collector is the provider's job. ``otlp_span_processor`` builds the usual processor for
that (gRPC or HTTP/protobuf, configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables or
keyword arguments), with one addition: the span exporter is wrapped in a
``CountingSpanExporter``, so a collector that is down or slow shows up in
``profkit.stats()`` (``error_reasons["otlp_export_failed"]`` per failed batch,
``otlp_spans_failed`` per span of profkit's: the application's own spans in the same
batches are not counted; a span of profkit's that the processor's full queue drops counts
there too, with ``error_reasons["otlp_queue_full"]``) instead of only in the OTel SDK's
log, and ``profkit.force_flush()`` / ``profkit.shutdown()`` return False when profkit spans
failed since the last of them. A sampled call whose span failed is not counted
``exported``: it moves to ``dropped`` (``otlp_export_failed`` / ``otlp_queue_full``).
profkit's own flush and shutdown flush the processors built here wherever they were added
(the application's global provider too), so what failed is known before they return.

The OTLP exporter packages are optional: ``pip install 'profkit[otlp]'``.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from ._counters import DEFAULT, OWNED, Counters, unexport
from .otel import TRACER_NAME

__all__ = ["PROTOCOLS", "CountingBatchSpanProcessor", "CountingSpanExporter", "otlp_span_processor"]

#: the OTLP protocols profkit can build an exporter for (OTel's names for them)
PROTOCOLS = ("grpc", "http/protobuf")

#: the error reason counted once per failed batch that held profkit spans
FAILED_REASON = "otlp_export_failed"
#: the counter of spans in failed batches (and of those the processor's full queue dropped)
SPANS_FAILED = "otlp_spans_failed"
#: the error reason counted once per profkit span a full processor queue dropped
QUEUE_FULL_REASON = "otlp_queue_full"
#: the attribute only a call's own span carries (not its regions', not a batch member's)
_CALL_ATTRIBUTE = "profkit.call.index"

_MODULES = {
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
}
_PACKAGES = {
    "grpc": "opentelemetry-exporter-otlp-proto-grpc",
    "http/protobuf": "opentelemetry-exporter-otlp-proto-http",
}


def _is_profkits(span: ReadableSpan) -> bool:
    scope = span.instrumentation_scope
    return scope is not None and scope.name == TRACER_NAME


def _is_a_calls(span: ReadableSpan) -> bool:
    """Whether ``span`` is the span of a sampled call (one per call profkit counted)."""
    attributes = span.attributes
    return attributes is not None and _CALL_ATTRIBUTE in attributes and _is_profkits(span)


def _count_failed(stats: Counters, spans: Sequence[ReadableSpan], reason: str) -> bool:
    """Count profkit's spans among ``spans`` as failed, and the calls they carried (counted
    exported when their spans ended) as dropped for ``reason``; False when none was profkit's."""
    ours = sum(1 for span in spans if _is_profkits(span))
    if not ours:
        return False
    stats.add(SPANS_FAILED, ours)
    calls = sum(1 for span in spans if _is_a_calls(span))
    if calls:
        unexport(stats, reason, calls)
    return True


class CountingSpanExporter(SpanExporter):
    """Forwards to another span exporter and counts which of profkit's spans it failed to deliver.

    Only profkit's own spans (instrumentation scope ``"profkit"``) are counted: the same
    processor usually carries the application's spans too, and those are not profkit's to
    report.

    Args:
        inner: the exporter that talks to the collector.
        counting_into: the counters to count into (an object with ``add(name, n)`` and
            ``error(reason, exc)``); None counts into the global profkit session current at
            export time, and into nothing when there is none.
    """

    def __init__(self, inner: SpanExporter, counting_into: Counters | None = None) -> None:
        self.inner = inner
        self._into = counting_into

    def _counters(self) -> Counters | None:
        return self._into if self._into is not None else DEFAULT.counters

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        error: BaseException | None = None
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # a broken exporter must not kill the processor's thread
            error, result = exc, SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            stats = self._counters()
            if stats is not None and _count_failed(stats, spans, FAILED_REASON):
                stats.error(FAILED_REASON, error)
        return result

    def shutdown(self, timeout_millis: float | None = None) -> None:
        # the BatchSpanProcessor passes what is left of its shutdown timeout when it can
        stop: Any = self.inner.shutdown
        if timeout_millis is not None and "timeout_millis" in inspect.signature(stop).parameters:
            stop(timeout_millis=timeout_millis)
        else:
            stop()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


def _protocol(protocol: str | None) -> str:
    if protocol is None:
        protocol = (
            os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "grpc"
        ).strip()
    if protocol not in PROTOCOLS:
        raise ValueError(f"profkit OTLP protocol must be one of {PROTOCOLS}, got {protocol!r}")
    return protocol


def _exporter_class(protocol: str) -> Any:
    import importlib

    try:
        module = importlib.import_module(_MODULES[protocol])
    except ImportError as exc:
        raise ImportError(
            f"OTLP over {protocol} needs {_PACKAGES[protocol]}: pip install 'profkit[otlp]'"
        ) from exc
    return module.OTLPSpanExporter


def otlp_span_processor(
    protocol: str | None = None, *, counting_into: Counters | None = None, **exporter_kwargs: Any
) -> BatchSpanProcessor:
    """A ``BatchSpanProcessor`` that ships spans over OTLP and counts failed exports, and
    the profkit spans its full queue drops (:class:`CountingBatchSpanProcessor`).

    Add it to the ``TracerProvider`` that profkit uses (the global one, or the one given to
    ``profkit.configure(tracer_provider=...)``):
    ``provider.add_span_processor(otlp_span_processor())``.

    Args:
        protocol: ``"grpc"`` or ``"http/protobuf"``; None reads
            ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL``, else grpc.
        counting_into: where failures are counted (see ``CountingSpanExporter``).
        **exporter_kwargs: passed to the OTLP ``OTLPSpanExporter`` (``endpoint``, ``headers``,
            ``timeout``, ``insecure`` for gRPC, ...); what is not given comes from the
            standard ``OTEL_EXPORTER_OTLP_*`` environment variables.

    Raises:
        ValueError: ``protocol`` is not ``"grpc"`` or ``"http/protobuf"``.
        ImportError: the OTLP exporter package for ``protocol`` is not installed.
    """
    cls = _exporter_class(_protocol(protocol))
    return CountingBatchSpanProcessor(CountingSpanExporter(cls(**exporter_kwargs), counting_into))


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """A ``BatchSpanProcessor`` that also counts the profkit spans its full queue drops.

    The SDK's processor drops the oldest queued span when a new one finds the queue full
    (``OTEL_BSP_MAX_QUEUE_SIZE``, 2048: a collector slower than the span rate), with only a
    log line; a dropped span of profkit's is counted like a failed export
    (``otlp_spans_failed``, ``error_reasons["otlp_queue_full"]``), so ``force_flush()`` says
    False. The SDK's queue (1.x's ``BatchProcessor._queue``) is replaced by one that sees
    each drop as it happens, under the lock its worker also takes out batches with (a check
    before queuing would count a span the worker took out meanwhile). Where that queue is not
    found, nothing is counted and spans go on as in the plain processor.
    """

    def __init__(self, span_exporter: SpanExporter, *args: Any, **kwargs: Any) -> None:
        super().__init__(span_exporter, *args, **kwargs)
        inner = getattr(self, "_batch_processor", None)
        queue = getattr(inner, "_queue", None)
        if type(queue) is collections.deque and queue.maxlen is not None:
            inner._queue = _DropSeeingQueue(queue, queue.maxlen, self._dropped)  # type: ignore[union-attr]
        OWNED.add(self)  # profkit's force_flush() and shutdown() flush it, wherever it is

    def shutdown(self) -> None:
        OWNED.discard(self)  # (a shut-down processor's flush says False: nothing to flush)
        super().shutdown()  # type: ignore[no-untyped-call]

    def _dropped(self, span: Any) -> None:
        exporter = self.span_exporter
        counters = exporter._counters() if isinstance(exporter, CountingSpanExporter) else None
        if (
            counters is not None
            and isinstance(span, ReadableSpan)
            and _count_failed(counters, [span], QUEUE_FULL_REASON)
        ):
            counters.error(QUEUE_FULL_REASON, None)


class _DropSeeingQueue(collections.deque):  # type: ignore[type-arg]
    """A bounded deque that tells ``on_drop`` which item a full ``appendleft`` pushes out.

    The batch processor queues on the left and its worker pops on the right; both go through
    one lock here, so the item seen as pushed out is the one the deque drops.
    """

    def __init__(self, items: Any, maxlen: int, on_drop: Callable[[Any], None]) -> None:
        super().__init__(items, maxlen)
        self._lock = threading.RLock()  # (a span ended in a signal handler nests here)
        self._on_drop = on_drop
        if hasattr(os, "register_at_fork"):  # a lock held by another thread at fork stays held
            mine = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: _new_lock(mine()))

    def appendleft(self, item: Any) -> None:
        with self._lock:
            full = len(self) >= self.maxlen  # type: ignore[operator]
            dropped = self[-1] if full and self else None
            super().appendleft(item)
        if dropped is not None:
            with contextlib.suppress(Exception):  # (counting must never fail a span)
                self._on_drop(dropped)

    def pop(self, *index: int) -> Any:
        with self._lock:
            return super().pop(*index)


def _new_lock(queue: _DropSeeingQueue | None) -> None:
    if queue is not None:
        queue._lock = threading.RLock()
