"""Exit while a sampled call runs on a daemon thread (a thread-local profiler)."""

import threading
import time

import torch
from _fresh import report

import profkit

profkit.configure(sample_every=1, exporters=())
inside = threading.Event()


@profkit.profiled("slow")
def slow() -> None:
    inside.set()
    time.sleep(600)


threading.Thread(target=slow, daemon=True).start()
assert inside.wait(60)
report(flag=torch.autograd.profiler._is_profiler_enabled)
