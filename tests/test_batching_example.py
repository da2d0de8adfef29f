"""The batching example (examples/batching_service) served for real by uvicorn.

Concurrent clients call the micro-batched ``/predict`` and the continuous-batching
``/generate``, each request in a trace of its own (a W3C ``traceparent`` the client made up).
Every sampled batch is exported (a batch span linking its members), every member span sits
in one of the clients' traces, under that request's HTTP span, and nothing is dropped.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from live_server import serve
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import profkit
from examples.batching_service.app import FEATURES, build_app

BATCHES = ("predict_batch", "decode_step")
TOKENS = 4


@contextmanager
def _service(**settings: Any) -> Iterator[tuple[str, InMemorySpanExporter, Any]]:
    """The example app under uvicorn, profkit configured here, spans kept in memory."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    profkit.configure(tracer_provider=provider, exporters=("otel",), **settings)
    app = build_app(provider, own_profkit=False)
    with serve(app) as url:
        yield url, spans, app


async def _client(
    http: httpx.AsyncClient, url: str, kind: str, until: float, traces: set[str]
) -> int:
    """Requests one after another until ``until``, each in a trace of its own; how many."""
    rng = random.Random()
    done = 0
    while done == 0 or time.monotonic() < until:
        trace_id = f"{rng.getrandbits(128):032x}"
        headers = {"traceparent": f"00-{trace_id}-{rng.getrandbits(64):016x}-01"}
        traces.add(trace_id)
        if kind == "predict":
            body: dict[str, Any] = {"inputs": [rng.random() for _ in range(FEATURES)]}
        else:
            body = {"prompt": [rng.randrange(64) for _ in range(3)], "max_new_tokens": TOKENS}
        response = await http.post(f"{url}/{kind}", json=body, headers=headers, timeout=60)
        response.raise_for_status()
        done += 1
    return done


async def _clients(url: str, clients: int, seconds: float) -> tuple[dict[str, int], set[str]]:
    """Half the clients on each endpoint: requests made per endpoint, and their trace ids."""
    traces: set[str] = set()
    until = time.monotonic() + seconds
    async with httpx.AsyncClient() as http:
        kinds = ["predict", "generate"] * (clients // 2)
        counts = await asyncio.gather(*(_client(http, url, k, until, traces) for k in kinds))
    sent = {"predict": 0, "generate": 0}
    for kind, n in zip(kinds, counts, strict=True):
        sent[kind] += n
    return sent, traces


def _check(spans: tuple[ReadableSpan, ...], traces: set[str], stats: Any) -> list[ReadableSpan]:
    """Every sampled batch has its span; every member span is in a client's trace, under that
    request's server span, linked to its batch. Returns the batch spans."""
    by_id = {s.context.span_id: s for s in spans if s.context}
    batches = [
        s for s in spans if s.name in BATCHES and "profkit.batch.share" not in (s.attributes or {})
    ]
    members = [s for s in spans if s.name in BATCHES and s not in batches]
    assert stats["sampled"] == len(batches)
    batch_ids = {(b.context.trace_id, b.context.span_id) for b in batches if b.context}
    links = sum(len(b.links) for b in batches)
    assert links == len(members)
    assert links == sum((b.attributes or {})["profkit.batch.size"] for b in batches)
    for member in members:
        assert member.context is not None
        assert member.parent is not None
        assert f"{member.context.trace_id:032x}" in traces
        server = by_id[member.parent.span_id]
        assert server.name in ("POST /predict", "POST /generate")
        (link,) = member.links
        assert (link.context.trace_id, link.context.span_id) in batch_ids
    return batches


def test_batching_example_links_every_request() -> None:
    """8 clients, every batch sampled: both batchers' spans link exactly their requests."""
    with _service(sample_every=1, max_per_minute=None) as (url, spans, app):
        sent, traces = asyncio.run(_clients(url, clients=8, seconds=2.0))
        assert profkit.force_flush(10.0)
        stats = profkit.stats()
    batches = _check(spans.get_finished_spans(), traces, stats)
    assert {"predict_batch", "decode_step"} == {b.name for b in batches}
    assert (0, 0) == (stats["dropped"], stats["errors"])
    assert stats["sampled"] == stats["exported"]
    assert app.state.batcher.batches + app.state.decoder.steps == stats["root_calls"]
    sizes = {
        name: [(b.attributes or {})["profkit.batch.size"] for b in batches if b.name == name]
        for name in BATCHES
    }
    # every request in one batch, every generation in one step per token
    assert sent["predict"] == sum(sizes["predict_batch"])
    assert sent["generate"] * TOKENS == sum(sizes["decode_step"])
    assert max(sizes["predict_batch"]) > 1, "concurrent requests shared a batch"
    assert max(sizes["decode_step"]) > 1, "concurrent generations shared a step"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_batching_example_under_16_clients_for_30_seconds() -> None:
    """16 clients for 30 s at 1 in 20: every sampled batch exported, nothing dropped."""
    with _service(sample_every=20, max_per_minute=None) as (url, spans, app):
        sent, traces = asyncio.run(_clients(url, clients=16, seconds=30.0))
        assert profkit.force_flush(10.0)
        stats = profkit.stats()
    batches = _check(spans.get_finished_spans(), traces, stats)
    assert {"predict_batch", "decode_step"} == {b.name for b in batches}
    assert (0, 0, 0) == (stats["dropped"], stats["errors"], stats["batch_members_invalid"])
    assert stats["sampled"] == stats["exported"]
    calls = app.state.batcher.batches + app.state.decoder.steps
    assert calls == stats["root_calls"]
    assert stats["sampled"] >= calls // 20 // 2  # 1 in 20 of each label, less the rate cap
    assert len(traces) == sum(sent.values())
