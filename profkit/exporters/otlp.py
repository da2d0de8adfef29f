"""OTLP on the wire: a ``BatchSpanProcessor`` around the real OTLP span exporter, with counts.

profkit makes spans through an ordinary OpenTelemetry ``TracerProvider``; getting them to a
collector is the provider's job. ``otlp_span_processor`` builds the usual processor for
that (gRPC or HTTP/protobuf, configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables or
keyword arguments), with one addition: the span exporter is wrapped in a
``CountingSpanExporter``, so a collector that is down or slow shows up in
``profkit.stats()`` (``error_reasons["otlp_export_failed"]`` per failed batch,
``otlp_spans_failed`` per span of profkit's: the application's own spans in the same
batches are not counted) instead of only in the OTel SDK's log, and ``profkit.force_flush()``
/ ``profkit.shutdown()`` return False when profkit spans failed since the last of them.

The OTLP exporter packages are optional: ``pip install 'profkit[otlp]'``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from ._counters import DEFAULT, Counters
from .otel import TRACER_NAME

__all__ = ["PROTOCOLS", "CountingSpanExporter", "otlp_span_processor"]

#: the OTLP protocols profkit can build an exporter for (OTel's names for them)
PROTOCOLS = ("grpc", "http/protobuf")

#: the error reason counted once per failed batch that held profkit spans
FAILED_REASON = "otlp_export_failed"
#: the counter of spans in failed batches
SPANS_FAILED = "otlp_spans_failed"

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
            ours = sum(1 for span in spans if _is_profkits(span))
            if stats is not None and ours:
                stats.add(SPANS_FAILED, ours)
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
    """A ``BatchSpanProcessor`` that ships spans over OTLP and counts failed exports.

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
    return BatchSpanProcessor(CountingSpanExporter(cls(**exporter_kwargs), counting_into))
