"""An all-threads window still open when its thread ends: closed there and exported."""

import threading

import torch
from _fresh import f, report

import profkit
from profkit.testing import CaptureExporter

cap = CaptureExporter()
profkit.configure(sample_every=1, window=3, all_threads=True, exporters=(), extra_exporters=(cap,))
session = profkit._global.get_session()
assert session is not None
worker = threading.Thread(target=lambda: (f(), f()))
worker.start()
worker.join()
flushed = profkit.force_flush(10.0)
report(
    flushed=flushed,
    calls=len(cap.calls),
    stats=session.stats.snapshot(),
    flag=torch.autograd.profiler._is_profiler_enabled,
)
