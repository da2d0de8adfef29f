"""The budget on a loaded machine: sampled calls on a pool thread beside two CPU hogs.

A sync server runs each request on a pool thread (FastAPI's sync endpoints, a thread-pool
gRPC server); here a ``ThreadPoolExecutor`` of 4 threads runs ~1 ms model calls (the MLP,
forwarded as many times as make about 1 ms of CPU on a quiet core) one after another while
two busy processes compete for the cores. profkit: ``sample_every=1, max_overhead=0.01``,
exporters otel + log into sinks that do the work and discard it.

The same load with and without profkit, alternated in short chunks of calls (a chunk of the
bare model, a chunk of the ``@profiled`` one, ...; the machine's state hits both alike), each
chunk's process CPU time (every thread: the pool's, the export worker's, the exporters')
read around it, the worker flushed at the end. Measured independently:

    share = (CPU of the profiled chunks - CPU of the bare chunks) / CPU of all chunks

over the same number of calls of each, which is what profkit's CPU share of a process half
of whose calls are profiled is. Beside it, what profkit says: the CPU it charged itself over
the same interval, over the process's (what ``stats()["overhead"]`` computes over its
trailing 10 s), and ``stats()["overhead"]`` itself at the end.

Targets (issue 22): the measured share at most 1.5%, and profkit's own figure within 0.5
points of it.

    .venv/bin/python bench/budget_load.py [--quick] [--json]
"""

from __future__ import annotations

import os

# one intra-op thread on every thread: ``torch.set_num_threads`` sets it for the calling
# thread only, and a pool thread's own OpenMP team spin-waits between ops, which doubles the
# process's CPU time per call on any machine (and swamps a 1% effect beside busy neighbours)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _util import emit, machine, parse_args, quiet_exporter_settings
from budget import _steps as _model_call  # the same ~1 ms model call as bench/budget.py
from budget import _steps_for_1ms

import profkit
from profkit._global import get_session

BUDGET = 0.01
SHARE_LIMIT = 0.015
AGREE_POINTS = 0.005
HOGS = 2
POOL = 4


def _chunk(pool: ThreadPoolExecutor, fn: Callable[[], None], calls: int) -> float:
    """Process CPU seconds for ``calls`` calls of ``fn``, each on a pool thread in turn."""
    t0 = time.process_time()
    for _ in range(calls):
        pool.submit(fn).result()
    return time.process_time() - t0


def measure(quick: bool) -> dict[str, Any]:
    seconds, chunk = (6.0, 20) if quick else (30.0, 40)
    steps = _steps_for_1ms()
    bare = _model_call(steps)
    profiled = profkit.profiled("predict")(_model_call(steps))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(HOGS)]
    try:
        profkit.configure(
            sample_every=1,
            max_overhead=BUDGET,
            max_per_minute=None,
            **quiet_exporter_settings(),
        )
        session = get_session()
        assert session is not None
        with ThreadPoolExecutor(POOL) as pool:
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
                timed += _chunk(pool, profiled, chunk)
                rounds += 1
            flush0 = time.process_time()
            overhead_now = profkit.stats()["overhead"]
            profkit.force_flush(10.0)
            timed += time.process_time() - flush0  # the flush exports profiled calls' windows
            cpu = time.process_time() - cpu0
            spent = session.stats.cpu.spent - spent0
        snap = profkit.stats()
    finally:
        for hog in hogs:
            hog.kill()
        profkit.shutdown(5.0)
    measured = (timed - plain) / (timed + plain)
    charged = spent / cpu
    return {
        "section": "budget_load",
        "machine": machine(),
        "steps": steps,
        "rounds": rounds,
        "chunk": chunk,
        "calls_each": rounds * chunk,
        "bare_ms_per_call": plain / (rounds * chunk) * 1000,
        "profiled_ms_per_call": timed / (rounds * chunk) * 1000,
        "measured_share": measured,
        "charged_share": charged,
        "stats_overhead": overhead_now,
        "stats": {
            key: snap[key] for key in ("root_calls", "sampled", "skipped_budget", "exported")
        },
        "targets": {
            "budget_load_measured_share": {
                "value": measured,
                "limit": SHARE_LIMIT,
                "ok": measured <= SHARE_LIMIT,
            },
            "budget_load_agreement_points": {
                "value": abs(charged - measured),
                "limit": AGREE_POINTS,
                "ok": abs(charged - measured) <= AGREE_POINTS,
            },
        },
    }


def render(result: dict[str, Any]) -> str:
    s = result["stats"]
    return "\n".join(
        [
            f"budget on a loaded machine: {HOGS} CPU hogs, a pool of {POOL} threads, "
            f"~1 ms calls ({result['steps']} MLP forwards), sample_every=1, "
            f"max_overhead={BUDGET}; {result['rounds']} rounds of {result['chunk']} bare + "
            f"{result['chunk']} profiled calls",
            "| bare ms/call | profiled ms/call | profkit's share, measured | profkit's share, "
            "as charged (same interval) | stats()['overhead'] at the end | sampled "
            "| skipped_budget |",
            "|---|---|---|---|---|---|---|",
            f"| {result['bare_ms_per_call']:.3f} | {result['profiled_ms_per_call']:.3f} "
            f"| {result['measured_share'] * 100:.2f}% | {result['charged_share'] * 100:.2f}% "
            f"| {result['stats_overhead'] * 100:.2f}% | {s['sampled']} | {s['skipped_budget']} |",
        ]
    )


if __name__ == "__main__":
    args = parse_args(__doc__ or "")
    emit(measure(args.quick), args.json, render)
