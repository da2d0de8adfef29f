"""A daemon thread holds an idle all-threads window when the interpreter exits."""

import threading
import time

import torch
from _fresh import f, report

import profkit

profkit.configure(sample_every=1, window=3, all_threads=True, exporters=())
session = profkit._global.get_session()
assert session is not None
started = threading.Event()


def serve() -> None:
    f()
    f()
    started.set()
    time.sleep(600)


threading.Thread(target=serve, daemon=True).start()
assert started.wait(60)
report(stats=session.stats.snapshot(), flag=torch.autograd.profiler._is_profiler_enabled)
