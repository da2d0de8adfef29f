"""A thread end that profkit did not see: the stranded all-threads profiler is stopped."""

import threading

import torch
from _fresh import f, report

import profkit

profkit._capture.keeper._ThreadEndGuard.__del__ = lambda self: None  # type: ignore[method-assign]
profkit.configure(sample_every=1, window=3, all_threads=True, exporters=())
session = profkit._global.get_session()
assert session is not None
worker = threading.Thread(target=lambda: (f(), f()))
worker.start()
worker.join()
session.close_idle_window()
report(stats=session.stats.snapshot(), flag=torch.autograd.profiler._is_profiler_enabled)
