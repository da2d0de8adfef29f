"""OpenTelemetry spans: one per sampled call, inside the request's trace, one per nested scope.

Spans are made after the fact on the export worker with the profiler's own start and end
(epoch ns), as children of the span that was active when the call began. Per-op rows go on
the spans as bounded parallel arrays (``profkit.ops.*``, for queries) and as one readable
table (``profkit.ops.table``); the full rows are log records, not span events (OTel is
deprecating span events, OTEP 4430). Every string here was cleaned and bounded when the
summary was built (:mod:`profkit._text`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanKind, Status, StatusCode

from .._deadline import MAX_GIVEN_S
from .._model import BatchSummary, CallSummary, ErrorText, OpRow, ScopeSummary, WindowSummary
from .._text import clip
from .._version import __version__
from . import Exporter
from ._batch import batch_links, member_attributes, scaled_rows, without_ids
from ._counters import flush_owned
from ._rows import call_extras

__all__ = ["TRACER_NAME", "SpanExporter", "op_attributes", "op_table", "scope_attributes"]

#: the tracer (instrumentation scope) name of profkit's spans
TRACER_NAME = "profkit"
#: OTel's default span attribute count limit; profkit stays under it
_MAX_SPAN_ATTRIBUTES = 128
#: longest per-op array on a span
_MAX_ROWS = 32
#: op name column of ``profkit.ops.table``
_NAME_WIDTH = 40
#: bound of error text in a summary that profkit did not build (the default setting)
_DEFAULT_TEXT_LIMIT = 256


def op_attributes(rows: Sequence[OpRow]) -> dict[str, Any]:
    """Top-K op rows as parallel arrays of bounded length, and as one readable table."""
    rows = list(rows)[:_MAX_ROWS]
    attrs: dict[str, Any] = {
        "profkit.ops.table": op_table(rows),
        "profkit.ops.name": [r.name for r in rows],
        "profkit.ops.count": [r.count for r in rows],
        "profkit.ops.self_cpu_us": [round(r.self_cpu_us, 3) for r in rows],
        "profkit.ops.cpu_us": [round(r.cpu_us, 3) for r in rows],
    }
    if any(r.self_device_us or r.device_us for r in rows):
        attrs["profkit.ops.self_device_us"] = [round(r.self_device_us, 3) for r in rows]
        attrs["profkit.ops.device_us"] = [round(r.device_us, 3) for r in rows]
    if any(r.self_cpu_memory or r.self_device_memory for r in rows):
        attrs["profkit.ops.self_cpu_memory"] = [r.self_cpu_memory for r in rows]
        attrs["profkit.ops.self_device_memory"] = [r.self_device_memory for r in rows]
    if any(r.flops for r in rows):
        attrs["profkit.ops.flops"] = [r.flops for r in rows]
    if any(r.shapes for r in rows):
        attrs["profkit.ops.shapes"] = [r.shapes or "" for r in rows]
    return attrs


def op_table(rows: Sequence[OpRow]) -> str:
    """The rows as a small fixed-width table: a header, then name, count, self and total µs.

    Backends show array attributes element by element (``profkit.ops.count.0``, ...); this
    one string reads at a glance. At most 32 rows, names cut at 40 characters: under 3 kB.
    """
    device = any(r.self_device_us or r.device_us for r in rows)
    head = f"{'op':<{_NAME_WIDTH}} {'count':>7} {'self_cpu_us':>12} {'cpu_us':>12}"
    lines = [head + (f" {'self_device_us':>14}" if device else "")]
    for r in list(rows)[:_MAX_ROWS]:
        name = clip(r.name, _NAME_WIDTH)
        line = f"{name:<{_NAME_WIDTH}} {r.count:>7} {r.self_cpu_us:>12.1f} {r.cpu_us:>12.1f}"
        lines.append(line + (f" {r.self_device_us:>14.1f}" if device else ""))
    return "\n".join(lines)


def scope_attributes(call: CallSummary, scope: ScopeSummary) -> dict[str, Any]:
    """Every attribute of one scope's span, profkit's first, capped at OTel's default limit."""
    attrs: dict[str, Any] = {
        "profkit.scope.label": scope.label,
        "profkit.window.id": call.window_id,
        "profkit.op_count": scope.op_count,
        "profkit.self_cpu_us": round(scope.self_cpu_us, 3),
        "profkit.timing": scope.timing,
    }
    if scope.self_device_us:
        attrs["profkit.self_device_us"] = round(scope.self_device_us, 3)
    if scope.code is not None:
        attrs["code.function.name"] = scope.code.function
        attrs["code.file.path"] = scope.code.file_path
        attrs["code.line.number"] = scope.code.line_number
    if scope.index == 0:
        attrs.update(_root_attributes(call))
    attrs.update(op_attributes(scope.ops))
    for key, value in scope.attributes.items():
        if len(attrs) >= _MAX_SPAN_ATTRIBUTES:
            break
        attrs.setdefault(key, value)
    return attrs


#: span attribute names of the optional call facts whose name is not ``profkit.<field>``
_EXTRA_NAMES = {
    "trace_path": "profkit.trace.path",
    "slow_threshold_ms": "profkit.sampling.threshold_ms",
    "batch_size": "profkit.batch.size",
}


def _root_attributes(call: CallSummary) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "profkit.sampling.policy": call.policy,
        "profkit.attribution": call.attribution,
        "profkit.call.index": call.call_index,
        "profkit.events.total": call.events_total,
    }
    for field, value in call_extras(call).items():
        attrs[_EXTRA_NAMES.get(field, f"profkit.{field}")] = value
    d = call.diagnosis
    if d is not None:
        attrs["profkit.diagnosis.verdict"] = d.verdict
        attrs["profkit.diagnosis.reason"] = d.reason
        attrs["profkit.diagnosis.confidence"] = d.confidence
        for name, value in d.figures.items():
            attrs[f"profkit.diagnosis.{name}"] = _figure(name, value)
        attrs["profkit.amdahl.what"] = [w for w, _, _ in d.amdahl]
        attrs["profkit.amdahl.fraction"] = [round(f, 4) for _, f, _ in d.amdahl]
        attrs["profkit.amdahl.max_speedup"] = [round(s, 3) for _, _, s in d.amdahl]
    return attrs


def _figure(name: str, value: float) -> int | float:
    """A diagnosis figure as written: counts as ints, µs to 0.001, shares to 0.0001."""
    if name.endswith("_count"):
        return int(value)
    return round(float(value), 3 if name.endswith("_us") else 4)


class SpanExporter(Exporter):
    """Makes the spans of each sampled call through a TracerProvider (global by default).

    It is the pipeline's first step, not an exporter among others: :meth:`emit` returns the
    summary with each call's trace and span ids, which every other exporter then receives.
    """

    name = "otel"

    def __init__(
        self,
        tracer_provider: Any = None,
        *,
        watch: Callable[[Any], None] = lambda provider: None,
        shut_down: Callable[[Any], bool] = lambda provider: False,
    ) -> None:
        self._provider = tracer_provider
        #: (provider, its tracer): a provider's ``get_tracer`` builds a new object each time
        self._cached: tuple[Any, trace.Tracer] | None = None
        #: ``watch(provider)``, once per provider: note when it shuts down; ``shut_down(
        #: provider)``: whether it did (spans made after that reach no exporter)
        self._watch = watch
        self._shut_down = shut_down
        #: after :meth:`emit`: why calls without ids have none ("span_not_recording", or
        #: "provider_shut_down"), and whether no provider was given or set (the API's proxy)
        self.why_not_recording = "span_not_recording"
        self.default_provider = False
        if tracer_provider is not None:
            watch(tracer_provider)

    def _tracer(self) -> tuple[Any, trace.Tracer]:
        # the provider is resolved per export (the host may install its own after
        # profkit.configure()); its tracer is made once per provider
        provider = self._provider or trace.get_tracer_provider()
        cached = self._cached
        if cached is None or cached[0] is not provider:
            self._watch(provider)
            tracer = trace.get_tracer(TRACER_NAME, __version__, tracer_provider=provider)
            cached = self._cached = (provider, tracer)
        return cached

    def emit(self, summary: WindowSummary) -> WindowSummary:
        """Emit the spans; returns the summary with each call's trace and span ids filled in.

        A call gets no ids when its span did not record (a no-op provider, a sampler that
        dropped it) or when the provider was shut down by the time the span ended.
        """
        provider, tracer = self._tracer()
        # none given and none set: the API's proxy, which records nothing
        self.default_provider = self._provider is None and isinstance(
            provider, trace.ProxyTracerProvider
        )
        calls = [self._export_call(tracer, call) for call in summary.calls]
        self.why_not_recording = "span_not_recording"
        if self._shut_down(provider):  # asked after the spans ended: none slips through
            self.why_not_recording = "provider_shut_down"
            calls = [_no_ids(c) for c in calls]
        return dataclasses.replace(summary, calls=tuple(calls))

    def export(self, summary: WindowSummary) -> None:
        self.emit(summary)

    def _export_call(self, tracer: trace.Tracer, call: CallSummary) -> CallSummary:
        parent = call.parent_span_context
        ctx = (
            trace.set_span_in_context(NonRecordingSpan(parent))  # type: ignore[arg-type]
            if parent is not None
            else otel_context.Context()
        )
        spans: list[Span] = []
        for scope in call.scopes:
            span_ctx = ctx if scope.parent < 0 else trace.set_span_in_context(spans[scope.parent])
            spans.append(
                tracer.start_span(
                    scope.label,
                    context=span_ctx,
                    kind=SpanKind.INTERNAL,
                    attributes=scope_attributes(call, scope),
                    links=batch_links(call) if scope.parent < 0 else None,
                    start_time=scope.start_ns,
                )
            )
        if call.error is not None:
            _record_error(spans[0], _call_error_text(call), at_ns=call.scopes[0].end_ns)
        for span, scope in zip(spans[1:], call.scopes[1:], strict=True):
            if scope.error is not None:  # as OpenTelemetry's own spans: status and event
                _record_error(span, scope.error, at_ns=scope.end_ns)
        recorded = spans[0].is_recording()  # False: a no-op provider, or its sampler dropped it
        for span, scope in reversed(list(zip(spans, call.scopes, strict=True))):
            span.end(end_time=scope.end_ns)
        sc = spans[0].get_span_context()
        if call.batch is not None:  # each member's span, linked to the batch's if it exists
            batch = _member_spans(tracer, call, call.batch, sc if recorded else None)
            call = dataclasses.replace(call, batch=batch)
        if not recorded:
            return call  # no ids: nothing may point at a span that does not exist
        return dataclasses.replace(
            call,
            trace_id=trace.format_trace_id(sc.trace_id),
            span_id=trace.format_span_id(sc.span_id),
        )

    def force_flush(self, timeout: float = 5.0) -> bool:
        """Flush the provider given to profkit; the application's global one is left alone.

        The global provider belongs to the application: flushing it would wait for all of
        the service's spans (seconds with a collector down). A provider passed to
        ``configure(tracer_provider=...)`` was handed to profkit, so profkit flushes it.
        """
        millis = int(min(timeout, MAX_GIVEN_S) * 1000)
        flush = getattr(self._provider, "force_flush", None)
        if flush is None:  # the global provider: only the OTLP processors profkit built
            return flush_owned(millis)
        return bool(flush(millis))


def _member_spans(
    tracer: trace.Tracer, call: CallSummary, batch: BatchSummary, link: Any
) -> BatchSummary:
    """In each sampled member's trace a span named after the batch, child of the member's
    span, with its share and the op rows scaled by it; the batch with their ids."""
    root = call.root
    links = [Link(link)] if link is not None else None
    members = []
    for m in batch.members:
        if not m.sampled:
            members.append(m)
            continue
        attrs = member_attributes(call, m)
        attrs.update(op_attributes(scaled_rows(root.ops, m.share)))
        span = tracer.start_span(
            call.label,
            context=trace.set_span_in_context(NonRecordingSpan(m.span_context)),  # type: ignore[arg-type]
            kind=SpanKind.INTERNAL,
            attributes=attrs,
            links=links,
            start_time=root.start_ns,
        )
        recorded = span.is_recording()
        span.end(end_time=root.end_ns)
        if recorded:
            sc = span.get_span_context()
            m = dataclasses.replace(
                m,
                trace_id=trace.format_trace_id(sc.trace_id),
                span_id=trace.format_span_id(sc.span_id),
            )
        members.append(m)
    return dataclasses.replace(batch, members=tuple(members))


def _no_ids(call: CallSummary) -> CallSummary:
    """The call with no span ids (nor its members'): its spans reached no exporter."""
    batch = without_ids(call.batch) if call.batch is not None else None
    return dataclasses.replace(call, trace_id="", span_id="", batch=batch)


def _call_error_text(call: CallSummary) -> ErrorText:
    """The call's bounded error text (made here, at the default limit, for a summary that
    profkit did not build)."""
    if call.error_text is not None:
        return call.error_text
    assert call.error is not None
    return ErrorText.of(call.error, _DEFAULT_TEXT_LIMIT)


def _record_error(span: Span, text: ErrorText, *, at_ns: int) -> None:
    """Status ERROR and an ``exception`` event, from an exception's bounded text.

    The event is timed at ``at_ns``, when the exception left the scope: the span is made
    later, on the export worker, whose clock would put it past the span's end.
    """
    span.set_status(Status(StatusCode.ERROR, text.description))
    span.add_event(
        "exception",
        {
            "exception.type": text.type,
            "exception.message": text.message,
            "exception.stacktrace": text.stacktrace,
        },
        timestamp=at_ns,
    )
