"""baggage_trigger: the request someone asks about is profiled, in every service it crosses.

A root call whose OpenTelemetry baggage holds ``profkit.profile=1`` is profiled whatever the
sampler says (policy ``"baggage"``), still under the gate (backlog, ``max_overhead``,
``max_per_minute``: a client controls the header) and never inside an unsampled trace. The
last test sends the W3C ``baggage`` header to a real uvicorn server instrumented with
``FastAPIInstrumentor``.

``sample_every=10**9`` samples the sampler's first call (calls 0, N, 2N, ...): tests that
need a quiet sampler spend that call first.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import httpx
import pytest
import structlog
import torch
from _tasks import as_another_task
from fastapi import FastAPI
from live_server import serve
from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import profkit
import profkit._label.scope
from profkit._capture.slot import SLOT
from profkit._global import get_session
from profkit.integrations.fastapi import instrument_app
from profkit.testing import Capture, capture

pytestmark = pytest.mark.timeout(120)

X = torch.randn(16, 16)
QUIET = 10**9
EVERY = f"every:{QUIET}"

T = TypeVar("T")


@profkit.profiled("predict")
def predict(x: torch.Tensor) -> torch.Tensor:
    """One region around a matmul."""
    with profkit.region("forward"):
        return torch.mm(x, x)


@contextmanager
def _baggage(value: str = "1") -> Iterator[None]:
    """Run the block with ``profkit.profile=value`` in the current OTel baggage."""
    token = otel_context.attach(baggage.set_baggage("profkit.profile", value))
    try:
        yield
    finally:
        otel_context.detach(token)


def _policies(cap: Capture) -> list[str]:
    return [c.policy for c in cap.calls]


def test_a_call_under_the_baggage_is_profiled_one_without_is_not() -> None:
    """At sample_every=10**9: the baggage call is exported with policy "baggage" (span and log
    event); the call after it, without the baggage, is not."""
    settings = {"baggage_trigger": True, "sample_every": QUIET, "exporters": ("otel", "log")}
    with structlog.testing.capture_logs() as logs, capture(**settings) as cap:
        predict(X)  # the sampler's first call
        with _baggage():
            predict(X)
        predict(X)
    assert [EVERY, "baggage"] == _policies(cap)  # (the holder is released: not slow)
    roots = [s for s in cap.spans() if s.name == "predict"]
    assert [EVERY, "baggage"] == [s.attributes["profkit.sampling.policy"] for s in roots]
    events = [e for e in logs if e["event"] == "profkit.profile"]
    assert [EVERY, "baggage"] == [e["policy"] for e in events]
    s = cap.stats
    assert (3, 2, 1, 2) == (s["root_calls"], s["sampled"], s["unsampled"], s["exported"])


def test_the_value_says_yes_in_a_few_spellings() -> None:
    """ "1", "true", "yes" in any case ask for a profile; anything else does not."""
    with capture(baggage_trigger=True, sample_every=QUIET) as cap:
        predict(X)  # the sampler's first call
        for value in ("1", "true", "TRUE", "Yes", "0", "no", "false", "", "2", "on"):
            with _baggage(value):
                predict(X)
    assert [EVERY] + ["baggage"] * 4 == _policies(cap)


def test_a_w3c_baggage_member_with_properties_still_asks() -> None:
    """A W3C ``baggage`` header member with properties (``profkit.profile=1;ttl=30``, as
    OTel Java or Go send metadata) asks for a profile: OTel Python keeps the properties in
    the value, and profkit reads only the value before the first ``;``."""
    with capture(baggage_trigger=True, sample_every=QUIET) as cap:
        predict(X)  # the sampler's first call
        for header in (
            "profkit.profile=1;ttl=30",
            "profkit.profile=true ; p",
            "profkit.profile=0;x",
        ):
            token = otel_context.attach(propagate.extract({"baggage": header}))
            try:
                predict(X)
            finally:
                otel_context.detach(token)
    assert [EVERY, "baggage", "baggage"] == _policies(cap)


def test_with_the_setting_off_the_baggage_changes_nothing() -> None:
    """baggage_trigger off (the default): the baggage call and the plain one are not profiled."""
    with capture(sample_every=QUIET) as cap:
        predict(X)  # the sampler's first call
        with _baggage():
            predict(X)
        predict(X)
    assert [EVERY] == _policies(cap)
    assert (3, 1) == (cap.stats["root_calls"], cap.stats["sampled"])


def test_the_rate_cap_bounds_baggage_windows() -> None:
    """max_per_minute=2 and five baggage calls: two profiled, three skipped_rate_limit."""
    with capture(baggage_trigger=True, sample_every=QUIET, max_per_minute=2) as cap, _baggage():
        for _ in range(5):
            predict(X)
    assert ["baggage"] * 2 == _policies(cap)
    s = cap.stats
    assert (5, 2, 3) == (s["root_calls"], s["sampled"], s["skipped_rate_limit"])


def test_the_cpu_budget_bounds_baggage_windows() -> None:
    """Over max_overhead, a baggage call is skipped_budget like a sampled one."""
    with capture(baggage_trigger=True, sample_every=QUIET, max_overhead=0.01) as cap:
        session = get_session()
        assert session is not None
        session.stats.cpu.charge(1e6)  # far over any budget for the next ten seconds
        with _baggage():
            for _ in range(3):
                predict(X)
    assert [] == _policies(cap)
    assert (3, 0, 3) == (cap.stats["root_calls"], cap.stats["sampled"], cap.stats["skipped_budget"])


def test_a_call_that_asks_inside_a_speculative_window_is_kept_as_baggage() -> None:
    """capture_slow: a call under the baggage that joins the speculative window open on its
    thread is exported with policy "baggage", not judged against the threshold and released."""
    with capture(
        baggage_trigger=True, sample_every=QUIET, capture_slow=True, slow_ms=60_000.0
    ) as cap:
        predict(X)  # the sampler's pick
        for _ in range(8):  # the label's baseline (timed), before speculative windows open
            predict(X)

        # the same label as predict: its 1 in N is spent (the sampler counts per label)
        @profkit.profiled("predict")
        def holder() -> None:  # opens a speculative window on this thread (slow_ms: at once)
            held = SLOT.held
            assert held is not None
            assert held.speculative
            with _baggage():  # another task's call on this thread, while the window records
                as_another_task(lambda: predict(X))

        holder()
        assert SLOT.held is None  # its calls ended: closed, exported now
        predict(X)  # nobody asked: timed, or speculative and released
    assert [EVERY, "baggage"] == _policies(cap)  # (the holder is released: not slow)
    s = profkit.stats()
    assert s["sampled"] == s["exported"] == 2
    assert 1 <= s["speculative"] == s["speculative_released"] <= 2


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()  # ParentBased(ALWAYS_ON): follows the incoming flag
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


@contextmanager
def _incoming(tracer: trace.Tracer, headers: dict[str, str]) -> Iterator[None]:
    """A server span for a request with these headers, extracted by the global propagator."""
    token = otel_context.attach(propagate.extract(headers))
    try:
        with tracer.start_as_current_span("request", kind=SpanKind.SERVER):
            yield
    finally:
        otel_context.detach(token)


def test_not_inside_an_unsampled_trace() -> None:
    """The baggage in an unsampled trace is not profiled (its spans would go nowhere); in a
    sampled trace it is, under the request's span."""
    provider, memory = _provider()
    tracer = provider.get_tracer("app")
    ask = {"baggage": "profkit.profile=1"}
    with capture(baggage_trigger=True, sample_every=QUIET, tracer_provider=provider) as cap:
        predict(X)  # the sampler's first call
        with _incoming(tracer, {"traceparent": f"00-{7:032x}-{0x12:016x}-00", **ask}):
            predict(X)
        with _incoming(tracer, {"traceparent": f"00-{8:032x}-{0x34:016x}-01", **ask}):
            predict(X)
    assert [EVERY, "baggage"] == _policies(cap)  # (the holder is released: not slow)
    assert (3, 1) == (cap.stats["root_calls"], cap.stats["skipped_unsampled_trace"])
    spans = memory.get_finished_spans()
    (root,) = [s for s in spans if s.name == "predict" and s.context.trace_id == 8]
    (request,) = [s for s in spans if s.name == "request"]
    assert root.parent is not None
    assert request.context.span_id == root.parent.span_id


# -- live: the W3C baggage header through FastAPIInstrumentor --------------------------------


def _server_ancestor(span: ReadableSpan, spans: tuple[ReadableSpan, ...]) -> ReadableSpan:
    """The nearest SERVER span up ``span``'s parent chain (fails when there is none)."""
    by_id = {s.context.span_id: s for s in spans}
    node = span
    while node.kind != SpanKind.SERVER:
        assert node.parent is not None, f"{span.name}: no SERVER span above it"
        node = by_id[node.parent.span_id]
    return node


def test_live_fastapi_request_with_the_baggage_header_is_profiled_under_its_server_span() -> None:
    """uvicorn + FastAPIInstrumentor + the default propagators (tracecontext, baggage): the
    request with ``baggage: profkit.profile=1`` is profiled at sample_every=10**9 and its
    profkit span sits under that request's SERVER span; the next request, without it, is not.
    """
    provider, memory = _provider()
    app = FastAPI()

    @app.get("/predict")
    def predict_route() -> dict[str, float]:
        with profkit.region("forward"):
            return {"sum": float(torch.mm(X, X).sum())}

    instrument_app(app)
    FastAPIInstrumentor.instrument_app(
        app, tracer_provider=provider, exclude_spans=["receive", "send"]
    )
    try:
        with (
            capture(baggage_trigger=True, sample_every=QUIET, tracer_provider=provider) as cap,
            serve(app) as url,
            httpx.Client(base_url=url, timeout=30.0) as client,
        ):
            replies = [
                client.get("/predict"),  # the sampler's first call
                client.get("/predict", headers={"baggage": "team=ml, profkit.profile=1"}),
                client.get("/predict"),
            ]
            assert profkit.force_flush(30.0)
    finally:
        FastAPIInstrumentor.uninstrument_app(app)
    assert [200] * 3 == [r.status_code for r in replies]
    assert [EVERY, "baggage"] == _policies(cap)  # (the holder is released: not slow)
    spans = memory.get_finished_spans()
    servers = sorted((s for s in spans if s.kind == SpanKind.SERVER), key=lambda s: s.start_time)
    assert 3 == len(servers)
    (asked,) = [s for s in spans if s.attributes.get("profkit.sampling.policy") == "baggage"]
    assert "/predict" == asked.name
    assert servers[1].context.trace_id == asked.context.trace_id
    assert servers[1] == _server_ancestor(asked, spans)
    profiled = [s for s in spans if "profkit.sampling.policy" in (s.attributes or {})]
    assert [servers[0].context.trace_id, servers[1].context.trace_id] == sorted(
        (s.context.trace_id for s in profiled), key=[t.context.trace_id for t in servers].index
    )  # the first request (the sampler's) and the asking one; none in the third's trace
