"""The interpreter exits with a profiler profkit started and lost track of (see
tests/capture/test_leaked_profiler.py): the exit stops it, so the process exits with 0."""

import torch
from _fresh import f, report

import profkit
from profkit._capture.window import Window

profkit.configure(sample_every=1000, cold_calls=0, exporters=())
f()
config = profkit.get_config()
assert config is not None
win = Window(10_000, config)
win.start()
win.prof = None
report(enabled=torch._C._autograd._profiler_enabled())
