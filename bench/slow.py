"""What slow-call capture (``capture_slow``) costs, and how many of the slow calls it finds.

A handler of about 2 ms of CPU on one thread (Linear 256-1024-256 on 64 rows, twice);
about one call in 20 runs the forward twenty times instead (a slow request, ~10x). The same
seeded sequence of calls runs under each variant, interleaved in rounds, and each round is
charged with the process's CPU time (``time.process_time``: the request thread, the export
worker and the exporters) per call, the worker flushed inside the round:

* ``capture_slow off``: ``sample_every=10**9`` (after its first call, nothing is profiled);
* ``capture_slow on, no cap``: speculative windows back to back (``max_overhead=1.0``):
  the most it can cost;
* ``capture_slow on, max_overhead=0.02``: the same, within a 2% CPU budget.

Each variant's row says what share of the slow calls was exported with policy "slow"
(recall) and what share of those exported were slow ones (precision). A second table
(``bench/slow_recall.py``) measures recall and precision on four workloads (bimodal sleep,
input-size-dependent compute, gradual drift, 1-in-40 rare slow calls), with the label's p95
and with an explicit ``slow_ms``, with no budget and at ``max_overhead=0.02``, on one
thread, 8 pool threads and 32 asyncio tasks.

    .venv/bin/python bench/slow.py [--quick] [--json]
"""

from __future__ import annotations

import random
import time
from typing import Any

import slow_recall
import torch
from _util import emit, fmt_spread, machine, parse_args, seeded_mlp, spread

import profkit
from profkit.testing import CaptureExporter

VARIANTS: dict[str, dict[str, Any]] = {
    "capture_slow off": {"sample_every": 10**9},
    "capture_slow on, no cap": {
        "sample_every": 10**9,
        "capture_slow": True,
        "max_per_minute": None,
        "max_overhead": 1.0,  # (none set: speculation stops at 1% of the CPU)
    },
    "capture_slow on, max_overhead=0.02": {
        "sample_every": 10**9,
        "capture_slow": True,
        "max_per_minute": None,
        "max_overhead": 0.02,
    },
}


def _handler() -> Any:
    model, batch = seeded_mlp((256, 1024, 256), rows=64)

    @profkit.profiled("predict")
    def predict(slow: bool) -> torch.Tensor:
        with profkit.region("forward", slow=slow), torch.inference_mode():
            out = model(batch)
            for _ in range(19 if slow else 1):
                out = model(batch)
        return out

    return predict


def measure(quick: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    rounds, calls = (2, 100) if quick else (7, 600)
    predict = _handler()
    rng = random.Random(20)
    plan = [rng.random() < 0.05 for _ in range(calls)]
    per_call: dict[str, list[float]] = {v: [] for v in VARIANTS}
    found: dict[str, list[tuple[int, int, int]]] = {v: [] for v in VARIANTS}
    stats_of: dict[str, dict[str, int]] = {v: {} for v in VARIANTS}
    order = list(VARIANTS)
    for _ in range(rounds):
        random.Random(len(per_call[order[0]])).shuffle(order)
        for name in order:
            cap = CaptureExporter()
            profkit.configure(exporters=(), extra_exporters=(cap,), **VARIANTS[name])
            predict(False)  # the counter's first call: the random sample, out of the round
            profkit.force_flush(10.0)
            c0 = time.process_time()
            for slow in plan:
                predict(slow)
            profkit.force_flush(10.0)
            per_call[name].append((time.process_time() - c0) / calls * 1e3)
            kept = [c for c in cap.calls if c.policy == "slow"]
            caught = sum(bool(c.scopes[1].attributes["slow"]) for c in kept)
            found[name].append((sum(plan), len(kept), caught))
            st = profkit.stats()
            for key in ("speculative", "speculative_released", "windows"):
                stats_of[name][key] = stats_of[name].get(key, 0) + st[key]
            profkit.shutdown(5.0)
    base = spread(per_call["capture_slow off"]).median
    rows = []
    for name in VARIANTS:
        slow_total = sum(f[0] for f in found[name])
        kept = sum(f[1] for f in found[name])
        caught = sum(f[2] for f in found[name])
        cpu = spread(per_call[name])
        rows.append(
            {
                "variant": name,
                "cpu_ms_per_call": cpu,
                "vs_off": cpu.median / base,
                "windows": stats_of[name]["windows"] - rounds,  # less each round's first call
                "speculative": stats_of[name]["speculative"],
                "released": stats_of[name]["speculative_released"],
                "slow_calls": slow_total,
                "kept": kept,
                "recall": caught / slow_total if slow_total else 0.0,
                "precision": caught / kept if kept else 0.0,
            }
        )
    return {
        "section": "slow",
        "machine": machine(),
        "rounds": rounds,
        "calls": calls,
        "rows": rows,
        "recall": slow_recall.measure(quick),
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"slow-call capture: {result['rounds']} interleaved rounds x {result['calls']} calls "
        "(~2 ms handler, about 1 call in 20 ten times slower)",
        "| variant | process CPU ms per call, median [IQR] | vs off | windows | speculative "
        "calls / released | slow calls / kept as slow | recall | precision |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['variant']} | {fmt_spread(r['cpu_ms_per_call'], 3)} | {r['vs_off']:.3f} "
            f"| {r['windows']} | {r['speculative']} / {r['released']} "
            f"| {r['slow_calls']} / {r['kept']} | {r['recall']:.2f} | {r['precision']:.2f} |"
        )
    if result.get("recall"):
        lines += [
            "",
            "recall and precision on four workloads (bench/slow_recall.py):",
            slow_recall.render(result["recall"]),
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    args = parse_args(__doc__ or "")
    emit(measure(args.quick), args.json, render)
