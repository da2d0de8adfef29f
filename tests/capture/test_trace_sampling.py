"""The trace's sampling decision: calls in unsampled traces are not profiled (Sentry's rule).

Also what ``exported`` means: a call counts as exported only when it reached a recording
span or an exporter took it; a span that the TracerProvider's sampler drops is no delivery.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import structlog
import torch
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import profkit
from profkit.testing import capture

pytestmark = pytest.mark.timeout(120)

X = torch.randn(16, 16)


@profkit.profiled("predict")
def predict(x: torch.Tensor) -> torch.Tensor:
    """One region around a matmul."""
    with profkit.region("forward"):
        return torch.mm(x, x)


def _provider(sampler: object = None) -> tuple[TracerProvider, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler or ParentBased(ALWAYS_ON))  # type: ignore[arg-type]
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


@contextmanager
def _incoming(tracer: trace.Tracer, trace_id: int, sampled: bool) -> Iterator[None]:
    """A server span for a request whose ``traceparent`` header says sampled or not."""
    header = f"00-{trace_id:032x}-{0x1234:016x}-{'01' if sampled else '00'}"
    parent = TraceContextTextMapPropagator().extract({"traceparent": header})
    token = otel_context.attach(parent)
    try:
        with tracer.start_as_current_span("request"):
            yield
    finally:
        otel_context.detach(token)


def test_only_calls_in_sampled_traces_are_profiled_and_delivered() -> None:
    """20 calls under an unsampled parent, 20 under a sampled one: the 20 sampled are delivered."""
    provider, memory = _provider()
    tracer = provider.get_tracer("app")
    # the queue holds every window: a worker slowed by a loaded machine drops none
    with capture(sample_every=1, tracer_provider=provider, queue_size=64) as cap:
        for i in range(40):
            with _incoming(tracer, trace_id=i + 1, sampled=i % 2 == 0):
                assert torch.equal(torch.mm(X, X), predict(X))
    roots = [s for s in memory.get_finished_spans() if s.name == "predict"]
    sampled_traces = {i + 1 for i in range(0, 40, 2)}
    assert 20 == len(roots)
    assert sampled_traces == {s.context.trace_id for s in roots}
    assert 20 == len(cap.calls)
    stats = cap.stats
    expected = {
        "root_calls": 40,
        "sampled": 20,
        "unsampled": 20,
        "skipped_unsampled_trace": 20,
        "exported": 20,
        "dropped": 0,
    }
    assert expected == {k: stats[k] for k in expected}  # type: ignore[literal-required]


def test_unsampled_trace_does_not_use_up_the_sampler() -> None:
    """With sample_every=2 the sampler counts only calls outside unsampled traces."""
    provider, memory = _provider()
    tracer = provider.get_tracer("app")
    with capture(sample_every=2, tracer_provider=provider) as cap:
        for i in range(8):
            with _incoming(tracer, trace_id=100 + i, sampled=i >= 4):
                predict(X)
    assert [104, 106] == sorted(
        s.context.trace_id for s in memory.get_finished_spans() if s.name == "predict"
    )
    assert (8, 2, 4) == (
        cap.stats["root_calls"],
        cap.stats["sampled"],
        cap.stats["skipped_unsampled_trace"],
    )


def test_unsampled_trace_does_not_use_up_a_trigger() -> None:
    """trigger(1) is kept for the next call that can be delivered."""
    provider, memory = _provider()
    tracer = provider.get_tracer("app")
    with capture(sample_every=1000, tracer_provider=provider) as cap:
        predict(X)  # the sampler's first call: sampled
        profkit.trigger(1)
        with _incoming(tracer, trace_id=7, sampled=False):
            predict(X)
        with _incoming(tracer, trace_id=8, sampled=True):
            predict(X)
    assert ["trigger"] == [c.policy for c in cap.calls if c.policy == "trigger"]
    assert 8 in {s.context.trace_id for s in memory.get_finished_spans() if s.name == "predict"}


def test_window_skips_a_call_in_an_unsampled_trace_and_waits_for_the_next() -> None:
    """With window=2 a call in an unsampled trace does not join; the next delivered one does."""
    provider, memory = _provider()
    tracer = provider.get_tracer("app")
    with capture(sample_every=1000, window=2, tracer_provider=provider) as cap:
        with _incoming(tracer, trace_id=1, sampled=True):
            predict(X)
        with _incoming(tracer, trace_id=2, sampled=False):
            predict(X)
        with _incoming(tracer, trace_id=3, sampled=True):
            predict(X)
    roots = [s for s in memory.get_finished_spans() if s.name == "predict"]
    assert [1, 3] == sorted(s.context.trace_id for s in roots)
    assert (1, 2, 2) == (cap.stats["windows"], cap.stats["sampled"], cap.stats["exported"])


def test_call_without_an_active_trace_is_sampled_as_before() -> None:
    """No active span: the sampler decides alone, nothing is skipped."""
    with capture(sample_every=1) as cap:
        predict(X)
    assert (1, 0, 1) == (
        cap.stats["sampled"],
        cap.stats["skipped_unsampled_trace"],
        cap.stats["exported"],
    )


def test_span_dropped_by_the_providers_sampler_is_not_counted_as_exported() -> None:
    """Spans only, and the provider's sampler drops them: dropped, not exported."""
    provider, memory = _provider(ALWAYS_OFF)
    profkit.configure(sample_every=1, tracer_provider=provider, exporters=("otel",))
    for _ in range(3):
        predict(X)
    assert not profkit.force_flush(10.0)  # no span recorded: not exported
    stats = profkit.stats()
    assert () == memory.get_finished_spans()
    assert (3, 0, 3) == (stats["sampled"], stats["exported"], stats["dropped"])
    assert {"span_not_recording": 3} == stats["dropped_reasons"]


def test_log_events_count_as_delivery_when_spans_are_not_recorded() -> None:
    """Spans dropped by the provider's sampler, log events emitted: exported."""
    provider, _ = _provider(ALWAYS_OFF)
    with structlog.testing.capture_logs() as logs:
        profkit.configure(sample_every=1, tracer_provider=provider, exporters=("otel", "log"))
        for _ in range(2):
            predict(X)
        assert not profkit.force_flush(10.0)  # logged, but no span recorded
    profiles = [e for e in logs if e["event"] == "profkit.profile"]
    assert 2 == len(profiles)
    assert all("span_id" not in e for e in profiles)  # no id of a span that does not exist
    assert (2, 0) == (profkit.stats()["exported"], profkit.stats()["dropped"])


def test_no_exporter_at_all_is_not_exported() -> None:
    """exporters=() and no extra exporters: sampled calls are dropped as "no_exporter"."""
    profkit.configure(sample_every=1, exporters=())
    predict(X)
    predict(X)
    assert not profkit.force_flush(10.0)  # delivered nowhere
    stats = profkit.stats()
    assert (2, 0, {"no_exporter": 2}) == (
        stats["sampled"],
        stats["exported"],
        stats["dropped_reasons"],
    )
