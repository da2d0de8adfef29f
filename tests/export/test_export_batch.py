"""A batch's spans on the wire: links and shares reach a real OTLP receiver."""

from __future__ import annotations

import pytest
import torch
from opentelemetry.sdk.trace import TracerProvider
from otlp_receiver import GrpcReceiver

import profkit
from profkit.exporters.otlp import otlp_span_processor


@pytest.mark.timeout(60)
def test_batch_links_and_member_spans_arrive_over_otlp(mlp: torch.nn.Module) -> None:
    """The batch span's links name the requests' spans; each member span links back."""
    with GrpcReceiver() as rx:
        provider = TracerProvider()
        provider.add_span_processor(
            otlp_span_processor("grpc", endpoint=rx.endpoint, insecure=True, timeout=1.0)
        )
        tracer = provider.get_tracer("test")
        profkit.configure(sample_every=1, tracer_provider=provider, exporters=("otel",))
        members = []
        for i in range(3):
            with tracer.start_as_current_span(f"request-{i}"):
                members.append(profkit.batch_member())
        with profkit.batch("forward", members, weights=[1, 2, 1]), torch.inference_mode():
            mlp(torch.randn(3, 64))
        assert profkit.shutdown(10.0)
        provider.shutdown()
        received = rx.wait_for(3 + 1 + 3, timeout=10)
    requests = {(s.trace_id, s.span_id) for s in received if s.name.startswith("request-")}
    forward = [s for s in received if s.name == "forward"]
    (batch,) = [s for s in forward if "profkit.batch.share" not in s.attributes]
    members_ = [s for s in forward if s is not batch]
    assert requests == set(batch.links)
    assert 3 == batch.attributes["profkit.batch.size"]
    assert [0.25, 0.25, 0.5] == sorted(s.attributes["profkit.batch.share"] for s in members_)
    for span in members_:
        assert (span.trace_id, span.parent_span_id) in requests
        assert ((batch.trace_id, batch.span_id),) == span.links
    assert 0 == profkit.stats()["otlp_spans_failed"]
