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

At production settings (issue 37), ``--seconds S``: ``max_overhead=0.02``, the default
``max_per_minute`` (60), the label's own threshold, a ~2 ms torch handler whose 1 call in
40 also waits 20 ms on a dependency (``region("dependency")``), S seconds of traffic on one
thread and as 32 asyncio tasks. Chunks of ~2 s of profiled traffic alternate with the same
calls run bare (the same body, undecorated, no region), each chunk's process CPU time read
around it (every thread; the export worker flushed inside the profiled chunk), so:

* op-level recall: slow calls exported with their op rows (policy "slow") over slow calls;
* stage-level recall: slow calls exported with their regions, op rows or not (a stage
  record: ``n/a`` where this profkit has none: no ``stage`` counter in ``stats()``);
* precision: slow calls over the calls kept as slow;
* profkit's share, measured independently: (CPU of the profiled chunks - CPU of the bare
  ones) / CPU of the profiled ones; beside it, ``stats()["overhead"]`` at the end.

    .venv/bin/python bench/slow_recall.py --seconds 180     # the full run (3 min each)
    .venv/bin/python bench/slow_recall.py --seconds 30      # a short one
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
        **{"max_overhead": 1.0, **settings},  # "no budget" (none set would be 1%)
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


#: production settings (issue 37): the budget, and the rest left at their defaults
PRODUCTION: dict[str, Any] = {"max_overhead": 0.02}
#: the handler's compute, and a slow call's wait on its dependency
_COMPUTE_S, _WAIT_S, _SLOW_EVERY = 0.002, 0.020, 40
#: wall seconds of profiled traffic per chunk
_CHUNK_S = 2.0


class Production:
    """The production-settings handler: ~2 ms of torch; a slow call waits 20 ms too."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)
        ).eval()
        self.x = torch.randn(64, 256)
        with torch.inference_mode():
            self.model(self.x)
            t0 = time.perf_counter()
            for _ in range(10):
                self.model(self.x)
        self.forwards = max(1, round(_COMPUTE_S / ((time.perf_counter() - t0) / 10)))
        self.sync = profkit.profiled("handler")(self._sync)
        self.aio = profkit.profiled("handler")(self._aio)

    def _compute(self) -> None:
        with torch.inference_mode():
            for _ in range(self.forwards):
                self.model(self.x)

    def _sync(self, i: int, slow: bool) -> int:
        with profkit.region("compute", call=i, slow=slow):
            self._compute()
        if slow:
            with profkit.region("dependency"):
                time.sleep(_WAIT_S)
        return i

    async def _aio(self, i: int, slow: bool) -> int:
        with profkit.region("compute", call=i, slow=slow):
            self._compute()
        if slow:
            with profkit.region("dependency"):
                await asyncio.sleep(_WAIT_S)
        return i

    def bare_sync(self, i: int, slow: bool) -> int:
        self._compute()
        if slow:
            time.sleep(_WAIT_S)
        return i

    async def bare_aio(self, i: int, slow: bool) -> int:
        self._compute()
        if slow:
            await asyncio.sleep(_WAIT_S)
        return i


def _chunk(handler: Production, calls: list[tuple[int, bool]], mode: str, bare: bool) -> float:
    """Process CPU seconds of ``calls`` (profiled: the export worker flushed in it)."""
    t0 = time.process_time()
    if mode == "one thread":
        fn = handler.bare_sync if bare else handler.sync
        for i, slow in calls:
            fn(i, slow)
    else:
        aio = handler.bare_aio if bare else handler.aio

        async def tasks() -> None:
            gate = asyncio.Semaphore(32)

            async def one(i: int, slow: bool) -> None:
                async with gate:
                    await aio(i, slow)

            await asyncio.gather(*(one(i, s) for i, s in calls))

        asyncio.run(tasks())
    if not bare:
        profkit.force_flush(30.0)
    return time.process_time() - t0


def production(mode: str, seconds: float, default_budget: bool = False) -> dict[str, Any]:
    """One mode's row at production settings: S seconds of profiled traffic, as many calls
    bare, alternated in chunks (``default_budget``: no ``max_overhead`` set, speculation
    paid from profkit's default budget for it)."""
    handler = Production()
    rng = random.Random(37)
    cap = CaptureExporter()
    profkit.configure(exporters=(), extra_exporters=(cap,), capture_slow=True, **PRODUCTION)
    # the chunk's size in calls: as many as ~2 s of profiled traffic take (measured)
    per_call = 0.0
    t0 = time.perf_counter()
    for i in range(50):
        handler.sync(-1 - i, False)
    per_call = (time.perf_counter() - t0) / 50 + _WAIT_S / _SLOW_EVERY
    if mode != "one thread":
        per_call /= 4  # (calls overlap their waits)
    size = max(20, int(_CHUNK_S / per_call))
    plan: list[tuple[int, bool]] = []
    cpu_prof = cpu_bare = 0.0
    started = time.monotonic()
    n = 0
    while time.monotonic() - started < seconds:
        calls = [(n + k, rng.random() < 1 / _SLOW_EVERY) for k in range(size)]
        n += size
        plan += calls
        cpu_bare += _chunk(handler, calls, mode, bare=True)
        cpu_prof += _chunk(handler, calls, mode, bare=False)
    stats = profkit.stats()
    profkit.shutdown(10.0)
    slow_ids = {i for i, s in plan if s}
    kept = [c for c in cap.calls if c.policy == "slow" and c.scopes[0].label == "handler"]
    ids = [int(c.scopes[1].attributes["call"]) for c in kept if len(c.scopes) > 1]
    with_ops = {
        i for c, i in zip(kept, ids, strict=True) if any(s.ops for s in c.scopes)
    } & slow_ids
    staged: set[int] = set()
    has_stages = any("stage" in key for key in stats)
    if has_stages:  # any export of the call with its regions: op rows or a stage record
        for c in cap.calls:
            attrs = c.scopes[1].attributes if len(c.scopes) > 1 else {}
            if "call" in attrs and int(attrs["call"]) in slow_ids:
                staged.add(int(attrs["call"]))
    return {
        "mode": mode,
        "budget": "default" if default_budget else f"max_overhead={PRODUCTION['max_overhead']}",
        "seconds": seconds,
        "calls": len(plan),
        "slow_calls": len(slow_ids),
        "kept": len(kept),
        "op_recall": len(with_ops) / len(slow_ids) if slow_ids else 0.0,
        "stage_recall": len(staged) / len(slow_ids) if has_stages and slow_ids else None,
        "precision": sum(i in slow_ids for i in ids) / len(ids) if ids else 0.0,
        "share": (cpu_prof - cpu_bare) / cpu_prof if cpu_prof else 0.0,
        "gauge": stats["overhead"],
        "speculative": stats["speculative"],
        "skipped_budget": stats["skipped_budget"],
        "skipped_rate_limit": stats["skipped_rate_limit"],
    }


def render_production(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| run on | budget | seconds | calls | slow calls | kept | op-level recall "
        "| stage-level recall | precision | profkit's CPU share (measured) "
        "| stats()['overhead'] | speculative | skipped_budget | skipped_rate_limit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        stage = "n/a" if r["stage_recall"] is None else f"{r['stage_recall']:.2f}"
        lines.append(
            f"| {r['mode']} | {r['budget']} | {r['seconds']:g} | {r['calls']} "
            f"| {r['slow_calls']} | {r['kept']} "
            f"| {r['op_recall']:.2f} | {stage} | {r['precision']:.2f} | {r['share']:.2%} "
            f"| {r['gauge']:.2%} | {r['speculative']} | {r['skipped_budget']} "
            f"| {r['skipped_rate_limit']} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Production settings (issue 37): ``bench/slow_recall.py [--seconds S]`` (default 180,
    one thread and 32 asyncio tasks). Or the four workloads, a subset:
    ``[--workload W] [--mode M] [--calls N] [--explicit] [--budget B] [--repeat K]``."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--seconds", type=float, default=None, help="production settings, S s each")
    ap.add_argument(
        "--default-budget", action="store_true", help="no max_overhead: the default budget"
    )
    ap.add_argument("--workload", choices=WORKLOADS, action="append")
    ap.add_argument("--mode", choices=MODES, action="append")
    ap.add_argument("--calls", type=int, default=480)
    ap.add_argument("--explicit", action="store_true", help="an explicit slow_ms")
    ap.add_argument("--budget", type=float, default=None, help="max_overhead")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    subset = args.workload or args.mode or args.explicit or args.budget is not None
    if args.seconds is not None or not subset:
        seconds = args.seconds if args.seconds is not None else 180.0
        modes = ("one thread", "32 asyncio tasks")
        prod = [production(mode, seconds, args.default_budget) for mode in modes]
        print(render_production(prod))
        return
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
