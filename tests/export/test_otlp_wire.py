"""OTLP on the wire: real OTLP exporters deliver every profkit span to real receivers."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch
from _fork import exit_code
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once
from otlp_receiver import GrpcReceiver, HttpReceiver, ReceivedSpan

import profkit
from profkit._global import get_session
from profkit._stats import Stats
from profkit.exporters.otlp import (
    CountingBatchSpanProcessor,
    CountingSpanExporter,
    otlp_span_processor,
)

torch.manual_seed(0)
MODEL = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
BATCH = torch.randn(32, 64)
with torch.no_grad():
    EXPECTED = MODEL(BATCH * 2.0)

#: spans per sampled call of predict: the call and its two regions
SPANS_PER_CALL = 3
#: seconds an OTLP export may take: short, so a stopped receiver fails fast
EXPORT_TIMEOUT = 1.0


@profkit.profiled("predict")
def predict(batch: torch.Tensor) -> torch.Tensor:
    """Two regions around the model."""
    with profkit.region("preprocess", stage="scale"):
        batch = batch * 2.0
    with profkit.region("forward"), torch.no_grad():
        out: torch.Tensor = MODEL(batch)
    return out


Receiver = GrpcReceiver | HttpReceiver


@pytest.fixture(params=["grpc", "http/protobuf"])
def receiver(request: pytest.FixtureRequest) -> Iterator[tuple[str, Receiver, dict[str, Any]]]:
    """A running receiver of each protocol and the exporter arguments that reach it."""
    protocol: str = request.param
    if protocol == "grpc":
        grpc_rx = GrpcReceiver()
        kwargs: dict[str, Any] = {"endpoint": grpc_rx.endpoint, "insecure": True}
        rx: Receiver = grpc_rx
    else:
        rx = HttpReceiver()
        kwargs = {"endpoint": rx.endpoint}
    with rx:
        yield protocol, rx, {**kwargs, "timeout": EXPORT_TIMEOUT}


def _provider(processor: BatchSpanProcessor) -> tuple[TracerProvider, InMemorySpanExporter]:
    """A provider shipping over OTLP, with an in-memory copy of every span for comparison."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "profkit-wire-test"}))
    provider.add_span_processor(processor)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _assert_same(memory: Sequence[ReadableSpan], received: Sequence[ReceivedSpan]) -> None:
    """Every in-memory span arrived once, with the same ids, parents, times and attributes."""
    by_id = {s.span_id: s for s in received}
    assert len(memory) == len(received)
    assert len(memory) == len(by_id)
    for span in memory:
        got = by_id[f"{span.context.span_id:016x}"]
        parent = f"{span.parent.span_id:016x}" if span.parent is not None else ""
        assert span.attributes is not None
        expected_attrs = {k: _plain(v) for k, v in span.attributes.items()}
        assert (span.name, f"{span.context.trace_id:032x}", parent) == (
            got.name,
            got.trace_id,
            got.parent_span_id,
        )
        assert (span.start_time, span.end_time) == (got.start_ns, got.end_ns)
        assert expected_attrs == got.attributes
        assert got.resource_attributes["service.name"] == "profkit-wire-test"


@pytest.mark.timeout(60)
def test_receiver_gets_every_span(receiver: tuple[str, Receiver, dict[str, Any]]) -> None:
    """After shutdown the receiver holds exactly the spans of N sampled calls, as made."""
    protocol, rx, kwargs = receiver
    provider, memory = _provider(otlp_span_processor(protocol, **kwargs))
    tracer = provider.get_tracer("test")
    profkit.configure(sample_every=1, tracer_provider=provider, exporters=("otel",))
    n = 4
    for _ in range(n):
        with tracer.start_as_current_span("request"):
            assert torch.equal(EXPECTED, predict(BATCH))
    assert profkit.shutdown(10.0)
    provider.shutdown()
    received = rx.wait_for(n * (SPANS_PER_CALL + 1), timeout=10)
    _assert_same(memory.get_finished_spans(), received)
    roots = [s for s in received if s.name == "predict"]
    requests = {s.span_id: s for s in received if s.name == "request"}
    assert len(roots) == n
    for root in roots:
        assert requests[root.parent_span_id].trace_id == root.trace_id
        assert "aten::addmm" in root.attributes["profkit.ops.name"]
        assert root.attributes["profkit.scope.label"] == "predict"
        assert root.attributes["code.function.name"] == "predict"
    assert {s.attributes.get("stage") for s in received if s.name == "preprocess"} == {"scale"}
    assert profkit.stats()["otlp_spans_failed"] == 0


@pytest.mark.timeout(60)
def test_stopped_receiver_breaks_nothing_and_drops_are_counted(
    receiver: tuple[str, Receiver, dict[str, Any]],
) -> None:
    """A receiver that goes away mid-run: calls still return, every lost span is counted."""
    protocol, rx, kwargs = receiver
    if protocol == "http/protobuf":
        # HttpReceiver.stop() closes the listening socket but not kept-alive connections,
        # which would keep receiving; a collector that goes away takes them all with it
        kwargs["headers"] = {"Connection": "close"}
    provider, memory = _provider(otlp_span_processor(protocol, **kwargs))
    profkit.configure(sample_every=1, tracer_provider=provider, exporters=("otel",))
    session = get_session()
    for _ in range(2):
        assert torch.equal(EXPECTED, predict(BATCH))
    assert profkit.force_flush(10.0)
    assert provider.force_flush(10_000)
    delivered = rx.wait_for(2 * SPANS_PER_CALL, timeout=10)
    rx.stop()
    for _ in range(3):
        assert torch.equal(EXPECTED, predict(BATCH))
    assert not profkit.force_flush(10.0)  # it flushes the provider it was given: spans failed
    provider.force_flush(10_000)
    stats = session.stats.snapshot()
    assert stats["otlp_spans_failed"] == 3 * SPANS_PER_CALL
    assert stats["error_reasons"]["otlp_export_failed"] >= 1
    assert stats["exported"] == 2  # the calls whose spans never left are not exported
    assert {"otlp_export_failed": 3} == stats["dropped_reasons"]
    assert len(memory.get_finished_spans()) == 5 * SPANS_PER_CALL
    assert len(delivered) == len(rx.spans())
    assert profkit.shutdown(10.0)
    provider.shutdown()


@pytest.mark.timeout(60)
def test_failed_profkit_spans_make_shutdown_report_failure(
    receiver: tuple[str, Receiver, dict[str, Any]],
) -> None:
    """Collector down: shutdown() returns False; only profkit's spans are counted as failed."""
    protocol, rx, kwargs = receiver
    rx.stop()
    provider, _ = _provider(otlp_span_processor(protocol, **kwargs))
    app = provider.get_tracer("app")
    profkit.configure(sample_every=1, tracer_provider=provider, exporters=("otel",))
    for _ in range(2):
        with app.start_as_current_span("request"):
            assert torch.equal(EXPECTED, predict(BATCH))
    assert not profkit.shutdown(10.0)
    stats = profkit.stats()
    assert 2 * SPANS_PER_CALL == stats["otlp_spans_failed"]
    assert (0, 2) == (stats["exported"], stats["dropped_reasons"]["otlp_export_failed"])
    provider.shutdown()


class FlushRecorder(SpanProcessor):
    """Counts the spans it sees and the flushes it is asked for."""

    def __init__(self) -> None:
        self.ended = 0
        self.flushes = 0

    def on_end(self, span: ReadableSpan) -> None:
        self.ended += 1

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        self.flushes += 1
        return True


@pytest.fixture
def global_recorder(monkeypatch: pytest.MonkeyPatch) -> Iterator[FlushRecorder]:
    """A global TracerProvider (OTel's set-once globals restored afterwards) and its recorder."""
    recorder = FlushRecorder()
    provider = TracerProvider()
    provider.add_span_processor(recorder)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    trace.set_tracer_provider(provider)
    yield recorder
    provider.shutdown()


def test_the_applications_global_provider_is_not_flushed(global_recorder: FlushRecorder) -> None:
    """profkit flushes a provider given to configure(), never the global one it does not own."""
    profkit.configure(sample_every=1, exporters=("otel",))
    predict(BATCH)
    assert profkit.force_flush(10.0)
    assert profkit.shutdown(10.0)
    assert (SPANS_PER_CALL, 0) == (global_recorder.ended, global_recorder.flushes)
    owned = FlushRecorder()
    provider = TracerProvider()
    provider.add_span_processor(owned)
    profkit.configure(sample_every=1, exporters=("otel",), tracer_provider=provider)
    predict(BATCH)
    assert profkit.force_flush(10.0)
    assert SPANS_PER_CALL == owned.ended
    assert owned.flushes >= 1


def test_standard_environment_variables_choose_protocol_and_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OTEL_EXPORTER_OTLP_PROTOCOL and OTEL_EXPORTER_OTLP_ENDPOINT configure the processor."""
    with HttpReceiver() as rx:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{rx.port}")
        provider, memory = _provider(otlp_span_processor(timeout=EXPORT_TIMEOUT))
        profkit.configure(sample_every=1, tracer_provider=provider, exporters=("otel",))
        predict(BATCH)
        assert profkit.shutdown(10.0)
        provider.shutdown()
        _assert_same(memory.get_finished_spans(), rx.wait_for(SPANS_PER_CALL, timeout=10))


def test_unknown_protocol_is_a_value_error() -> None:
    """A protocol that OTLP does not define is refused by name."""
    with pytest.raises(ValueError, match="'http/json'"):
        otlp_span_processor("http/json")


def test_missing_exporter_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the OTLP package the ImportError says how to get it."""
    module = "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=r"pip install 'profkit\[otlp\]'"):
        otlp_span_processor("grpc")


class FakeExporter(SpanExporter):
    """Answers each export with the next scripted outcome (a result or an exception)."""

    def __init__(self, outcomes: list[SpanExportResult | Exception]) -> None:
        self.outcomes = outcomes
        self.shut = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def shutdown(self) -> None:
        self.shut = True


def _spans(n: int, scope: str = "profkit") -> list[ReadableSpan]:
    provider = TracerProvider()
    tracer = provider.get_tracer(scope)
    out = []
    for i in range(n):
        span = tracer.start_span(f"s{i}")
        span.end()
        assert isinstance(span, ReadableSpan)
        out.append(span)
    return out


def test_counting_exporter_counts_failures_and_exceptions() -> None:
    """Failed and raising exports count their profkit spans; the app's are not profkit's."""
    stats = Stats()
    ok, failed = SpanExportResult.SUCCESS, SpanExportResult.FAILURE
    inner = FakeExporter([ok, failed, ConnectionError("down"), failed])
    exporter = CountingSpanExporter(inner, counting_into=stats)
    assert exporter.export(_spans(2)) is ok
    assert exporter.export(_spans(3) + _spans(50, scope="app")) is failed
    assert exporter.export(_spans(4)) is failed
    assert exporter.export(_spans(60, scope="app")) is failed  # none of profkit's: not counted
    snap = stats.snapshot()
    assert snap["otlp_spans_failed"] == 7
    assert snap["error_reasons"] == {"otlp_export_failed": 2}
    exporter.shutdown()
    assert inner.shut


def test_counting_exporter_counts_into_the_current_session() -> None:
    """With no target it counts into the global session current at export time, else nowhere."""
    exporter = CountingSpanExporter(FakeExporter([SpanExportResult.FAILURE] * 2))
    assert exporter.export(_spans(1)) is SpanExportResult.FAILURE  # no session: nothing to count
    profkit.configure(sample_every=1, exporters=())
    session = get_session()
    assert exporter.export(_spans(5)) is SpanExportResult.FAILURE
    assert session.stats.snapshot()["otlp_spans_failed"] == 5
    assert profkit.stats()["otlp_spans_failed"] == 5


class TimedShutdownExporter(FakeExporter):
    """Records the timeout its shutdown was given."""

    def shutdown(self, timeout_millis: float = 30_000) -> None:  # type: ignore[override]
        self.shut = True
        self.timeout_millis = timeout_millis


def test_shutdown_timeout_is_passed_on() -> None:
    """The processor's shutdown budget reaches an inner exporter that accepts one."""
    timed = TimedShutdownExporter([])
    BatchSpanProcessor(CountingSpanExporter(timed)).shutdown()
    assert timed.shut
    assert 0 < timed.timeout_millis <= 30_000
    plain = FakeExporter([])
    BatchSpanProcessor(CountingSpanExporter(plain)).shutdown()
    assert plain.shut


@pytest.mark.timeout(60)
def test_spans_a_full_processor_queue_drops_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A collector that is up but slower than the span rate: the batch processor's full queue
    drops the oldest spans with only a log line. Each profkit span dropped is counted, so
    what arrived and what was counted make up every span made, and the flush says False."""
    import otlp_receiver

    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
    served = otlp_receiver._Handler.do_POST

    def slow(self: Any) -> None:
        time.sleep(0.2)
        served(self)

    monkeypatch.setattr(otlp_receiver._Handler, "do_POST", slow)
    with HttpReceiver() as rx:
        provider, _ = _provider(otlp_span_processor("http/protobuf", endpoint=rx.endpoint))
        profkit.configure(sample_every=1, tracer_provider=provider, exporters=("otel",))
        session = get_session()
        for _ in range(10):
            assert torch.equal(EXPECTED, predict(BATCH))
        assert not profkit.force_flush(30.0)
        provider.force_flush(30_000)
        stats = session.stats.snapshot()
        made = 10 * SPANS_PER_CALL
        assert stats["otlp_spans_failed"] > 0
        assert stats["error_reasons"]["otlp_queue_full"] == stats["otlp_spans_failed"]
        assert made == len(rx.spans()) + stats["otlp_spans_failed"]
        calls_arrived = sum(1 for s in rx.spans() if s.name == "predict")
        assert (calls_arrived, 10 - calls_arrived) == (
            stats["exported"],
            stats["dropped_reasons"].get("otlp_queue_full", 0),
        )
        profkit.shutdown(10.0)
        provider.shutdown()


def test_a_full_queue_the_worker_drains_meanwhile_counts_no_drop() -> None:
    """The queue is full when a span ends, but the processor's worker takes the oldest batch
    out before the span is queued: nothing is dropped, so nothing is counted (the CI run
    that counted 31 of 30 spans). Every span is exported or counted, never both."""
    stats = Stats()
    exported: list[ReadableSpan] = []

    class Keeping(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            exported.extend(spans)
            return SpanExportResult.SUCCESS

    processor = CountingBatchSpanProcessor(
        CountingSpanExporter(Keeping(), counting_into=stats),
        max_queue_size=2,
        max_export_batch_size=2,
        schedule_delay_millis=60_000,
    )
    inner = processor._batch_processor
    emit = inner.emit
    taken: list[ReadableSpan] = []

    def drained_first(span: ReadableSpan) -> None:  # the worker wins the race
        taken.append(inner._queue.pop())  # (what its export takes out first: the oldest)
        emit(span)

    spans = _spans(3)
    with inner._export_lock:  # the worker thread waits: only the test takes spans out
        for span in spans[:2]:
            processor.on_end(span)
        inner.emit = drained_first
        processor.on_end(spans[2])
        inner.emit = emit
    assert processor.force_flush()
    assert stats.snapshot()["otlp_spans_failed"] == 0
    assert sorted(s.name for s in taken + exported) == ["s0", "s1", "s2"]
    with inner._export_lock:  # nothing taken out: three of five are pushed out, each counted
        for span in _spans(5):
            processor.on_end(span)
    assert stats.snapshot()["otlp_spans_failed"] == 3
    assert stats.snapshot()["error_reasons"] == {"otlp_queue_full": 3}
    assert processor.force_flush()
    assert len(taken) + len(exported) + stats.snapshot()["otlp_spans_failed"] == 8
    processor.shutdown()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_the_drop_seeing_queue_works_in_a_child_forked_while_its_lock_was_held() -> None:
    """A worker popping at fork time would leave the queue's lock held in the child forever."""
    processor = CountingBatchSpanProcessor(CountingSpanExporter(FakeExporter([])))
    queue = processor._batch_processor._queue
    with queue._lock:
        pid = os.fork()
        if pid == 0:  # the child: queuing a span must not hang
            code = 1
            try:
                processor.on_end(_spans(1)[0])
                code = 0
            finally:
                os._exit(code)
    assert exit_code(pid, 20.0, "the child hung on the queue's lock") == 0
    processor.shutdown()


@pytest.mark.timeout(30)
def test_a_span_ended_in_a_signal_handler_inside_the_queue_does_not_hang() -> None:
    """A handler's span (a SIGTERM handler recording "shutting down") ends while its thread
    is inside the queue's bookkeeping for another span: it is queued, not stuck on a lock
    its own thread holds."""
    processor = CountingBatchSpanProcessor(CountingSpanExporter(FakeExporter([])))
    queue = processor._batch_processor._queue
    with queue._lock:  # (as between the queue's check and its insert when the signal lands)
        processor.on_end(_spans(1)[0])
    assert len(queue) == 1
    processor.shutdown()


@pytest.fixture
def global_provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[TracerProvider]:
    """A global TracerProvider (OTel's set-once globals restored afterwards)."""
    provider = TracerProvider()
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    trace.set_tracer_provider(provider)
    yield provider
    provider.shutdown()


@pytest.mark.timeout(60)
def test_calls_whose_spans_never_left_are_dropped_not_exported(
    receiver: tuple[str, Receiver, dict[str, Any]], global_provider: TracerProvider
) -> None:
    """A dead collector behind profkit's OTLP processor: its calls are dropped, shutdown False."""
    protocol, rx, kwargs = receiver
    rx.stop()
    global_provider.add_span_processor(otlp_span_processor(protocol, **kwargs))
    profkit.configure(sample_every=1, exporters=("otel",))
    for _ in range(3):
        assert torch.equal(EXPECTED, predict(BATCH))
    assert not profkit.shutdown(10.0)
    stats = profkit.stats()
    assert 3 * SPANS_PER_CALL == stats["otlp_spans_failed"]
    assert (0, 3) == (stats["exported"], stats["dropped"])
    assert {"otlp_export_failed": 3} == stats["dropped_reasons"]
