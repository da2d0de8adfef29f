"""asyncio roots other than a decorated coroutine: a decorated async generator keeps only the
ops of its own steps; a root ``region()`` held across an ``await`` cannot tell its task's ops
from another task's, and says so (``attribution="window"``) rather than claim them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import torch

import profkit
from profkit._capture.keeper import checkpoint
from profkit._capture.slot import SLOT
from profkit.testing import capture

STEPS = 3
NEIGHBOUR_OPS = 20


def _rows(call: profkit.CallSummary) -> dict[str, int]:
    return {row.name: row.count for row in call.root.ops}


async def _neighbour() -> None:
    """Another request on the same loop: softmaxes outside any profkit scope, some of them
    while the sampled root waits."""
    for _ in range(NEIGHBOUR_OPS):
        torch.softmax(torch.ones(4, 4), 0)
        await asyncio.sleep(0)


def _beside_a_neighbour(root: Callable[[], Awaitable[int]]) -> profkit.CallSummary:
    """Run the sampled ``root`` (which returns 7) beside a neighbour task; its one call."""

    async def main() -> int:
        got, _ = await asyncio.gather(root(), _neighbour())
        return got

    with capture(sample_every=1, cold_calls=0, max_window_s=60.0) as cap:
        assert 7 == asyncio.run(main())
    (call,) = cap.calls
    return call


@profkit.profiled("agen")
async def _agen() -> AsyncIterator[int]:
    for i in range(STEPS):
        torch.mm(torch.ones(4, 4), torch.ones(4, 4))  # the stream's own work
        await asyncio.sleep(0.002)  # the loop serves the neighbour here, inside the step
        yield i


@pytest.mark.timeout(60)
def test_a_sampled_async_generator_keeps_only_its_own_steps_ops() -> None:
    async def main() -> list[int]:
        async def consume() -> list[int]:
            return [x async for x in _agen()]

        got, _ = await asyncio.gather(consume(), _neighbour())
        return got

    with capture(sample_every=1, cold_calls=0, max_window_s=60.0) as cap:
        assert list(range(STEPS)) == asyncio.run(main())
    (call,) = cap.calls
    assert call.label == "agen"
    assert call.truncated is None
    assert call.attribution == "task"
    rows = _rows(call)
    assert STEPS == rows["aten::mm"]
    assert not {name for name in rows if "softmax" in name}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("form", ["async with", "with"])
def test_a_root_region_across_an_await_says_window(form: str) -> None:
    """``async with region()`` (or a plain ``with`` around an ``await``) as a task's root:
    the neighbour's ops fall in its range on its thread, and no step boundaries are known."""

    async def request() -> int:
        if form == "async with":
            async with profkit.region("req"):
                torch.mm(torch.ones(4, 4), torch.ones(4, 4))
                await asyncio.sleep(0.01)
        else:
            with profkit.region("req"):
                torch.mm(torch.ones(4, 4), torch.ones(4, 4))
                await asyncio.sleep(0.01)
        return 7

    call = _beside_a_neighbour(request)
    assert call.attribution == "window"
    assert 1 == _rows(call)["aten::mm"]


@pytest.mark.timeout(60)
def test_a_root_region_that_never_yields_to_the_loop_stays_exact() -> None:
    """No ``await`` inside the region: nothing else ran on the loop, the table is exact."""

    async def request() -> int:
        async with profkit.region("req"):
            torch.mm(torch.ones(4, 4), torch.ones(4, 4))
        await asyncio.sleep(0.01)  # after the region: the loop runs the neighbour here
        return 7

    call = _beside_a_neighbour(request)
    assert call.attribution == "thread"
    rows = _rows(call)
    assert 1 == rows["aten::mm"]
    assert not {name for name in rows if "softmax" in name}


@pytest.mark.timeout(60)
def test_a_root_batch_across_an_await_says_window() -> None:
    """``async with profkit.batch()`` is a root like a region: across an ``await`` it says
    ``window``."""

    async def batcher() -> int:
        async with profkit.batch("forward", []):
            torch.mm(torch.ones(4, 4), torch.ones(4, 4))
            await asyncio.sleep(0.01)
        return 7

    call = _beside_a_neighbour(batcher)
    assert call.attribution == "window"


@profkit.profiled("tokenize")
async def _tokenize(x: torch.Tensor) -> torch.Tensor:
    await asyncio.sleep(0)
    return torch.tanh(x)


@profkit.profiled("stream_gather")
async def _stream_gather(x: torch.Tensor) -> AsyncIterator[float]:
    for _ in range(2):
        a, b = await asyncio.gather(_tokenize(x), _tokenize(x))  # the call's own child tasks
        yield float(torch.mm(a, b).sum())


@profkit.profiled("handler_gather")
async def _handler_gather(x: torch.Tensor) -> float:
    a, b = await asyncio.gather(_tokenize(x), _tokenize(x))
    return float(torch.mm(a, b).sum())


@pytest.mark.timeout(60)
def test_decorated_coroutines_in_child_tasks_keep_their_ops() -> None:
    """``asyncio.gather`` of decorated coroutines inside a sampled coroutine or async
    generator: their steps run in child tasks, recorded as the call's too, so their ops stay
    (in their scope and in the root's), while a neighbour's are still left out."""

    async def main() -> None:
        x = torch.ones(4, 4)

        async def consume() -> list[float]:
            return [v async for v in _stream_gather(x)]

        await asyncio.gather(consume(), _neighbour())
        await asyncio.gather(_handler_gather(x), _neighbour())

    with capture(sample_every=1, cold_calls=0, max_window_s=60.0, top_k=50) as cap:
        asyncio.run(main())
    by_label = {c.label: c for c in cap.calls}
    for label, tanh, mm in (("stream_gather", 4, 2), ("handler_gather", 2, 1)):
        call = by_label[label]
        assert call.attribution == "task"
        rows = {r.name: r.count for r in call.root.ops}
        assert (tanh, mm) == (rows.get("aten::tanh"), rows.get("aten::mm"))
        assert not {name for name in rows if "softmax" in name}
        tokenize = [s for s in call.scopes if s.label == "tokenize"]
        assert [1] * tanh == [{r.name: r.count for r in s.ops}.get("aten::tanh") for s in tokenize]


@profkit.profiled("sibling_child")
async def _sibling_child(x: torch.Tensor) -> None:
    for _ in range(4):
        torch.mm(x, x)
        await asyncio.sleep(0)


@profkit.profiled("sibling_nested")
async def _sibling_nested(x: torch.Tensor) -> None:
    for _ in range(4):
        torch.relu(x)
        await asyncio.sleep(0)


@profkit.profiled("sibling_root")
async def _sibling_root(x: torch.Tensor) -> None:
    child = asyncio.create_task(_sibling_child(x))
    await _sibling_nested(x)
    await child


@pytest.mark.timeout(60)
def test_a_child_tasks_ops_are_not_credited_to_a_scope_of_the_root_task() -> None:
    """The root starts a child task (matmuls) and awaits a nested coroutine in its own task
    (relu only): the nested scope's ops are the root task's, not the child task's."""
    x = torch.ones(32, 32)
    with capture(sample_every=1, cold_calls=0) as cap:
        asyncio.run(_sibling_root(x))
    (call,) = cap.calls
    ops = {s.label: {r.name for r in s.ops if r.name.startswith("aten::")} for s in call.scopes}
    assert "aten::relu" in ops["sibling_nested"]
    assert "aten::mm" not in ops["sibling_nested"], ops
    assert {"aten::mm", "aten::relu"} <= ops["sibling_root"]
    assert "aten::mm" in ops["sibling_child"]
    assert "aten::relu" not in ops["sibling_child"]


@profkit.profiled("nested_loop_fetch")
async def _nested_loop_fetch(x: torch.Tensor) -> int:
    torch.tanh(x)
    return 1


@profkit.profiled("nested_loop_stream")
def _nested_loop_stream(x: torch.Tensor) -> Iterator[int]:
    for _ in range(2):
        torch.relu(x)
        asyncio.run(_nested_loop_fetch(x))  # a loop of its own, inside the generator's step
        torch.mm(x, x)
        yield 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("all_threads", [False, True], ids=["thread", "all_threads"])
def test_a_generator_step_that_runs_a_loop_keeps_its_ops_after_it(all_threads: bool) -> None:
    """A coroutine's steps nested inside the generator's step: the step's ops after
    ``asyncio.run`` are still the generator's (intervals that nest are merged)."""
    x = torch.ones(32, 32)
    with capture(sample_every=1, cold_calls=0, all_threads=all_threads) as cap:
        assert [1, 1] == list(_nested_loop_stream(x))
    (call,) = [c for c in cap.calls if c.label == "nested_loop_stream"]
    ops = {s.label: {r.name for r in s.ops if r.name.startswith("aten::")} for s in call.scopes}
    assert {"aten::relu", "aten::tanh", "aten::mm"} <= ops["nested_loop_stream"], ops
    assert "aten::mm" not in ops["nested_loop_fetch"]


@profkit.profiled("loop_window")
async def _loop_window() -> float:
    await asyncio.sleep(0)
    return float(torch.ones(4).sum())


@profkit.profiled("loop_window_sync")
def _loop_window_sync() -> float:
    return float(torch.ones(4).sum())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("root", ["coroutine", "sync", "region"])
def test_a_window_waiting_on_an_event_loop_is_cut_at_max_window_s(root: str) -> None:
    """``window=3`` opened on an event loop's thread (by a coroutine, or by a plain function
    or a region called from one): the loop then runs only unlabelled work, so no profkit
    call comes on that thread to cut the window at ``max_window_s``. The loop is asked to (a
    timer): the profiler stops, the call is exported. (The sync and region cases had no
    timer: recorded on.)"""

    async def main() -> bool:
        if root == "coroutine":
            assert 4.0 == await _loop_window()
        elif root == "sync":
            assert 4.0 == _loop_window_sync()
        else:
            with profkit.region("loop_window_region"):
                assert 4.0 == float(torch.ones(4).sum())
        x = torch.ones(8)
        for _ in range(60):  # 0.6 s of unlabelled work, past max_window_s
            x = x.add(1)
            await asyncio.sleep(0.01)
        return bool(torch.autograd.profiler._is_profiler_enabled)

    with capture(sample_every=1, cold_calls=0, window=3, max_window_s=0.2) as cap:
        assert asyncio.run(main()) is False  # stopped while the loop still ran
        assert profkit.force_flush(30.0)
    assert 1 == cap.stats["exported"]


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("swallow_internal_errors")
def test_a_loop_that_refuses_the_timer_breaks_no_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop whose ``call_later`` raises: the call returns its result, the error is counted,
    and the window is still cut at the thread's next profkit call past ``max_window_s``."""

    loop_class = asyncio.BaseEventLoop  # (where every loop of asyncio's has call_later)
    call_later = loop_class.call_later

    def refuse(self: Any, delay: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
        if callback is checkpoint:
            raise RuntimeError("no timers here")
        return call_later(self, delay, callback, *args, **kwargs)

    monkeypatch.setattr(loop_class, "call_later", refuse)

    async def main() -> bool:
        assert 4.0 == _loop_window_sync()
        await asyncio.sleep(0.3)
        left_on = bool(torch.autograd.profiler._is_profiler_enabled)  # no timer: still on
        monkeypatch.undo()
        with profkit.region("loop_window_next"):  # a checkpoint past max_window_s: cut
            pass  # (and a window of its own opens)
        return left_on

    with capture(sample_every=1, cold_calls=0, window=3, max_window_s=0.2) as cap:
        assert asyncio.run(main()) is True
        assert profkit.force_flush(30.0)
    assert cap.stats["error_reasons"].get("loop_timer") == 1
    assert [c.label for c in cap.calls] == ["loop_window_sync", "loop_window_next"]


def _profiler_on_here() -> bool:
    """Whether a profiler records this thread (torch's own per-thread state, not the flag)."""
    return bool(torch._C._autograd._profiler_enabled())


@profkit.profiled("loop_long_await")
async def _long_await() -> float:
    y = float(torch.ones(4).sum())
    await asyncio.sleep(1.5)  # a backend's answer, long past max_window_s
    return y


@pytest.mark.timeout(60)
def test_a_single_call_window_awaiting_long_is_cut_by_the_loop_timer() -> None:
    """``window=1``: the sampled coroutine awaits for long while its loop runs only
    unlabelled work; the timer cuts it at ``max_window_s``, not at the call's end."""

    async def probe() -> bool:
        await asyncio.sleep(0.6)
        return _profiler_on_here()

    async def main() -> tuple[float, bool]:
        result, on = await asyncio.gather(_long_await(), probe())
        return result, on

    with capture(sample_every=1, cold_calls=0, max_window_s=0.2) as cap:
        assert asyncio.run(main()) == (4.0, False)
        assert profkit.force_flush(30.0)
    assert [(c.label, c.truncated) for c in cap.calls] == [("loop_long_await", "max_window_s")]


@profkit.profiled("loop_window_ends")
async def _loop_window_ends() -> float:
    return float(torch.ones(4).sum())


@pytest.mark.timeout(60)
def test_a_waiting_window_whose_loop_ends_is_closed_with_it() -> None:
    """``window=5``: two calls, then ``asyncio.run`` returns. Its timer went with the loop;
    the window is closed as the loop goes, not left recording the thread's later work."""

    async def main() -> None:
        for _ in range(2):
            assert 4.0 == await _loop_window_ends()

    with capture(sample_every=1, cold_calls=0, window=5, max_window_s=0.2) as cap:
        asyncio.run(main())
        assert not _profiler_on_here()
        assert SLOT.held is None
        assert profkit.force_flush(30.0)
    assert [(c.label, c.truncated) for c in cap.calls] == [("loop_window_ends", None)] * 2


@profkit.profiled("loop_stream")
async def _loop_stream() -> Any:
    for _ in range(5):
        yield float(torch.ones(4).sum())
        await asyncio.sleep(0)


@pytest.mark.timeout(60)
def test_an_async_generator_dropped_on_another_thread_stops_nothing_there() -> None:
    """A sampled async generator left mid-iteration and dropped on another thread: its
    thread-local window is not stopped there (torch would stop nothing, and the loop's
    thread would record on); the loop's thread stops it."""
    import gc
    import threading

    held: list[Any] = []

    async def main() -> None:
        stream = _loop_stream()
        assert 4.0 == await stream.__anext__()
        held.append(stream)  # left mid-iteration, never closed
        dropper = threading.Thread(target=held.clear)
        dropper.start()
        dropper.join()
        await asyncio.sleep(0.4)  # the loop runs on, past max_window_s
        assert not _profiler_on_here()

    with capture(sample_every=1, cold_calls=0, max_window_s=0.2) as cap:
        gc.disable()  # (the drop is what ends the stream, not a collection here)
        try:
            asyncio.run(main())
        finally:
            gc.enable()
        assert not _profiler_on_here()
        assert profkit.force_flush(30.0)
    assert [c.label for c in cap.calls] == ["loop_stream"]
    assert cap.calls[0].scopes[0].ops  # recorded, and stopped on its thread: read


def test_a_loop_without_weak_references_still_gets_its_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A running "loop" object that takes no weak reference (a custom loop with slots): its
    timer is asked for, and no error is counted for the end it cannot be watched for."""
    from profkit._capture import loops

    class SlotLoop:
        __slots__ = ("timers",)

        def __init__(self) -> None:
            self.timers: list[float] = []

        def call_later(self, delay: float, callback: Any) -> None:
            self.timers.append(delay)

    loop = SlotLoop()
    monkeypatch.setattr(loops, "_get_running_loop", lambda: loop)
    with capture(sample_every=1, cold_calls=0, max_window_s=0.2) as cap:
        assert 4.0 == _loop_window_sync()
        assert profkit.force_flush(10.0)
    assert len(loop.timers) == 1
    assert 0 < loop.timers[0] <= 0.25
    assert cap.stats["error_reasons"] == {}
