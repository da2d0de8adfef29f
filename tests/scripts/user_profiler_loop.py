"""Defect #20.1: the application's own short torch.profiler sessions beside profkit's windows.

A request thread makes sampled root calls (``every``: sample_every=2; ``slow``:
capture_slow=True) while the main thread runs 40 short profiles of its own. Two profilers
at once crash the process (SIGSEGV); exit 0 means none overlapped.

Usage: python user_profiler_loop.py every|slow [PROFILES]
"""

from __future__ import annotations

import sys
import threading

import torch

import profkit

MODE = sys.argv[1]
PROFILES = int(sys.argv[2]) if len(sys.argv) > 2 else 40
settings = (
    {"sample_every": 2}
    if MODE == "every"
    else {"capture_slow": True, "slow_ms": 0.01, "max_overhead": 1.0}
)
profkit.configure(exporters=(), max_per_minute=None, **settings)

x = torch.randn(16, 16)


@profkit.profiled("handler")
def handler() -> float:
    with profkit.region("inner"):
        return float((x @ x).relu().sum())


stop = threading.Event()


def serve() -> None:
    while not stop.is_set():
        handler()


server = threading.Thread(target=serve, name="requests")
server.start()
try:
    for _ in range(PROFILES):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            (x @ x).sum()
finally:
    stop.set()
    server.join()
print("OK", profkit.stats()["windows"], flush=True)
profkit.shutdown()
