"""The overhead gauge, ``stats()["overhead"]``, against profkit's share measured independently.

Three cases (issue 38, case 5), each the same load with and without profkit, alternated in
short chunks of calls (a chunk of the bare model call, a chunk of the ``@profiled`` one; the
machine's state hits both alike), each chunk's process CPU time read around it (every
thread: the callers', the export worker's, the exporters'), the worker flushed at the end of
each profiled chunk (inside it: else a window's export runs in the next bare chunk):

* ``pool``: 8 pool threads running ~1 ms model calls one after another beside 2 CPU hogs,
  ``sample_every=1, max_overhead=0.01`` (the budget decides what is sampled);
* ``pool, nothing sampled``: the same with ``sample_every=10**9`` (after each label's first
  call nothing is sampled: what is left is the off-sample path, the decisions);
* ``hidden budget``: one thread, a quiet machine, ``sample_every=1, max_overhead=0.02``.

Measured independently: ``(CPU of the profiled chunks - CPU of the bare ones) / CPU of all
chunks``, profkit's share of a process half of whose calls run under it; beside it what
profkit charged itself over the same interval, over the process's CPU (what the gauge
computes over its trailing 10 s), and ``stats()["overhead"]`` itself at the end.

Target: the charged share within 0.5 points of the measured one, never negative.

    .venv/bin/python bench/gauge.py [--seconds S] [--case pool|idle|hidden] [--json]
"""

from __future__ import annotations

import os

# one intra-op thread on every thread (see bench/budget_load.py)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from _util import quiet_exporter_settings
from budget import _steps as _model_call
from budget import _steps_for_1ms

import profkit
from profkit._global import get_session

CASES: dict[str, dict[str, Any]] = {
    "pool": {"threads": 8, "hogs": 2, "sample_every": 1, "max_overhead": 0.01},
    "idle": {"threads": 8, "hogs": 2, "sample_every": 10**9, "max_overhead": 0.01},
    "hidden": {"threads": 0, "hogs": 0, "sample_every": 1, "max_overhead": 0.02},
}
NAMES = {"pool": "pool", "idle": "pool, nothing sampled", "hidden": "hidden budget"}
AGREE_POINTS = 0.005


def _chunk(
    pool: ThreadPoolExecutor | None, fn: Callable[[], None], calls: int, flush: bool = False
) -> float:
    """Process CPU seconds for ``calls`` calls of ``fn`` (on the pool's threads in turn);
    ``flush``: the export worker flushed inside it (else the export of a profiled chunk's
    windows runs in the next bare chunk, and counts against profkit twice over)."""
    t0 = time.process_time()
    if pool is None:
        for _ in range(calls):
            fn()
    else:
        for f in [pool.submit(fn) for _ in range(calls)]:
            f.result()
    if flush:
        profkit.force_flush(10.0)
    return time.process_time() - t0


def measure(case: str, seconds: float) -> dict[str, Any]:
    spec = CASES[case]
    torch.set_num_threads(1)
    steps = _steps_for_1ms()
    bare = _model_call(steps)
    profiled = profkit.profiled("predict")(_model_call(steps))
    chunk = 40
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(spec["hogs"])
    ]
    pool = ThreadPoolExecutor(spec["threads"]) if spec["threads"] else None
    try:
        profkit.configure(
            sample_every=spec["sample_every"],
            max_overhead=spec["max_overhead"],
            max_per_minute=None,
            **quiet_exporter_settings(),
        )
        session = get_session()
        assert session is not None
        for _ in range(3):  # every pool thread, the first windows, the caches
            _chunk(pool, bare, chunk)
            _chunk(pool, profiled, chunk)
        profkit.force_flush(10.0)
        cpu0, spent0 = time.process_time(), session.stats.cpu.spent
        plain = timed = 0.0
        rounds = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            plain += _chunk(pool, bare, chunk)
            timed += _chunk(pool, profiled, chunk, flush=True)
            rounds += 1
        flush0 = time.process_time()
        gauge = profkit.stats()["overhead"]
        profkit.force_flush(10.0)
        timed += time.process_time() - flush0  # the flush exports profiled calls' windows
        cpu = time.process_time() - cpu0
        spent = session.stats.cpu.spent - spent0
        snap = profkit.stats()
    finally:
        for hog in hogs:
            hog.kill()
        if pool is not None:
            pool.shutdown()
        profkit.shutdown(5.0)
    measured = (timed - plain) / (timed + plain)
    charged = spent / cpu
    return {
        "case": NAMES[case],
        "rounds": rounds,
        "calls_each": rounds * chunk,
        "bare_ms_per_call": plain / (rounds * chunk) * 1000,
        "measured_share": measured,
        "charged_share": charged,
        "gauge": gauge,
        "points_off": abs(charged - measured),
        "ok": abs(charged - measured) <= AGREE_POINTS and gauge >= 0,
        "sampled": snap["sampled"],
        "skipped_budget": snap["skipped_budget"],
    }


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| case | calls each | bare ms/call | profkit's share, measured | as charged (same "
        "interval) | stats()['overhead'] | points off | sampled | skipped_budget |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['calls_each']} | {r['bare_ms_per_call']:.3f} "
            f"| {r['measured_share']:.2%} | {r['charged_share']:.2%} | {r['gauge']:.2%} "
            f"| {r['points_off'] * 100:.2f} | {r['sampled']} | {r['skipped_budget']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds of chunks per case")
    ap.add_argument("--case", choices=sorted(CASES), action="append")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [measure(case, args.seconds) for case in args.case or ("pool", "idle", "hidden")]
    print(json.dumps(rows, indent=2) if args.json else render(rows))


if __name__ == "__main__":
    main()
