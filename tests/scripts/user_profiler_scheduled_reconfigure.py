"""configure() with new profiler settings while the application's scheduled profiler sits in
its warmup step (prepared, not started).

A session whose profiler settings are new to the process primes the profiler (a throwaway
start and stop) as it starts; over a prepared profiler that leaves torch without a session
for the application's start at its next ``step()``: SIGSEGV. Exit 0 and the application's
trace with its events mean it was left alone.
"""

from __future__ import annotations

import torch
from _fresh import f, report
from torch.profiler import profile, schedule

import profkit

settings = {"sample_every": 1, "cold_calls": 0, "max_per_minute": None, "exporters": ()}
profkit.configure(**settings)  # type: ignore[arg-type]
traces: list[int] = []
prof = profile(
    schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
    on_trace_ready=lambda p: traces.append(len(p.events())),
)
prof.start()  # the warmup step: prepared, not started
profkit.configure(all_threads=True, **settings)  # type: ignore[arg-type]
prof.step()  # the application's profiler starts
torch.ones(3).add_(1)
prof.step()
prof.stop()
result = f()
report(traces=traces, result=result)
profkit.shutdown()
