"""Slow-call capture under concurrency and on a busy machine (issue 21, "Done when" 3).

* 32 tasks on one event loop: a speculative window takes the loop's calls while one of its
  calls runs, so the slow calls (which start while others are in flight) are recorded and
  kept; before, a window of 16 calls drained for the length of its slowest one while every
  call that started meanwhile ran timed, and the calls that end a crowded window (its slow
  ones, one after another) raised the bar for each other (recall 0.04-0.11).
* A call's wait for a CPU is not its slowness: on a busy machine a profiler's start holds
  the call's thread a scheduler tick (4 ms) off a CPU, the commonest false "slow" call of a
  one-thread service (precision 0.30 on the 1-in-40 workload of bench/slow_recall.py).

Margins are wide: the machine running the tests is busy.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import torch
from _load import CpuWait

import profkit
from profkit._label import scope as _scope
from profkit._targeting import slow as _slow
from profkit._targeting import verdict as _verdict
from profkit.testing import capture


def test_slow_calls_of_concurrent_tasks_on_one_loop_are_kept(
    one_thread: None, cpu_wait: CpuWait
) -> None:
    """32 concurrent tasks, 1 call in 10 waiting 40 ms on a dependency, the others ~0.3 ms
    of torch: most slow calls are kept, and the calls kept are slow ones (the recall floors
    where the loop's thread got its CPU: see ``CpuWait``)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)
    ).eval()
    batch = torch.randn(32, 256)
    rng = random.Random(21)
    plan = [rng.random() < 0.1 for _ in range(480)]

    @profkit.profiled("handle")
    async def handle(i: int, slow: bool) -> int:
        with profkit.region("work", call=i, slow=slow):
            with torch.inference_mode():
                model(batch)
            if slow:
                await asyncio.sleep(0.04)
        return i

    async def serve() -> list[int]:
        gate = asyncio.Semaphore(32)

        async def one(i: int, slow: bool) -> int:
            async with gate:
                return await handle(i, slow)

        return await asyncio.gather(*(one(i, s) for i, s in enumerate(plan)))

    with capture(sample_every=10**9, capture_slow=True, max_per_minute=None, exporters=()) as cap:
        assert asyncio.run(serve()) == list(range(len(plan)))
    kept = [c for c in cap.calls if c.policy == "slow"]
    caught = [c for c in kept if c.scopes[1].attributes["slow"]]
    stats = profkit.stats()
    assert stats["speculative"] == stats["speculative_released"] + len(kept)
    cpu_wait.skip_if_busy("recall of slow calls")
    assert len(caught) >= 0.3 * sum(plan), (len(caught), sum(plan), cap.stats)
    assert len(caught) >= 0.8 * len(kept), (len(caught), len(kept))


def test_slow_calls_are_kept_when_every_task_awaits(one_thread: None, cpu_wait: CpuWait) -> None:
    """32 concurrent tasks whose every call awaits (1-2 ms on a dependency, drifting up;
    1 in 10 waits 40 ms): calls start and end at thousands a second while a slow one runs.
    A speculative window takes up to 512 of the loop's calls (128 before: it was cut short
    about 10 ms in, before most slow calls had run long enough to be judged slow: recall
    0.30-0.53 in bench/slow_recall.py's "drift" row; here 0.58-0.62, now 0.91-0.92, also
    beside two CPU hogs). 40 ms: a busy machine slows the loop's fast calls to several ms,
    and the rule's bar (up to 4x their median) with them; past a quarter of the time
    waiting for a CPU (4x oversubscribed: recall 0.04-0.4) the floors are not checked."""
    rng = random.Random(21)
    plan = []
    for i in range(480):
        slow = rng.random() < 0.1
        plan.append((slow, 40.0 if slow else 1.0 + i / 480))

    @profkit.profiled("awaits")
    async def handle(i: int, slow: bool, ms: float) -> int:
        with profkit.region("work", slow=slow):
            await asyncio.sleep(ms / 1e3)
        return i

    async def serve() -> list[int]:
        gate = asyncio.Semaphore(32)

        async def one(i: int, slow: bool, ms: float) -> int:
            async with gate:
                return await handle(i, slow, ms)

        return await asyncio.gather(*(one(i, s, ms) for i, (s, ms) in enumerate(plan)))

    with capture(sample_every=10**9, capture_slow=True, max_per_minute=None, exporters=()) as cap:
        assert asyncio.run(serve()) == list(range(len(plan)))
    kept = [c for c in cap.calls if c.policy == "slow"]
    caught = [c for c in kept if c.scopes[1].attributes["slow"]]
    slow_calls = sum(s for s, _ in plan)
    stats = profkit.stats()
    assert stats["speculative"] == stats["speculative_released"] + len(kept)
    cpu_wait.skip_if_busy("recall of slow calls")
    assert len(caught) >= 0.75 * slow_calls, (len(caught), slow_calls, cap.stats)
    assert len(caught) >= 0.9 * len(kept), (len(caught), len(kept))


def test_a_call_slow_only_by_its_wait_for_a_cpu_is_not_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two kinds of 30 ms calls among 1 ms ones: one sleeps (off a CPU, its own time), the
    other stands for a call held up waiting for a CPU (the thread's scheduler statistics
    say it waited those 30 ms more). The first kind is kept, the second hardly ever (the
    kernel's wait counter gets what the handler adds: a real wait cannot be ordered)."""
    waited = [0]

    def fake_sched(tid: int) -> tuple[int, int, int]:
        cpu, wait, slept = _slow.sched_ns(tid)  # (the real waits too: a busy machine has them)
        return (cpu, wait + waited[0], slept)

    monkeypatch.setattr(_scope, "sched_ns", fake_sched, raising=False)
    monkeypatch.setattr(_verdict, "sched_ns", fake_sched, raising=False)

    @profkit.profiled("dep")
    def handler(i: int, kind: str) -> int:
        with profkit.region("work", call=i, kind=kind):
            if kind == "fast":
                time.sleep(0.001)
            else:
                time.sleep(0.03)
                if kind == "held":
                    waited[0] += 30_000_000
        return i

    kinds = ["fast"] * 400
    for i in range(40, 400, 10):
        kinds[i] = "held" if (i // 10) % 2 else "slow"
    with capture(sample_every=10**9, capture_slow=True, max_per_minute=None, exporters=()) as cap:
        for i, kind in enumerate(kinds):
            handler(i, kind)
    slow = [c for c in cap.calls if c.policy == "slow"]
    kept = [c.scopes[1].attributes["kind"] for c in slow]
    # a held call is as slow as a fast one once its wait is taken off: kept as rarely (a
    # virtual machine's host can hold any call up for a tick; before, nearly all were kept)
    held = sum(1 for k in kinds[40:] if k == "held")
    assert kept.count("held") <= max(2, held // 6), [
        (c.scopes[1].attributes, c.duration_us, c.slow_threshold_ms) for c in slow
    ]
    assert kept.count("slow") >= 5, (kept, cap.stats)
