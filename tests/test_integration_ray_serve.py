"""profkit.integrations.ray_serve without a cluster: the class decorator, the context across
the hop, and ``ray_serve.batch`` over Ray Serve's real batch queue (its replica context
stubbed: ``serve.batch`` asks for one). tests/test_ray_serve.py runs it all on a cluster."""

from __future__ import annotations

import asyncio
import gc
import math
import types
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

pytest.importorskip(
    "ray.serve", reason="Ray Serve is not installed: scripts/setup-ray (pip install 'profkit[ray]')"
)

from ray import serve

import profkit
from profkit.integrations import _ray_trace, ray_serve
from profkit.testing import capture

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACER = TracerProvider().get_tracer("service")


@pytest.fixture
def replica_context(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What ``serve.batch`` reads of its replica (it refuses to run outside one)."""
    config = types.SimpleNamespace(max_ongoing_requests=100)
    ctx = types.SimpleNamespace(_deployment_config=config, deployment="D", app_name="a")
    monkeypatch.setattr(serve, "get_replica_context", lambda: ctx)
    yield
    # Ray's batch queue, collected outside a running loop, asks for one and would make (and
    # leave open) a loop of its own: it gets this one, closed here
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    gc.collect()
    asyncio.set_event_loop(None)
    loop.close()


class _Request:
    """What a Starlette ``Request`` offers: its ASGI scope."""

    def __init__(self, headers: dict[str, str]) -> None:
        raw = [(k.encode(), v.encode()) for k, v in headers.items()]
        self.scope = {"type": "http", "headers": raw}


def _ids() -> tuple[str, str]:
    sc = trace.get_current_span().get_span_context()
    return f"{sc.trace_id:032x}", f"{sc.span_id:016x}"


def test_replica_configures_in_init_and_shuts_down_before_the_class_del() -> None:
    """Each instance configures profkit before its __init__; __del__ flushes it first, once."""
    seen: list[Any] = []

    @ray_serve.replica(sample_every=7, setup=lambda: {"exporters": ()})
    class Model:
        def __init__(self, name: str) -> None:
            seen.append((name, profkit.get_config().sample_every))  # type: ignore[union-attr]

        def __del__(self) -> None:
            seen.append(profkit.get_config())

    model = Model("m")
    model.__del__()
    model.__del__()  # Ray Serve's call, then the GC's: profkit is flushed once
    assert [("m", 7), None, None] == seen


def test_only_the_instance_that_configured_the_session_stops_it() -> None:
    """An instance made without __init__, or an older one, leaves the session running."""

    @ray_serve.replica(exporters=())
    class Model:
        pass

    old = Model()
    new = Model()  # configures again: the old instance's session is replaced
    Model.__new__(Model).__del__()
    old.__del__()
    assert profkit.get_config() is not None
    new.__del__()
    assert profkit.get_config() is None


def test_a_bad_setting_fails_at_decoration() -> None:
    """A setting out of range raises ValueError on the driver, naming it."""
    with pytest.raises(ValueError, match="sample_every"):
        ray_serve.replica(sample_every=0)


def test_a_method_runs_in_the_trace_of_its_http_request() -> None:
    """The traceparent of the request a method is given becomes its current span."""

    class Ingress:
        def __call__(self, request: Any) -> tuple[str, str]:
            return _ids()

    ray_serve._instrument(Ingress, {}, lambda: {"enabled": False}, 1.0)
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
    assert (TRACE_ID, PARENT_ID) == Ingress.__new__(Ingress)(_Request(headers))
    assert trace.INVALID_SPAN_CONTEXT == trace.get_current_span().get_span_context()


def test_a_traced_handle_carries_the_context_to_the_method_it_calls() -> None:
    """A traced handle sends the caller's context; the called method runs in it, without
    seeing the keyword."""

    class Model:
        async def predict(self, x: int) -> tuple[int, tuple[str, str]]:
            return x, _ids()

    ray_serve._instrument(Model, {}, None, 1.0)
    model = Model.__new__(Model)

    class Handle:  # DeploymentHandle's shape: a method handle per attribute
        def __init__(self, method: str = "__call__") -> None:
            self.method = method

        def __getattr__(self, name: str) -> Handle:
            return Handle(name)

        def remote(self, *args: Any, **kwargs: Any) -> Any:
            return getattr(model, self.method)(*args, **kwargs)

    handle = ray_serve.traced(Handle())
    with TRACER.start_as_current_span("request") as span:
        sent = asyncio.run(handle.predict.remote(3))
    sc = span.get_span_context()
    assert (3, (f"{sc.trace_id:032x}", f"{sc.span_id:016x}")) == sent


def test_under_serve_tracing_a_request_it_did_not_sample_is_not_profiled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray Serve's tracing on and no context (its sampler said no): profkit skips the call."""
    monkeypatch.setattr(_ray_trace, "_serve_tracing_on", lambda: True)

    class Model:
        @profkit.profiled("predict")
        def predict(self) -> int:
            return 1

    ray_serve._instrument(Model, {}, None, 1.0)
    with capture(sample_every=1) as cap:
        assert 1 == Model.__new__(Model).predict()
    assert (0, 1) == (len(cap.calls), cap.stats["skipped_unsampled_trace"])


def test_under_serve_tracing_the_request_trace_wins_over_a_serve_span_outside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray Serve's span in the request's trace stays the parent; one in another trace (it
    lost the request's parent) gives way to the request's traceparent."""
    monkeypatch.setattr(_ray_trace, "_serve_tracing_on", lambda: True)

    class Ingress:
        def __call__(self, request: Any) -> tuple[str, str]:
            return _ids()

    ray_serve._instrument(Ingress, {}, None, 1.0)
    ingress = Ingress.__new__(Ingress)
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
    with TRACER.start_as_current_span("serve's own root") as span:  # another trace
        assert (TRACE_ID, PARENT_ID) == ingress(_Request(headers))
    parent = trace.set_span_in_context(
        trace.NonRecordingSpan(
            trace.SpanContext(int(TRACE_ID, 16), int(PARENT_ID, 16), True, trace.TraceFlags(1))
        )
    )
    with TRACER.start_as_current_span("serve's span", context=parent) as span:  # the same
        sc = span.get_span_context()
        assert (TRACE_ID, f"{sc.span_id:016x}") == ingress(_Request(headers))


def test_batch_attributes_each_batch_to_its_requests(replica_context: None) -> None:
    """Concurrent requests batched by serve.batch: one profkit batch, a member per request
    in its own span, shares by weight summing to 1, each request its own answer."""

    class Model:
        @ray_serve.batch(label="fwd", max_batch_size=4, batch_wait_timeout_s=0.5, weight=len)
        async def forward(self, inputs: list[str]) -> list[str]:
            return [x.upper() for x in inputs]

    ray_serve._instrument(Model, {}, None, 1.0)
    model = Model.__new__(Model)
    spans: list[Any] = []

    async def request(x: str) -> str:
        with TRACER.start_as_current_span(f"request {x}") as span:
            spans.append(span.get_span_context())
            out: str = await model.forward(x)
            return out

    async def main() -> list[str]:
        return await asyncio.gather(*(request(x) for x in ("a", "bb", "c", "dddd")))

    with capture(sample_every=1) as cap:
        answers = asyncio.run(main())
    assert ["A", "BB", "C", "DDDD"] == answers
    (call,) = cap.calls
    assert call.batch is not None
    assert ("fwd", None) == (call.label, call.parent_span_context)  # a trace of its own
    assert [1 / 8, 2 / 8, 1 / 8, 4 / 8] == [m.share for m in call.batch.members]
    assert math.isclose(1.0, sum(m.share for m in call.batch.members))
    assert spans == [m.span_context for m in call.batch.members]


def test_batch_takes_no_generator() -> None:
    """A streamed batch method is refused at decoration, with what to do instead."""
    with pytest.raises(TypeError, match=r"profkit\.batch_member"):

        @ray_serve.batch
        async def stream(self: Any, inputs: list[int]) -> Any:
            yield inputs
