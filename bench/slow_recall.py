"""Recall and precision of slow-call capture on four workloads (imported by bench/slow.py).

Each workload is a seeded plan of calls, each one slow or not, and a handler:

* ``bimodal``: ~1 ms of torch, one call in 10 also sleeps 40 ms (a slow dependency);
* ``input size``: torch compute whose input is 8x larger in one call in 10;
* ``drift``: a sleep that drifts from 1 to 3 ms over the run, one call in 10 ten times the
  current one;
* ``rare``: ~1 ms of torch, one call in 40 also sleeps 30 ms.

Each runs with the label's own p95 and with an explicit ``slow_ms`` (between the fast and
the slow durations, measured unprofiled first), with no budget and at
``max_overhead=0.02``, on one thread, on 8 threads of a pool, and as 32 concurrent asyncio
tasks. Recall: the slow calls kept as slow over the slow calls; precision: the slow calls
over the calls kept.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

import profkit
from profkit.testing import CaptureExporter

Plan = list[tuple[bool, float]]  # (slow, parameter: ms to sleep, or rows)

WORKLOADS = ("bimodal", "input size", "drift", "rare")
MODES = ("one thread", "8 threads", "32 asyncio tasks")


def plan_of(workload: str, calls: int) -> Plan:
    rng = random.Random(21)
    out: Plan = []
    for i in range(calls):
        if workload == "rare":
            slow = rng.random() < 1 / 40
            out.append((slow, 30.0 if slow else 0.0))
        elif workload == "drift":
            slow = rng.random() < 0.1
            base = 1.0 + 2.0 * i / calls
            out.append((slow, base * (10.0 if slow else 1.0)))
        elif workload == "input size":
            slow = rng.random() < 0.1
            out.append((slow, 512.0 if slow else 64.0))
        else:
            slow = rng.random() < 0.1
            out.append((slow, 40.0 if slow else 0.0))
    return out


class Handler:
    """One workload's handler, sync and async (the same work)."""

    def __init__(self, workload: str) -> None:
        torch.manual_seed(0)
        self.workload = workload
        self.model = torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)
        ).eval()
        self.small = torch.randn(32, 256)
        self.big = {64: torch.randn(64, 256), 512: torch.randn(512, 256)}
        self.sync = profkit.profiled(workload)(self._sync)
        self.aio = profkit.profiled(workload)(self._aio)

    def _compute(self, param: float) -> None:
        with torch.inference_mode():
            if self.workload == "input size":
                self.model(self.big[int(param)])
            elif self.workload != "drift":
                self.model(self.small)

    def _sync(self, i: int, slow: bool, param: float) -> int:
        with profkit.region("work", slow=slow):
            self._compute(param)
            if self.workload != "input size" and param:
                time.sleep(param / 1e3)
        return i

    async def _aio(self, i: int, slow: bool, param: float) -> int:
        with profkit.region("work", slow=slow):
            self._compute(param)
            if self.workload != "input size" and param:
                await asyncio.sleep(param / 1e3)
        return i


def calibrate(handler: Handler, plan: Plan) -> float:
    """slow_ms: the geometric mean of the fast calls' median late in the plan and the slow
    calls' median early in it (drift moves both), measured unprofiled: a fixed line between."""
    quarter = max(8, len(plan) // 4)
    fast = [_took(handler, i, s, p) for i, (s, p) in enumerate(plan[-quarter:]) if not s]
    slow = [_took(handler, i, s, p) for i, (s, p) in enumerate(plan[: 2 * quarter]) if s]
    hi = statistics.median(fast)
    lo = statistics.median(slow) if slow else 10.0 * hi
    return math.sqrt(hi * lo)


def _took(handler: Handler, i: int, slow: bool, param: float) -> float:
    t0 = time.perf_counter()
    handler._sync(i, slow, param)
    return (time.perf_counter() - t0) * 1e3


def run(handler: Handler, plan: Plan, mode: str) -> None:
    if mode == "one thread":
        for i, (slow, param) in enumerate(plan):
            handler.sync(i, slow, param)
    elif mode == "8 threads":
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda a: handler.sync(a[0], *a[1]), enumerate(plan)))
    else:
        asyncio.run(_tasks(handler, plan))


async def _tasks(handler: Handler, plan: Plan) -> None:
    gate = asyncio.Semaphore(32)

    async def one(i: int, slow: bool, param: float) -> None:
        async with gate:
            await handler.aio(i, slow, param)

    await asyncio.gather(*(one(i, s, p) for i, (s, p) in enumerate(plan)))


def measure_one(workload: str, mode: str, settings: dict[str, Any], calls: int) -> dict[str, Any]:
    handler = Handler(workload)
    plan = plan_of(workload, calls)
    slow_ms = calibrate(handler, plan) if settings.pop("slow_ms", False) else None
    cap = CaptureExporter()
    profkit.configure(
        exporters=(),
        extra_exporters=(cap,),
        sample_rate=0.0,  # nothing but capture_slow opens a window
        capture_slow=True,
        max_per_minute=None,
        slow_ms=slow_ms,
        **settings,
    )
    run(handler, plan, mode)
    profkit.force_flush(30.0)
    profkit.shutdown(10.0)
    kept = [c for c in cap.calls if c.policy == "slow"]
    caught = sum(bool(c.scopes[1].attributes["slow"]) for c in kept)
    total = sum(s for s, _ in plan)
    return {
        "workload": workload,
        "mode": mode,
        "slow_ms": slow_ms,
        "budget": settings.get("max_overhead"),
        "slow_calls": total,
        "kept": len(kept),
        "recall": caught / total if total else 0.0,
        "precision": caught / len(kept) if kept else 0.0,
    }


def measure(quick: bool) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    calls = 160 if quick else 480
    rows = []
    modes = MODES[:1] if quick else MODES
    for workload in WORKLOADS:
        for mode in modes:
            for explicit in (False, True):
                for budget in (None, 0.02):
                    if quick and budget is not None:
                        continue
                    settings: dict[str, Any] = {"slow_ms": explicit}
                    if budget is not None:
                        settings["max_overhead"] = budget
                    rows.append(measure_one(workload, mode, settings, calls))
    return rows


def render(rows: list[dict[str, Any]], fmt: Callable[[float | None], str] | None = None) -> str:
    lines = [
        "| workload | run on | threshold | budget | slow calls | kept | recall | precision |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        threshold = f"slow_ms={r['slow_ms']:.1f}" if r["slow_ms"] else "p95"
        budget = f"max_overhead={r['budget']}" if r["budget"] else "none"
        lines.append(
            f"| {r['workload']} | {r['mode']} | {threshold} | {budget} | {r['slow_calls']} "
            f"| {r['kept']} | {r['recall']:.2f} | {r['precision']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Run a subset: ``bench/slow_recall.py [--workload W] [--mode M] [--calls N]
    [--explicit] [--budget B] [--repeat K]`` (rows as markdown)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--workload", choices=WORKLOADS, action="append")
    ap.add_argument("--mode", choices=MODES, action="append")
    ap.add_argument("--calls", type=int, default=480)
    ap.add_argument("--explicit", action="store_true", help="an explicit slow_ms")
    ap.add_argument("--budget", type=float, default=None, help="max_overhead")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for workload in args.workload or WORKLOADS:
        for mode in args.mode or MODES:
            for _ in range(args.repeat):
                settings: dict[str, Any] = {"slow_ms": args.explicit}
                if args.budget is not None:
                    settings["max_overhead"] = args.budget
                rows.append(measure_one(workload, mode, settings, args.calls))
    print(render(rows))


if __name__ == "__main__":
    main()
