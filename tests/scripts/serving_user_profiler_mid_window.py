"""The user's torch profiler starts while profkit's window is open on another thread.

``long_call`` counts its steps (each one a checkpoint, then 5 ms asleep); the report says how
many it had done when the user asked for a profiler, when that profiler started and in all.
Steps, not seconds: on a busy machine both threads slow down alike.
"""

import threading
import time

import torch
from _fresh import report

import profkit
from profkit.testing import CaptureExporter

STEPS = 400
cap = CaptureExporter()
profkit.configure(sample_every=1, exporters=(), extra_exporters=(cap,))
inside = threading.Event()
steps = [0]


@profkit.profiled("long")
def long_call() -> None:
    inside.set()
    for _ in range(STEPS):  # about 2 s, with a checkpoint per step
        with profkit.region("step"):
            torch.ones(32, 32).mm(torch.ones(32, 32))
        steps[0] += 1
        time.sleep(0.005)


worker = threading.Thread(target=long_call)
worker.start()
assert inside.wait(30)
time.sleep(0.05)
requested_at_step = steps[0]
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    started_at_step = steps[0]
    torch.ones(8, 8).add_(1)
names = [e.name for e in prof.events()]
worker.join()
profkit.force_flush(20)
report(
    requested_at_step=requested_at_step,
    started_at_step=started_at_step,
    steps=steps[0],
    user_ops=names.count("aten::add_"),
    truncated=[c.truncated for c in cap.calls],
    stats=profkit.stats(),
)
