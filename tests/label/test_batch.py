"""Batched inference: one forward serves many requests, and every request's trace shows its share.

Each request takes ``profkit.batch_member()`` in its own span; the batcher runs one forward
in ``profkit.batch(label, members, weights)``. The batch span links every member's span and
says the batch size; each member's trace gets a child span with its share and a link back;
log events carry each member's ids. Real OTel SDK spans (in memory) and real torch models.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import structlog
import torch
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased

import profkit
from profkit.exporters.console import render_call
from profkit.testing import Capture, capture

pytestmark = pytest.mark.timeout(120)

QUIET = 10**9  # samples the sampler's first call only: spend it first where that matters


@pytest.fixture
def provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    """A real SDK provider whose finished spans stay in memory."""
    spans = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    return tp, spans


@contextmanager
def batching(
    provider: tuple[TracerProvider, InMemorySpanExporter], **settings: Any
) -> Iterator[tuple[Capture, trace.Tracer]]:
    """A capture session on ``provider`` and a tracer for the requests' own spans."""
    tp, spans = provider
    settings.setdefault("sample_every", 1)
    with capture(tracer_provider=tp, **settings) as cap:
        cap.span_exporter = spans  # cap.spans(): every span of the provider, requests' too
        yield cap, tp.get_tracer("requests")


def _by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def _batch_and_members(
    spans: tuple[ReadableSpan, ...], label: str
) -> tuple[ReadableSpan, list[ReadableSpan]]:
    """The one batch span (it has no parent in a request) and the member spans of ``label``."""
    named = _by_name(spans, label)
    batches = [s for s in named if "profkit.batch.share" not in (s.attributes or {})]
    assert 1 == len(batches), [s.attributes for s in named]
    return batches[0], [s for s in named if s is not batches[0]]


def _ids(span: ReadableSpan) -> tuple[int, int]:
    ctx = span.get_span_context()
    assert ctx is not None
    return ctx.trace_id, ctx.span_id


async def _micro_batcher(tracer: trace.Tracer, model: torch.nn.Module, n: int) -> list[int]:
    """``n`` requests, each in its own span, queued to a batcher task that runs one forward."""
    inbox: asyncio.Queue[tuple[torch.Tensor, profkit.BatchMember, asyncio.Future[Any]]]
    inbox = asyncio.Queue()

    async def batcher() -> None:
        items = [await inbox.get() for _ in range(n)]
        members = [m for _, m, _ in items]
        async with profkit.batch("forward", members):
            with torch.inference_mode():
                out = model(torch.stack([x for x, _, _ in items]))
        for (_, _, fut), row in zip(items, out, strict=True):
            fut.set_result(int(row.argmax()))

    async def request(i: int) -> int:
        with tracer.start_as_current_span(f"request-{i}"):
            fut = asyncio.get_running_loop().create_future()
            await inbox.put((torch.randn(64), profkit.batch_member(), fut))
            result: int = await fut
            return result

    task = asyncio.create_task(batcher())
    results = await asyncio.gather(*(request(i) for i in range(n)))
    await task
    return list(results)


def test_asyncio_micro_batcher_links_eight_requests(
    provider: tuple[TracerProvider, InMemorySpanExporter], mlp: torch.nn.Module
) -> None:
    """8 requests batched into one forward: one batch span, 8 links, shares 1/8, links back."""
    with batching(provider) as (cap, tracer):
        assert 8 == len(asyncio.run(_micro_batcher(tracer, mlp, 8)))
    spans = cap.spans()
    requests = {_ids(s): s for s in spans if s.name.startswith("request-")}
    batch, members = _batch_and_members(spans, "forward")
    assert 8 == len(requests)
    assert set(requests) == {(link.context.trace_id, link.context.span_id) for link in batch.links}
    assert 8 == (batch.attributes or {})["profkit.batch.size"]
    assert "aten::addmm" in (batch.attributes or {})["profkit.ops.name"]
    assert 8 == len(members)
    batch_ctx = _ids(batch)
    for member in members:
        attrs = member.attributes or {}
        assert member.parent is not None
        assert (member.parent.trace_id, member.parent.span_id) in requests
        assert (8, 0.125, 0.125) == (
            attrs["profkit.batch.size"],
            attrs["profkit.batch.share"],
            attrs["profkit.ops.scale"],
        )
        assert [batch_ctx] == [(li.context.trace_id, li.context.span_id) for li in member.links]
        assert (batch.start_time, batch.end_time) == (member.start_time, member.end_time)
    assert {m.parent.span_id for m in members if m.parent} == {s for _, s in requests}
    assert (1, 0, 0) == (cap.stats["sampled"], cap.stats["dropped"], cap.stats["errors"])
    assert 1 == cap.stats["exported"]


def test_member_op_rows_are_the_batch_rows_times_the_share(
    provider: tuple[TracerProvider, InMemorySpanExporter], mlp: torch.nn.Module
) -> None:
    """A member's op times are the batch's times its share; the shares add up to the batch."""
    with batching(provider) as (cap, tracer):
        asyncio.run(_micro_batcher(tracer, mlp, 4))
    batch, members = _batch_and_members(cap.spans(), "forward")
    b = batch.attributes or {}
    for member in members:
        m = member.attributes or {}
        assert b["profkit.ops.name"] == m["profkit.ops.name"]
        assert b["profkit.ops.count"] == m["profkit.ops.count"]
        expected = [round(t * 0.25, 3) for t in b["profkit.ops.self_cpu_us"]]
        assert expected == pytest.approx(list(m["profkit.ops.self_cpu_us"]), abs=0.002)
    total = sum(float((m.attributes or {})["profkit.self_cpu_us"]) for m in members)
    assert float(b["profkit.self_cpu_us"]) == pytest.approx(total, abs=0.01)


def test_batcher_thread_weights_give_shares(
    provider: tuple[TracerProvider, InMemorySpanExporter], mlp: torch.nn.Module
) -> None:
    """A batcher thread fed by 4 request threads, weights (1, 1, 2, 4): shares 1/8 .. 4/8."""
    inbox: queue.Queue[tuple[int, profkit.BatchMember]] = queue.Queue()

    def batcher() -> None:
        got = sorted(inbox.get(timeout=30) for _ in range(4))
        members = [m for _, m in got]
        with profkit.batch("generate", members, weights=(1, 1, 2, 4)), torch.inference_mode():
            mlp(torch.randn(4, 64))

    with batching(provider) as (cap, tracer):
        spans_of: dict[int, int] = {}

        def request(i: int) -> None:
            with tracer.start_as_current_span(f"request-{i}") as span:
                spans_of[span.get_span_context().span_id] = i
                inbox.put((i, profkit.batch_member()))

        thread = threading.Thread(target=batcher)
        thread.start()
        requests = [threading.Thread(target=request, args=(i,)) for i in range(4)]
        for t in requests:
            t.start()
        for t in [*requests, thread]:
            t.join(30)
    batch, members = _batch_and_members(cap.spans(), "generate")
    shares = {
        spans_of[m.parent.span_id]: (m.attributes or {})["profkit.batch.share"]
        for m in members
        if m.parent
    }
    assert {0: 1 / 8, 1: 1 / 8, 2: 2 / 8, 3: 4 / 8} == shares
    assert all((m.attributes or {})["profkit.batch.weighted"] for m in members)
    assert 4 == len(batch.links)


def _quiet_session_first_call() -> None:
    """Spend the sampler's first pick (sample_every=QUIET picks call 0 of each label): a
    root call's, and the batch label's (the sampler counts per label)."""
    with profkit.region("spend"):
        pass
    session = profkit._global.get_session()
    assert session is not None
    assert next(session.picks.first("forward")) is True


def test_a_batch_the_sampler_does_not_pick_exports_nothing(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """Unpicked and nobody asked: no span, no summary; tokens cost nothing else."""
    with batching(provider, sample_every=QUIET) as (cap, tracer):
        _quiet_session_first_call()
        with tracer.start_as_current_span("request"):
            member = profkit.batch_member()
        with profkit.batch("forward", [member]):
            torch.mm(torch.randn(8, 8), torch.randn(8, 8))
    assert [] == _by_name(cap.spans(), "forward")
    assert (2, 1, 1) == (cap.stats["root_calls"], cap.stats["sampled"], cap.stats["exported"])


def test_a_member_asking_by_baggage_profiles_the_batch(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """baggage profkit.profile=1 on one request profiles its batch (policy baggage)."""
    with batching(provider, sample_every=QUIET, baggage_trigger=True) as (cap, tracer):
        _quiet_session_first_call()
        members = []
        for ask in (False, True, False):
            ctx = baggage.set_baggage("profkit.profile", "1") if ask else None
            token = otel_context.attach(ctx) if ctx is not None else None
            try:
                with tracer.start_as_current_span("request"):
                    members.append(profkit.batch_member())
            finally:
                if token is not None:
                    otel_context.detach(token)
        assert [False, True, False] == [m.asked for m in members]
        with profkit.batch("forward", members):
            torch.mm(torch.randn(8, 8), torch.randn(8, 8))
    batch, spans = _batch_and_members(cap.spans(), "forward")
    assert "baggage" == (batch.attributes or {})["profkit.sampling.policy"]
    assert 3 == len(spans)


def test_a_request_profiled_by_a_trigger_asks_for_its_batch(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """A request whose own root call a trigger profiled takes a token that asks."""
    with batching(provider, sample_every=QUIET) as (cap, tracer):
        _quiet_session_first_call()
        profkit.trigger(1, label="handler")

        @profkit.profiled("handler")
        def handler() -> profkit.BatchMember:
            with tracer.start_as_current_span("request"):
                return profkit.batch_member()

        asked = handler()
        quiet = handler()
        assert (True, False) == (asked.asked, quiet.asked)
        with profkit.batch("forward", [quiet, asked]):
            torch.mm(torch.randn(8, 8), torch.randn(8, 8))
    _, members = _batch_and_members(cap.spans(), "forward")
    assert 2 == len(members)


def test_unsampled_members_get_no_span_and_are_counted(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """Members in unsampled traces get no member span (counted); the others do."""
    never = TracerProvider(sampler=ParentBased(ALWAYS_OFF)).get_tracer("unsampled")
    with batching(provider) as (cap, tracer):
        with tracer.start_as_current_span("sampled"):
            sampled = profkit.batch_member()
        with never.start_as_current_span("unsampled"):
            unsampled = profkit.batch_member()
        with profkit.batch("forward", [sampled, unsampled]):
            torch.mm(torch.randn(8, 8), torch.randn(8, 8))
    batch, members = _batch_and_members(cap.spans(), "forward")
    assert 2 == (batch.attributes or {})["profkit.batch.size"]
    assert 1 == len(batch.links)
    assert [0.5] == [(m.attributes or {})["profkit.batch.share"] for m in members]
    assert 1 == cap.stats["batch_members_unsampled"]


def test_a_batch_of_unsampled_traces_is_not_forced(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """All members in unsampled traces, one asking: only the batcher's own sampler profiles."""
    never = TracerProvider(sampler=ParentBased(ALWAYS_OFF)).get_tracer("unsampled")
    with batching(provider, sample_every=QUIET, baggage_trigger=True) as (cap, _):
        _quiet_session_first_call()
        token = otel_context.attach(baggage.set_baggage("profkit.profile", "1"))
        try:
            with never.start_as_current_span("unsampled"):
                member = profkit.batch_member()
        finally:
            otel_context.detach(token)
        with profkit.batch("forward", [member]):
            pass
    assert [] == _by_name(cap.spans(), "forward")
    assert 1 == cap.stats["sampled"]  # the first call only


def test_bad_members_and_weights_are_counted_never_raised(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """None and foreign objects are left out and counted; bad weights give equal shares."""
    with batching(provider) as (cap, tracer):
        with tracer.start_as_current_span("request"):
            good = profkit.batch_member()
        with profkit.batch("forward", [None, good, object()], weights=(1, 1, 1)):
            pass
        with profkit.batch("weights", [good, good], weights=(1, float("nan"))):
            pass
        with profkit.batch("short", [good, good], weights=(1,)):
            pass
        with profkit.batch("nothing", 42):  # type: ignore[arg-type]
            pass
    spans = cap.spans()
    batch, members = _batch_and_members(spans, "forward")
    assert (1, [1.0]) == (
        (batch.attributes or {})["profkit.batch.size"],
        [(m.attributes or {})["profkit.batch.share"] for m in members],
    )
    _, weighted = _batch_and_members(spans, "weights")
    assert [0.5, 0.5] == [(m.attributes or {})["profkit.batch.share"] for m in weighted]
    assert "batch of 2 requests, shares 0.5, 0.5" in render_call(cap.calls[1])
    assert [False, False] == [(m.attributes or {})["profkit.batch.weighted"] for m in weighted]
    assert (3, 2, 0) == (
        cap.stats["batch_members_invalid"],
        cap.stats["batch_weights_invalid"],
        cap.stats["errors"],
    )
    nothing = _by_name(spans, "nothing")
    assert 1 == len(nothing)
    assert "profkit.batch.size" not in (nothing[0].attributes or {})


def test_weights_past_float_s_range_and_sums_that_overflow(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """An int weight past float's range is a bad weight (counted, equal shares, members
    kept), not an internal error that loses the members; finite weights whose sum
    overflows still give their shares."""
    with batching(provider) as (cap, tracer):
        with tracer.start_as_current_span("request"):
            good = profkit.batch_member()
        with profkit.batch("huge", [good, good], weights=(10**400, 1)):
            pass
        with profkit.batch("big", [good, good], weights=(1e308, 1e308)):
            pass
    spans = cap.spans()
    _, huge = _batch_and_members(spans, "huge")
    assert [0.5, 0.5] == [(m.attributes or {})["profkit.batch.share"] for m in huge]
    _, big = _batch_and_members(spans, "big")
    assert [0.5, 0.5] == [(m.attributes or {})["profkit.batch.share"] for m in big]
    assert [True, True] == [(m.attributes or {})["profkit.batch.weighted"] for m in big]
    assert (1, 0) == (cap.stats["batch_weights_invalid"], cap.stats["errors"])


def test_weights_as_numpy_numbers_arrays_and_tensors_give_their_shares(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """Weights from numpy (int64, float32 numbers or an array) or a 1-D tensor of context
    lengths are numbers: their shares, not equal shares and a bad-weights count."""
    with batching(provider) as (cap, tracer):
        members = []
        for _ in range(2):
            with tracer.start_as_current_span("request"):
                members.append(profkit.batch_member())
        given = {
            "np_int": [np.int64(1), np.int64(3)],
            "np_f32": [np.float32(1.0), np.float32(3.0)],
            "np_array": np.array([1, 3]),
            "tensor": torch.tensor([1, 3]),
        }
        for label, weights in given.items():
            with profkit.batch(label, members, weights=weights):
                pass
    spans = cap.spans()
    shares = {}
    for label in given:
        _, member_spans = _batch_and_members(spans, label)
        shares[label] = [(m.attributes or {})["profkit.batch.share"] for m in member_spans]
    assert {label: [0.25, 0.75] for label in given} == shares
    assert (0, 0) == (cap.stats["batch_weights_invalid"], cap.stats["errors"])


def test_an_empty_batch_with_its_empty_weights_counts_no_bad_weights(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """No member, no weight (a decode step whose sequences all left): nothing is wrong with
    the weights; a batch of only non-tokens counts the members, not their good weights."""
    with batching(provider) as (cap, _):
        with profkit.batch("idle", [], weights=[]):
            pass
        with profkit.batch("foreign", [None, "request"], weights=[1, 2]):
            pass
    assert (0, 2, 0) == (
        cap.stats["batch_weights_invalid"],
        cap.stats["batch_members_invalid"],
        cap.stats["errors"],
    )


def test_a_batch_inside_a_profiled_call_is_a_region(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """Nested in a sampled root call, a batch only labels: a child span, no member spans."""
    with batching(provider) as (cap, tracer):
        with tracer.start_as_current_span("request"):
            member = profkit.batch_member()

        @profkit.profiled("loop")
        def loop() -> None:
            with profkit.batch("forward", [member]):
                torch.mm(torch.randn(8, 8), torch.randn(8, 8))

        loop()
    forward = _by_name(cap.spans(), "forward")
    assert 1 == len(forward)
    assert "profkit.batch.size" not in (forward[0].attributes or {})
    assert 1 == cap.stats["sampled"]


def test_log_events_carry_each_members_ids(
    provider: tuple[TracerProvider, InMemorySpanExporter], mlp: torch.nn.Module
) -> None:
    """One profkit.batch_member event per member, with that member span's trace and span ids."""
    with (
        structlog.testing.capture_logs() as logs,
        batching(provider, exporters=("otel", "log")) as (cap, tracer),
    ):
        asyncio.run(_micro_batcher(tracer, mlp, 3))
    _, members = _batch_and_members(cap.spans(), "forward")
    expected = {
        (f"{m.context.trace_id:032x}", f"{m.context.span_id:016x}") for m in members if m.context
    }
    events = [e for e in logs if e["event"] == "profkit.batch_member"]
    assert expected == {(e["trace_id"], e["span_id"]) for e in events}
    profile = next(e for e in logs if e["event"] == "profkit.profile")
    assert {(e["batch_trace_id"], e["batch_span_id"]) for e in events} == {
        (profile["trace_id"], profile["span_id"])
    }
    assert 3 == profile["batch_size"]
    assert [round(1 / 3, 6)] * 3 == [m["share"] for m in profile["batch_members"]]


def test_without_a_session_batching_is_free_and_silent() -> None:
    """Before configure(): tokens are made, batches run, nothing is recorded or raised."""
    tp = TracerProvider(sampler=TraceIdRatioBased(1.0))
    with tp.get_tracer("t").start_as_current_span("request"):
        member = profkit.batch_member()
    assert member.span_context is not None
    with profkit.batch("forward", [member, None]):
        pass
    assert 0 == profkit.stats()["root_calls"]


def test_an_error_in_the_forward_reaches_the_batcher_and_the_spans(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """The forward's exception propagates unchanged; the batch span says ERROR, members exist."""
    with batching(provider) as (cap, tracer):
        with tracer.start_as_current_span("request"):
            member = profkit.batch_member()
        boom = RuntimeError("forward failed")
        with pytest.raises(RuntimeError) as raised, profkit.batch("forward", [member]):
            raise boom
        assert raised.value is boom
    batch, members = _batch_and_members(cap.spans(), "forward")
    assert trace.StatusCode.ERROR == batch.status.status_code
    assert 1 == len(members)
    assert 0 == cap.stats["errors"]


@pytest.mark.usefixtures("swallow_internal_errors")
def test_a_failing_decision_of_an_asked_batch_is_counted_and_the_batch_runs(
    provider: tuple[TracerProvider, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the decision of a batch a member asked for is counted (error "begin_root");
    the batch itself runs unprofiled."""
    with batching(provider, sample_every=QUIET) as (cap, _):
        _quiet_session_first_call()
        session = profkit._global.get_session()
        assert session is not None
        profkit.trigger(1, label="handler")

        @profkit.profiled("handler")
        def handler() -> profkit.BatchMember:
            return profkit.batch_member()

        asked = handler()
        real = session.begin_root

        def broken(label: str, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("asked"):
                raise RuntimeError("injected")
            return real(label, *args, **kwargs)

        monkeypatch.setattr(session, "begin_root", broken)
        ran = []
        with profkit.batch("forward", [asked]):
            ran.append(True)
    assert [True] == ran
    assert [] == _by_name(cap.spans(), "forward")
    assert {"begin_root": 1} == cap.stats["error_reasons"]
    assert 2 == cap.stats["root_calls"]


def _asked_member(tracer: Any) -> profkit.BatchMember:
    """A request whose baggage asks for a profile, in a sampled trace of its own."""
    from opentelemetry import baggage, context

    token = context.attach(baggage.set_baggage("profkit.profile", "1"))
    try:
        with tracer.start_as_current_span("request"):
            return profkit.batch_member()
    finally:
        context.detach(token)


def test_a_refused_asked_batch_is_counted_once(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """A batch the rate cap refuses, one of whose members asked: one refusal, counted once,
    and the counters add up (it was counted twice: once by the decision, once by the
    forced open that followed it)."""
    tracer = provider[0].get_tracer("test")
    with capture(sample_every=1, cold_calls=0, baggage_trigger=True, max_per_minute=1) as cap:
        for _ in range(2):
            with profkit.batch("forward", [_asked_member(tracer)]):
                pass
    s = cap.stats
    assert (2, 1, 1) == (s["root_calls"], s["sampled"], s["unsampled"])
    assert 1 == s["skipped_rate_limit"]
    assert s["root_calls"] == s["sampled"] + s["warmup_calls"] + s["unsampled"]


def test_an_asked_batch_of_a_cold_label_says_cold(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """The first batch of its label (cold) profiled because a member asked: marked cold, as
    a plain root call profiled for its baggage is (``profkit.cold`` on its span)."""
    tracer = provider[0].get_tracer("test")
    with (
        capture(sample_every=10**9, cold_calls=3, baggage_trigger=True) as cap,
        profkit.batch("forward", [_asked_member(tracer)]),
    ):
        pass
    (call,) = cap.calls
    assert ("baggage", True) == (call.policy, call.cold)
    (span,) = [s for s in cap.spans() if f"{s.context.span_id:016x}" == call.span_id]
    assert span.attributes is not None
    assert span.attributes.get("profkit.cold") is True


def test_an_asked_batch_joins_the_speculative_window_of_its_loop(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """``capture_slow`` on an event loop: a batch a member asked for, entered while the loop's
    speculative window is open, joins it as ``"baggage"``, as a root region whose baggage
    asks does; it is not refused as busy (that window is this thread's own)."""
    import asyncio

    from profkit._capture.slot import SLOT

    tracer = provider[0].get_tracer("test")

    @profkit.profiled("handler")
    async def handler() -> None:
        await asyncio.sleep(0.01)

    async def main() -> int:
        for _ in range(40):  # the label's baseline: speculative windows open from here on
            await handler()
        joined = 0
        for _ in range(10):
            task = asyncio.create_task(handler())
            await asyncio.sleep(0.002)
            joined += SLOT.held is not None
            async with profkit.batch("forward", [_asked_member(tracer)]):
                pass
            await task
        return joined

    with capture(sample_every=10**9, cold_calls=0, capture_slow=True, baggage_trigger=True) as cap:
        joined = asyncio.run(main())
    assert joined >= 1  # the case under test happened
    forward = [c.policy for c in cap.calls if c.label == "forward"]
    assert ["baggage"] * 10 == forward
    assert 0 == cap.stats["skipped_busy"]


class _DeviceWeights:
    """Weights as a device tensor gives them: ``tolist()`` copies them to the host, waiting
    for every kernel queued before (a synchronize): each read is noted."""

    def __init__(self, values: list[int]) -> None:
        self.values, self.reads = values, 0

    def tolist(self) -> list[int]:
        self.reads += 1
        return self.values


def test_an_unprofiled_batch_never_reads_its_weights(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """Weights are read only for a profiled batch (their only use is its members' shares):
    off-sample, a device tensor's ``tolist()`` would synchronize the device on every batch."""
    weights = _DeviceWeights([1, 3])
    with batching(provider, sample_every=10**9, cold_calls=0) as (cap, tracer):
        members = []
        for _ in range(2):
            with tracer.start_as_current_span("request"):
                members.append(profkit.batch_member())
        for _ in range(5):  # the first is the sampler's pick, then off-sample
            with profkit.batch("forward", members, weights=weights):
                pass
    _, member_spans = _batch_and_members(cap.spans(), "forward")
    shares = [(m.attributes or {})["profkit.batch.share"] for m in member_spans]
    assert (1, [0.25, 0.75]) == (weights.reads, shares)


def test_a_batch_of_many_members_gives_spans_and_links_to_the_first_128(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """10k members: 128 member spans and links, the rest counted; the size is the batch's."""
    with batching(provider) as (cap, tracer):
        with tracer.start_as_current_span("request"):
            token = profkit.batch_member()
        with profkit.batch("forward", [token] * 10_000):
            torch.mm(torch.randn(8, 8), torch.randn(8, 8))
    batch, members = _batch_and_members(cap.spans(), "forward")
    assert (10_000, 128, 128) == (
        (batch.attributes or {})["profkit.batch.size"],
        len(batch.links),
        len(members),
    )
    assert [1 / 10_000] == sorted({(m.attributes or {})["profkit.batch.share"] for m in members})
    assert 10_000 - 128 == cap.stats["batch_members_truncated"]


def test_a_members_iterable_that_never_ends_is_read_129_items_deep(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """An endless members generator: the batch reads 129 items, runs, and counts the rest."""
    read = 0

    def endless(token: profkit.BatchMember) -> Iterator[profkit.BatchMember]:
        nonlocal read
        while True:
            read += 1
            yield token

    with batching(provider) as (cap, tracer):
        with tracer.start_as_current_span("request"):
            token = profkit.batch_member()
        with profkit.batch("forward", endless(token)):
            torch.mm(torch.randn(8, 8), torch.randn(8, 8))
    _, members = _batch_and_members(cap.spans(), "forward")
    assert (129, 128, 1) == (read, len(members), cap.stats["batch_members_truncated"])


def test_a_batch_entered_twice_is_one_root_call_that_ends(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """``with b: with b:``: one batch root that ends; later root calls are counted as usual."""
    with batching(provider) as (cap, tracer):
        with tracer.start_as_current_span("request"):
            token = profkit.batch_member()
        b = profkit.batch("forward", [token])
        with b, b:
            torch.mm(torch.randn(8, 8), torch.randn(8, 8))

        @profkit.profiled("later")
        def later() -> None:
            torch.mm(torch.randn(4, 4), torch.randn(4, 4))

        for _ in range(10):
            later()
        assert profkit.force_flush()
    assert (11, 11) == (cap.stats["root_calls"], cap.stats["sampled"])
