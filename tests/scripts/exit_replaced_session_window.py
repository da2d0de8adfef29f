"""configure() again with a window half full on this thread: the old session exports it."""

import torch
from _fresh import f, report

import profkit
from profkit.testing import CaptureExporter

cap = CaptureExporter()
profkit.configure(sample_every=1, window=3, exporters=(), extra_exporters=(cap,))
old = profkit._global.get_session()
assert old is not None
results = [f(), f()]
profkit.configure(sample_every=1000, exporters=())
flushed = old.shutdown(10.0)
report(
    results=results,
    flushed=flushed,
    calls=len(cap.calls),
    stats=old.stats.snapshot(),
    flag=torch.autograd.profiler._is_profiler_enabled,
)
