"""The in-process OTLP receivers work with the real opentelemetry-sdk exporters, without profkit."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import StatusCode
from opentelemetry.util.types import AttributeValue
from otlp_receiver import GrpcReceiver, HttpReceiver, ReceivedSpan

CHILD_ATTRS: dict[str, AttributeValue] = {
    "s": "text",
    "i": 42,
    "f": 1.5,
    "b": True,
    "tags": ["a", "b"],
}


def _emit(processor: SpanProcessor) -> tuple[str, str, str]:
    """Emit a parent and a child span; return (trace_id, parent_id, child_id) as hex."""
    provider = TracerProvider(resource=Resource.create({"service.name": "receiver-test"}))
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test_otlp_receiver")
    with (
        tracer.start_as_current_span("parent") as parent,
        tracer.start_as_current_span("child", attributes=CHILD_ATTRS) as child,
    ):
        child.set_status(StatusCode.ERROR, "boom")
    assert provider.force_flush(10_000)
    provider.shutdown()
    pctx, cctx = parent.get_span_context(), child.get_span_context()
    return f"{pctx.trace_id:032x}", f"{pctx.span_id:016x}", f"{cctx.span_id:016x}"


def _check(rx: GrpcReceiver | HttpReceiver, ids: tuple[str, str, str]) -> None:
    """Assert the two received spans match what was emitted."""
    trace_id, parent_id, child_id = ids
    spans = {s.name: s for s in rx.wait_for(2, timeout=10)}
    parent: ReceivedSpan = spans["parent"]
    child: ReceivedSpan = spans["child"]
    assert sorted(spans) == ["child", "parent"]
    assert trace_id == parent.trace_id == child.trace_id
    assert parent_id == parent.span_id
    assert child_id == child.span_id
    assert parent.parent_span_id == ""
    assert parent_id == child.parent_span_id
    assert child.attributes == CHILD_ATTRS
    assert parent.attributes == {}
    assert StatusCode.ERROR.value == child.status_code
    assert child.status_message == "boom"
    assert child.resource_attributes["service.name"] == "receiver-test"
    assert parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns
    assert rx.requests >= 1


def _processor(exporter: SpanExporter, batch: bool) -> SpanProcessor:
    """Wrap the exporter in a batch or simple span processor."""
    return BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)


def test_grpc_receiver_simple_processor() -> None:
    """Spans exported one by one over OTLP/gRPC arrive intact."""
    with GrpcReceiver() as rx:
        exporter = GrpcSpanExporter(endpoint=rx.endpoint, insecure=True)
        _check(rx, _emit(_processor(exporter, batch=False)))
        assert rx.requests == 2


def test_grpc_receiver_batch_processor() -> None:
    """Spans batched over OTLP/gRPC arrive intact in a single request."""
    with GrpcReceiver() as rx:
        exporter = GrpcSpanExporter(endpoint=rx.endpoint, insecure=True)
        _check(rx, _emit(_processor(exporter, batch=True)))
        assert rx.requests == 1


def test_http_receiver_simple_processor() -> None:
    """Spans exported one by one over OTLP/HTTP protobuf arrive intact."""
    with HttpReceiver() as rx:
        exporter = HttpSpanExporter(endpoint=rx.endpoint)
        _check(rx, _emit(_processor(exporter, batch=False)))
        assert rx.requests == 2


def test_http_receiver_batch_gzip() -> None:
    """Gzip-compressed batched spans over OTLP/HTTP protobuf arrive intact."""
    with HttpReceiver() as rx:
        exporter = HttpSpanExporter(endpoint=rx.endpoint, compression=Compression.Gzip)
        _check(rx, _emit(_processor(exporter, batch=True)))
        assert rx.requests == 1


def test_wait_for_times_out_when_nothing_arrives() -> None:
    """wait_for raises TimeoutError when too few spans have arrived."""
    with HttpReceiver() as rx:
        with pytest.raises(TimeoutError, match="got 0 spans, wanted 1"):
            rx.wait_for(1, timeout=0.05)
        assert rx.spans() == []
