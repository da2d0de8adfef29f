"""Threads that end with a window still open (``window`` > 1): it closes on that thread."""

import threading

from _fresh import f, report

import profkit
from profkit.testing import CaptureExporter

cap = CaptureExporter()
profkit.configure(sample_every=1, window=3, exporters=(), extra_exporters=(cap,))
session = profkit._global.get_session()
assert session is not None
for _ in range(6):  # one thread per "request", two calls each: each window ends open
    worker = threading.Thread(target=lambda: (f(), f()))
    worker.start()
    worker.join()
flushed = profkit.force_flush(10.0)
report(
    flushed=flushed,
    calls=len(cap.calls),
    stats=session.stats.snapshot(),
    threads=sorted(t.name for t in threading.enumerate()),
)
