"""The pre-fork pattern: configure in the child (a gunicorn post_fork hook), sample, exit.

The child must end through a normal interpreter exit (``sys.exit``), which is where torch's
kineto teardown is at stake; the parent reaps it within a deadline.
"""

import os
import sys

from _fresh import f, reap, report

import profkit
from profkit.testing import CaptureExporter

pid = os.fork()
if pid == 0:
    cap = CaptureExporter()
    profkit.configure(sample_every=1, exporters=(), extra_exporters=(cap,))
    results = [f() for _ in range(3)]
    profkit.shutdown(10.0)
    ok = results == [6.0] * 3 and len(cap.calls) == 3
    sys.exit(0 if ok else 3)
report(child=reap(pid, 60))
