"""asyncio: a sampled coroutine's summary holds only the ops that ran while its task ran."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

import profkit
from profkit.testing import capture

BURSTS = 5


@profkit.profiled("mm_task")
async def mm_task(x: torch.Tensor) -> int:
    """Two matmuls per burst, yielding to the loop between bursts."""
    for _ in range(BURSTS):
        torch.mm(x, x)
        torch.mm(x, x)
        await asyncio.sleep(0)
    return 1


@profkit.profiled("softmax_task")
async def softmax_task(x: torch.Tensor) -> int:
    """Two softmaxes per burst, yielding to the loop between bursts."""
    for _ in range(BURSTS):
        async with profkit.region("softmax_stage"):
            torch.softmax(x, dim=1)
            await asyncio.sleep(0)
            torch.softmax(x, dim=1)
        await asyncio.sleep(0)
    return 2


def _rows(scope: profkit.ScopeSummary) -> dict[str, int]:
    return {row.name: row.count for row in scope.ops}


def _check_own_ops_only(call: profkit.CallSummary) -> None:
    """Exactly its own ops; a window cut short (it says why) holds the first of them only."""
    rows = _rows(call.root)
    full = call.truncated is None
    if call.label == "mm_task":
        assert rows["aten::mm"] == 2 * BURSTS if full else rows["aten::mm"] <= 2 * BURSTS
        assert set() == {name for name in rows if "softmax" in name}
    else:
        softmax = rows.get("aten::softmax", 0)
        assert softmax == 2 * BURSTS if full else softmax <= 2 * BURSTS
        assert "aten::mm" not in rows
        for stage in call.scopes[1:] if full else ():
            assert 2 == _rows(stage)["aten::softmax"]
            assert "aten::mm" not in _rows(stage)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sampled_first", ["mm_task", "softmax_task"])
def test_interleaved_tasks_sampled_one_holds_only_its_own_ops(sampled_first: str) -> None:
    """Two tasks interleave on one loop; the sampled one (first root call) lacks the other's ops."""
    first, second = (
        (mm_task, softmax_task) if sampled_first == "mm_task" else (softmax_task, mm_task)
    )

    async def main() -> list[int]:
        x = torch.full((8, 8), 0.01)
        return list(await asyncio.gather(first(x), second(x)))

    with capture(sample_every=1000, top_k=50) as cap:
        # the sampler counts per label: the second task's label spends its pick first
        asyncio.run(second(torch.full((8, 8), 0.01)))
        results = asyncio.run(main())
    assert ([1, 2] if sampled_first == "mm_task" else [2, 1]) == results
    assert 2 == len(cap.calls)
    call = cap.calls[1]
    assert sampled_first == call.label
    assert call.attribution == "task"
    _check_own_ops_only(call)
    assert 2 == cap.stats["sampled"]
    assert 1 == cap.stats["unsampled"]


@pytest.mark.timeout(60)
def test_sampled_coroutine_span_says_task_attribution() -> None:
    """The span of a sampled coroutine call carries profkit.attribution = "task"."""
    with capture(sample_every=1) as cap:
        assert 1 == asyncio.run(mm_task(torch.ones(4, 4)))
    (root,) = [s for s in cap.spans() if s.name == "mm_task"]
    assert root.attributes is not None
    assert root.attributes["profkit.attribution"] == "task"


@pytest.mark.timeout(120)
def test_fifty_concurrent_tasks_every_sample_holds_only_its_own_ops() -> None:
    """50 staggered tasks per round, 1-in-3 sampled: each exported call has only its own ops."""

    async def client(i: int, x: torch.Tensor) -> int:
        for _ in range(i % 9):  # stagger starts so windows open and close all through the round
            await asyncio.sleep(0)
        return await (mm_task(x) if i % 2 == 0 else softmax_task(x))

    async def round_() -> list[int]:
        x = torch.full((8, 8), 0.01)
        return list(await asyncio.gather(*(client(i, x) for i in range(50))))

    # max_window_s far past a round's length: on a busy machine the wall clock would cut
    # windows short (truncated "max_window_s"), which is not what this test is about
    with capture(sample_every=3, top_k=50, max_window_s=60.0) as cap:
        for _ in range(4):
            assert [1 if i % 2 == 0 else 2 for i in range(50)] == asyncio.run(round_())
    stats = cap.stats
    assert 200 == stats["root_calls"]
    # ceil(100 / 3) picks of each label's 100 calls, every decision counted once: sampled, or
    # refused before a window opened (on a busy machine the export queue can fill)
    refused = stats["skipped_backlog"] + stats["skipped_budget"] + stats["skipped_rate_limit"]
    assert 2 * 34 == stats["sampled"] + refused
    assert stats["sampled"] == (
        stats["exported"] + stats["dropped"] + stats["skipped_busy"] + stats["skipped_foreign"]
    )
    assert len(cap.calls) == stats["exported"]
    assert {"mm_task", "softmax_task"} == {call.label for call in cap.calls}
    assert sum(call.truncated is None for call in cap.calls) >= len(cap.calls) // 2
    for call in cap.calls:
        assert call.attribution == "task"
        _check_own_ops_only(call)


def test_a_region_across_a_yield_of_a_decorated_async_generator_left_with_break() -> None:
    """``async with region()`` held across a ``yield`` in a ``@profiled`` async generator
    whose first call is cold (unsampled), left with ``break`` by a long-lived task: the
    generator's frame is set only while it steps, so the task's later calls are root calls
    still, never nested in a region whose exit runs in the event loop's finalizer task (an
    undecorated async generator leaves the task's frame "unsampled" for good: see
    docs/reliability.md, asyncio)."""

    @profkit.profiled("stream")
    async def stream() -> object:
        async with profkit.region("chunk"):
            for i in range(10):
                yield i

    @profkit.profiled("handle")
    async def handle() -> int:
        await asyncio.sleep(0)
        return 1

    async def main() -> int:
        async for x in stream():
            if x == 1:
                break
        await asyncio.sleep(0.01)  # the loop's finalizer closes the abandoned generator
        return sum([await handle() for _ in range(6)])

    with capture(sample_every=2, cold_calls=1) as cap:
        assert 6 == asyncio.run(main())
    assert 7 == cap.stats["root_calls"]  # the stream's, and each of the task's calls
    assert "stream" not in [c.label for c in cap.calls]  # cold
    assert 1 <= [c.label for c in cap.calls].count("handle")


def test_a_worker_task_started_by_an_unsampled_handler_makes_root_calls_once_it_returned() -> None:
    """A batcher task started lazily inside an unsampled async handler copies its context;
    once the handler has returned, the task's regions and batches (offloaded with
    ``asyncio.to_thread``, which copies it again) are root calls, sampled by their labels."""

    def forward(members: list[profkit.BatchMember]) -> None:
        with profkit.batch("forward", members):
            torch.ones(4).add_(1)

    async def batcher(go: asyncio.Event) -> None:
        await go.wait()
        for _ in range(2):
            with profkit.region("step"):
                pass
            await asyncio.to_thread(forward, [profkit.batch_member()])

    @profkit.profiled("handler")
    async def handler(go: asyncio.Event) -> asyncio.Task[None]:
        return asyncio.create_task(batcher(go))  # its first request starts the batcher

    async def main() -> None:
        go = asyncio.Event()
        task = await handler(go)  # the label's first call is cold: unsampled
        go.set()
        await task

    with capture(sample_every=10**9, cold_calls=1) as cap:
        asyncio.run(main())
    # each label's first call is cold, its second the sampler's pick
    assert (5, ["step", "forward"]) == (cap.stats["root_calls"], [c.label for c in cap.calls])


class _Injected(Exception):
    """A signal handler's exception (a request timeout)."""


def _raise_injected(signum: int, frame: Any) -> None:
    raise _Injected(signum)


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs SIGALRM")
@pytest.mark.parametrize("metrics", [False, True])
def test_a_signal_anywhere_in_an_unsampled_coroutine_root_leaves_its_tasks_root_calls(
    metrics: bool,
) -> None:
    """A signal's exception at any point of profkit's code in an unsampled coroutine root
    (``metrics``: a timed one) that started a task: once the root is over, the task's
    regions are root calls still (the root's frame is marked done on every way out)."""
    created: list[asyncio.Task[None]] = []

    async def worker(go: asyncio.Event) -> None:
        await go.wait()
        with profkit.region("step"):
            pass

    @profkit.profiled("handler")
    async def handler(go: asyncio.Event) -> None:
        created.append(asyncio.create_task(worker(go)))

    def injector(k: int, seen: list[int]) -> Callable[..., None]:
        def profile(frame: Any, event: str, arg: Any) -> None:
            if event in ("call", "c_return") and "profkit" in frame.f_code.co_filename:
                seen[0] += 1
                if seen[0] == k:
                    signal.getsignal(signal.SIGALRM)(signal.SIGALRM, frame)  # type: ignore[operator]

        return profile

    async def main() -> list[int]:
        for _ in range(2):  # the label's first calls (its own answers made, then warm)
            go = asyncio.Event()
            await handler(go)
            go.set()
            await created.pop()
        left_nested = []
        k = 0
        while True:
            k += 1
            go, seen = asyncio.Event(), [0]
            created.clear()
            sys.setprofile(injector(k, seen))
            try:
                await handler(go)
            except _Injected:
                pass
            finally:
                sys.setprofile(None)
            if seen[0] < k:
                return left_nested
            if not created:  # cut short before the task was made
                continue
            before = profkit.stats()["root_calls"]
            go.set()
            await created[0]
            if profkit.stats()["root_calls"] != before + 1:
                left_nested.append(k)

    previous = signal.signal(signal.SIGALRM, _raise_injected)
    try:
        with capture(sample_every=10**9, cold_calls=0, metrics=metrics):
            assert [] == asyncio.run(main())
    finally:
        signal.signal(signal.SIGALRM, previous)
