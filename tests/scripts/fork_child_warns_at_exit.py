"""A child forked after a profiler ran in its parent ends with ``sys.exit(0)``.

Without profkit's at-fork exit hook (glibc's ``on_exit``) the child hangs in kineto's teardown
(torch upstream), and profkit warns at its exit: the parent kills it after 10 s and reports
None.
"""

import os
import sys

from _fresh import f, reap, report

import profkit

profkit.configure(sample_every=1, exporters=())  # warms the profiler up: kineto starts
f()
pid = os.fork()
if pid == 0:
    f()
    sys.exit(0)
report(child=reap(pid, 10.0))
