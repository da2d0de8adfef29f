"""Defect #20.2: a speculative window left on an idle pool thread when traffic pauses.

capture_slow: labelled calls on a one-thread pool, then a pause. Reports (JSON on stdout)
whether a profiler is still on during the pause, the RSS growth of unlabelled torch work on
that thread, and how long the application's own profiler took to start (or its error).
"""

from __future__ import annotations

import json
import resource
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.autograd.profiler as autograd_profiler

import profkit
from profkit._capture import slot as _slot

profkit.configure(
    capture_slow=True, slow_ms=1000.0, exporters=(), max_per_minute=None, max_overhead=1.0
)
x = torch.randn(64, 64)


@profkit.profiled("handler")
def handler() -> float:
    return float((x @ x).sum())


def unlabelled() -> None:
    for _ in range(20_000):
        (x + 1).relu_()


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


pool = ThreadPoolExecutor(1)
calls = 0
for calls in range(1, 401):  # noqa: B007  # until a window is left open when a call ends
    pool.submit(handler).result()
    if _slot.SLOT.held is not None:
        break
enabled = bool(autograd_profiler._is_profiler_enabled)
before = rss_mb()
pool.submit(unlabelled).result()  # the excluded /healthz route, a background job
grown = rss_mb() - before
t0 = time.monotonic()
error = None
try:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        (x @ x).sum()
except RuntimeError as exc:
    error = str(exc)
started_s = time.monotonic() - t0
out = {"calls": calls, "enabled": enabled, "rss_mb": grown, "start_s": started_s, "error": error}
print("REPORT " + json.dumps(out), flush=True)
pool.shutdown()
profkit.shutdown()
