"""OpenTelemetry spans: one tree per sampled call, inside the request's trace, on OTel's clock."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator, Sequence

import httpx
import pytest
import torch
from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once

import profkit
from profkit.exporters._rows import call_fields
from profkit.testing import capture

torch.manual_seed(0)
MODEL = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
BATCH = torch.randn(32, 64)


@profkit.profiled(attributes={"model": "mlp", "version": 3})
def predict(batch: torch.Tensor) -> torch.Tensor:
    """Three regions, one nested in another."""
    with profkit.region("preprocess", stage=1):
        batch = batch * 2.0
    with profkit.region("forward"), profkit.region("mlp"), torch.no_grad():
        out: torch.Tensor = MODEL(batch)
    return out


@profkit.profiled("failing")
def failing(batch: torch.Tensor) -> None:
    """Runs an op, then raises."""
    with profkit.region("before_error"):
        batch.sum()
    raise ValueError("bad input")


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return provider, spans


def _by_id(spans: Sequence[ReadableSpan]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in spans}


def _subtree(spans: Sequence[ReadableSpan], root: ReadableSpan) -> list[ReadableSpan]:
    """The root and every span below it, in span order."""
    ids = {root.context.span_id}
    changed = True
    while changed:
        changed = False
        for s in spans:
            if s.parent is not None and s.parent.span_id in ids and s.context.span_id not in ids:
                ids.add(s.context.span_id)
                changed = True
    return [s for s in spans if s.context.span_id in ids]


def _check_tree(spans: Sequence[ReadableSpan], root: ReadableSpan, parent_id: int) -> None:
    """predict's tree: root under ``parent_id``; regions nested as in the code, inside the root."""
    tree = {s.name: s for s in _subtree(spans, root)}
    assert sorted(tree) == ["forward", "mlp", "predict", "preprocess"]
    assert root.parent is not None
    assert parent_id == root.parent.span_id
    expected_parent = {"preprocess": "predict", "forward": "predict", "mlp": "forward"}
    for name, parent in expected_parent.items():
        span = tree[name]
        assert span.parent is not None
        assert tree[parent].context.span_id == span.parent.span_id
        assert root.context.trace_id == span.context.trace_id
        assert root.start_time is not None
        assert root.end_time is not None
        assert span.start_time is not None
        assert span.end_time is not None
        assert root.start_time <= span.start_time <= span.end_time <= root.end_time
        assert span.kind == SpanKind.INTERNAL


def test_span_tree_under_a_plain_parent_span() -> None:
    """Each sampled call is a span tree under the active span, in its trace and interval."""
    provider, spans = _provider()
    tracer = provider.get_tracer("test")
    requests = []
    with capture(sample_every=1, tracer_provider=provider):
        for _ in range(3):
            with tracer.start_as_current_span("request") as request:
                predict(BATCH)
            requests.append(request)
    finished = spans.get_finished_spans()
    roots = [s for s in finished if s.name == "predict"]
    assert len(roots) == 3
    assert len(finished) == 3 * 4 + 3
    for request, root in zip(requests, roots, strict=True):
        ctx = request.get_span_context()
        _check_tree(finished, root, ctx.span_id)
        assert ctx.trace_id == root.context.trace_id
        assert request.start_time is not None
        assert request.end_time is not None
        assert root.start_time is not None
        assert root.end_time is not None
        assert request.start_time <= root.start_time <= root.end_time <= request.end_time


def test_root_without_an_active_span_starts_its_own_trace() -> None:
    """With no span active, the call's span is a trace root; its regions still nest under it."""
    with capture(sample_every=1) as cap:
        predict(BATCH)
        predict(BATCH)
    roots = [s for s in cap.spans() if s.name == "predict"]
    assert len(roots) == 2
    assert [r.parent for r in roots] == [None, None]
    assert roots[0].context.trace_id != roots[1].context.trace_id
    for root in roots:
        assert len(_subtree(cap.spans(), root)) == 4


def test_span_ids_are_on_the_summary() -> None:
    """The span exporter hands the call's own trace and span ids on to later exporters."""
    with capture(sample_every=1) as cap:
        predict(BATCH)
    (root,) = [s for s in cap.spans() if s.name == "predict"]
    (call,) = cap.calls
    assert trace.format_trace_id(root.context.trace_id) == call.trace_id
    assert trace.format_span_id(root.context.span_id) == call.span_id


def test_code_attributes_on_decorated_functions() -> None:
    """The root span says where the decorated function lives (OTel code.* conventions)."""
    with capture(sample_every=1) as cap:
        predict(BATCH)
    spans = {s.name: s for s in cap.spans()}
    attrs = spans["predict"].attributes
    assert attrs is not None
    assert attrs["code.function.name"] == "predict"
    assert __file__ == attrs["code.file.path"]
    assert inspect.getsourcelines(predict)[1] == attrs["code.line.number"]
    region_attrs = spans["preprocess"].attributes
    assert region_attrs is not None
    assert "code.function.name" not in region_attrs


def test_user_and_profkit_attributes() -> None:
    """User attributes of the decorator and of regions land on their spans next to profkit's."""
    with capture(sample_every=1) as cap:
        predict(BATCH)
    spans = {s.name: s for s in cap.spans()}
    root, pre, mlp = spans["predict"].attributes, spans["preprocess"].attributes, spans["mlp"]
    assert root is not None
    assert pre is not None
    assert (root["model"], root["version"]) == ("mlp", 3)
    assert pre["stage"] == 1
    assert "stage" not in root
    assert root["profkit.sampling.policy"] == "every:1"
    assert root["profkit.scope.label"] == "predict"
    assert mlp.attributes is not None
    assert "aten::addmm" in tuple(mlp.attributes["profkit.ops.name"])  # type: ignore[arg-type]
    assert "aten::mul" in tuple(pre["profkit.ops.name"])  # type: ignore[arg-type]
    (call,) = cap.calls
    assert [r.name for r in call.root.ops] == list(root["profkit.ops.name"])  # type: ignore[arg-type]
    assert [r.count for r in call.root.ops] == list(root["profkit.ops.count"])  # type: ignore[arg-type]


def test_an_empty_attribute_key_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    """``attributes={"": 1}`` (a key the OTel SDK refuses, with a warning on every span):
    left out of the summary and the span, the other attributes kept, the SDK silent."""

    @profkit.profiled("keys", attributes={"": 1, "ok": 2})
    def keys() -> int:
        with profkit.region("inner", **{"": "x", "fine": "y"}):
            return 3

    with capture(sample_every=1) as cap, caplog.at_level("WARNING"):
        assert 3 == keys()
    (call,) = cap.calls
    assert {"ok": 2} == dict(call.root.attributes)
    assert {"fine": "y"} == dict(call.scopes[1].attributes)
    spans = {s.name: s for s in cap.spans()}
    assert "" not in (spans["keys"].attributes or {})
    assert not [r for r in caplog.records if "attribute" in r.getMessage().lower()]


def test_error_status_and_exception_propagates_unchanged() -> None:
    """A raising call gets status ERROR and an exception record; the caller gets the same error."""
    with capture(sample_every=1) as cap, pytest.raises(ValueError, match="bad input") as info:
        failing(BATCH)
    spans = {s.name: s for s in cap.spans()}
    root = spans["failing"]
    assert root.status.status_code == StatusCode.ERROR
    assert root.status.description == "ValueError: bad input"
    (event,) = [e for e in root.events if e.name == "exception"]
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "ValueError"
    assert event.attributes["exception.message"] == "bad input"
    assert spans["before_error"].status.status_code == StatusCode.UNSET
    (call,) = cap.calls
    assert info.value is call.error
    assert cap.stats["exported"] == 1


def test_exception_event_is_at_the_end_of_its_span() -> None:
    """A raising call's exception event is timed when the call ended, inside its span."""
    with capture(sample_every=1) as cap, pytest.raises(ValueError):
        failing(BATCH)
    root = next(s for s in cap.spans() if s.name == "failing")
    assert [root.end_time] == [e.timestamp for e in root.events if e.name == "exception"]


@profkit.profiled("tolerant")
def tolerant(batch: torch.Tensor) -> torch.Tensor:
    """A stage that fails and is recovered from: the call itself returns."""
    with profkit.region("outer"):
        try:
            with profkit.region("fragile"):
                MODEL(batch)
                raise KeyError("cache miss")
        except KeyError:
            pass
        with profkit.region("fallback"), torch.no_grad():
            out: torch.Tensor = MODEL(batch)
    return out


def test_a_region_left_by_an_exception_has_error_status_and_its_event() -> None:
    """A region an exception left is an ERROR span with an exception event at its end, as
    OpenTelemetry's own spans are; the regions it did not leave, and the call, stay UNSET."""
    with capture(sample_every=1) as cap:
        tolerant(BATCH)
    by_name = {s.name: s for s in cap.spans()}
    fragile = by_name["fragile"]
    assert (StatusCode.ERROR, "KeyError: 'cache miss'") == (
        fragile.status.status_code,
        fragile.status.description,
    )
    events = [(e.name, e.timestamp, dict(e.attributes or {})) for e in fragile.events]
    assert [("exception", fragile.end_time)] == [(n, t) for n, t, _ in events]
    assert ("KeyError", "'cache miss'") == (
        events[0][2]["exception.type"],
        events[0][2]["exception.message"],
    )
    assert "raise KeyError" in str(events[0][2]["exception.stacktrace"])
    regions = {r["region"]: r.get("error") for r in call_fields(cap.calls[0])["regions"]}
    assert {"outer": None, "fragile": "KeyError", "fallback": None} == regions
    others = {n: s.status.status_code for n, s in by_name.items() if n != "fragile"}
    assert {
        "tolerant": StatusCode.UNSET,
        "outer": StatusCode.UNSET,
        "fallback": StatusCode.UNSET,
    } == others


@profkit.profiled("failing_inside")
def failing_inside(batch: torch.Tensor) -> None:
    """Raises inside a region inside a region."""
    with profkit.region("load"):
        batch.sum()
    with profkit.region("outer"), profkit.region("inner"):
        raise ValueError("bad input")


def test_a_raising_call_s_regions_on_the_way_out_are_errors_too() -> None:
    """The exception of a raising call marks each region it passed through, and the call;
    a region it did not pass through stays UNSET."""
    with capture(sample_every=1) as cap, pytest.raises(ValueError):
        failing_inside(BATCH)
    assert {
        "failing_inside": StatusCode.ERROR,
        "load": StatusCode.UNSET,
        "outer": StatusCode.ERROR,
        "inner": StatusCode.ERROR,
    } == {s.name: s.status.status_code for s in cap.spans()}


def test_ok_calls_have_unset_status_and_no_events() -> None:
    """A call that returns normally carries no status and no span events (rows are logs)."""
    with capture(sample_every=1) as cap:
        out = predict(BATCH)
    assert tuple(out.shape) == (32, 10)
    for span in cap.spans():
        assert span.status.status_code == StatusCode.UNSET
        assert tuple(span.events) == ()


def test_no_attribute_name_is_the_prefix_of_another() -> None:
    """OTel naming: no attribute name is also a namespace (``a`` next to ``a.b``)."""
    with capture(sample_every=1, profile_memory=True, with_flops=True) as cap:
        predict(BATCH)
    names = {k for s in cap.spans() for k in (s.attributes or {})}
    assert "profkit.diagnosis.verdict" in names
    assert [] == sorted(a for a in names for b in names if b.startswith(a + "."))


def test_derived_figures_are_rounded_and_counts_are_ints() -> None:
    """Diagnosis figures: µs to 0.001, shares to 0.0001, counts as ints."""
    with capture(sample_every=1) as cap:
        predict(BATCH)
    root = {s.name: s for s in cap.spans()}["predict"].attributes or {}
    figures = {k: v for k, v in root.items() if k.startswith("profkit.diagnosis.")}
    assert isinstance(figures["profkit.diagnosis.op_count"], int)
    assert cap.calls[0].root.op_count == figures["profkit.diagnosis.op_count"]
    for name, value in figures.items():
        if name.endswith("_us"):
            assert round(float(value), 3) == value, name  # type: ignore[arg-type]
        elif name.endswith("_share"):
            assert round(float(value), 4) == value, name  # type: ignore[arg-type]


def test_op_table_is_one_readable_string_next_to_the_arrays() -> None:
    """``profkit.ops.table``: a header and one line per row (name, count, self, total µs)."""
    with capture(sample_every=1, top_k=3) as cap:
        predict(BATCH)
    spans = {s.name: s for s in cap.spans()}
    attrs = spans["predict"].attributes or {}
    table = attrs["profkit.ops.table"]
    assert isinstance(table, str)
    header, *lines = table.split("\n")
    assert header.split() == ["op", "count", "self_cpu_us", "cpu_us"]
    rows = cap.calls[0].root.ops
    assert len(rows) == len(lines) == len(attrs["profkit.ops.name"])  # type: ignore[arg-type]
    for row, line in zip(rows, lines, strict=True):
        name, count, self_us, total_us = line.rsplit(None, 3)
        assert (row.name, row.count) == (name, int(count))
        assert (f"{row.self_cpu_us:.1f}", f"{row.cpu_us:.1f}") == (self_us, total_us)


@pytest.fixture
def global_provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """A global TracerProvider for one test; OTel's set-once globals are restored afterwards.

    ``set_tracer_provider`` works once per process, so this resets OTel's private globals the
    way OpenTelemetry's own test suite does, and monkeypatch puts the old ones back.
    """
    provider, spans = _provider()
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    trace.set_tracer_provider(provider)
    yield spans
    provider.shutdown()


def test_global_tracer_provider_is_used_when_none_is_given(
    global_provider: InMemorySpanExporter,
) -> None:
    """Without configure(tracer_provider=...) the spans go to the global TracerProvider."""
    profkit.configure(sample_every=1, exporters=("otel",))
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        predict(BATCH)
    assert profkit.shutdown(10.0)
    finished = global_provider.get_finished_spans()
    (root,) = [s for s in finished if s.name == "predict"]
    _check_tree(finished, root, request.get_span_context().span_id)


def test_provider_installed_after_configure_is_picked_up(
    global_provider: InMemorySpanExporter,
) -> None:
    """The tracer is resolved per export, so a provider set after configure() still gets spans."""
    late_provider, late = _provider()
    profkit.configure(sample_every=1, exporters=("otel",))
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    trace.set_tracer_provider(late_provider)
    predict(BATCH)
    assert profkit.shutdown(10.0)
    assert sorted(s.name for s in late.get_finished_spans()) == [
        "forward",
        "mlp",
        "predict",
        "preprocess",
    ]
    assert tuple(global_provider.get_finished_spans()) == ()


# -- FastAPI: the profkit span is a child of the HTTP server span --------------------------


def _app(provider: TracerProvider) -> FastAPI:
    app = FastAPI()

    @app.get("/sync")
    @profkit.profiled("handler")
    def sync_handler(n: int = 1) -> dict[str, float]:
        with profkit.region("forward"), torch.no_grad():
            out = MODEL(BATCH * n)
        return {"sum": round(float(out.sum()), 3)}

    @app.get("/async")
    @profkit.profiled("handler")
    async def async_handler(n: int = 1) -> dict[str, float]:
        with profkit.region("forward"), torch.no_grad():
            out = MODEL(BATCH * n)
        return {"sum": round(float(out.sum()), 3)}

    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)
    return app


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["/sync", "/async"])
def test_span_is_child_of_the_fastapi_server_span(path: str) -> None:
    """Under FastAPIInstrumentor the call's span sits under the HTTP server span, same trace."""
    provider, spans = _provider()
    with torch.no_grad():
        expected = round(float(MODEL(BATCH * 2).sum()), 3)
    app = _app(provider)

    async def drive() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [await client.get(path, params={"n": 2}) for _ in range(2)]

    try:
        with capture(sample_every=1, tracer_provider=provider):
            replies = asyncio.run(drive())
    finally:
        FastAPIInstrumentor.uninstrument_app(app)
    assert [r.status_code for r in replies] == [200, 200]
    assert [{"sum": expected}] * 2 == [r.json() for r in replies]
    finished = spans.get_finished_spans()
    servers = [s for s in finished if s.kind == SpanKind.SERVER]
    roots = [s for s in finished if s.name == "handler"]
    assert len(servers) == 2
    assert len(roots) == 2
    by_id = _by_id(finished)
    for root in roots:
        assert root.parent is not None
        server = by_id[root.parent.span_id]
        assert server.kind == SpanKind.SERVER
        assert server.context.trace_id == root.context.trace_id
        (forward,) = [s for s in _subtree(finished, root) if s.name == "forward"]
        assert forward.parent is not None
        assert root.context.span_id == forward.parent.span_id
    assert {s.context.span_id for s in servers} == {r.parent.span_id for r in roots if r.parent}
