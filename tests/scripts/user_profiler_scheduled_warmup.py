"""The application's scheduled torch.profiler sits in its warmup step for seconds.

``torch.profiler.profile(schedule=...)`` prepares the profiler at its warmup step and starts
it only at the next ``step()``: in a service that steps once per request, that can be
seconds later. Sampled root calls meanwhile (on this thread, then on another) must open no
window over the prepared profiler: a window started then stopped over it leaves torch
without a session for the application's start, and the process dies with SIGSEGV. After
the application's profile ends, profkit samples again.

Usage: python user_profiler_scheduled_warmup.py SECONDS (how long the warmup lasts)
"""

from __future__ import annotations

import sys
import threading
import time

from _fresh import f, report
from torch.profiler import profile, schedule

import profkit
from profkit.testing import CaptureExporter

SECONDS = float(sys.argv[1])
exporter = CaptureExporter()
profkit.configure(
    sample_every=1, cold_calls=0, max_per_minute=None, exporters=(), extra_exporters=[exporter]
)
traces: list[int] = []
prof = profile(
    schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
    on_trace_ready=lambda p: traces.append(len(p.events())),
)
prof.start()  # the warmup step: prepared, not started
time.sleep(SECONDS)
during = [f() for _ in range(2)]
worker = threading.Thread(target=lambda: during.extend(f() for _ in range(2)))
worker.start()
worker.join()
prof.step()  # the active step: the application's profiler starts
f()
prof.step()  # its trace is ready
prof.stop()
before = profkit.stats()
after = [f() for _ in range(2)]
flushed = profkit.force_flush(10.0)
report(
    results=during + after,
    traces=traces,
    skipped_foreign=before["skipped_foreign"],
    exported=profkit.stats()["exported"],
    calls=len(exporter.calls),
    flushed=flushed,
)
profkit.shutdown()
