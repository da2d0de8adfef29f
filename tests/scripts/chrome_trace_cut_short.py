"""A trace file whose write torch cut short (a full disk; here a file-size limit, which
torch's writer ignores like ENOSPC): never moved into view, counted ``trace_file``
(tests/export/test_chrome_trace.py)."""

import os
import resource
import signal
import sys

import torch
from _fresh import report

import profkit
from profkit.testing import capture

directory = sys.argv[1]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead


@profkit.profiled("predict")
def predict(x: torch.Tensor) -> float:
    return float(torch.mm(x, x).sum())


with capture(sample_every=1, trace_dir=directory, trace_gzip=sys.argv[2] == "gzip") as cap:
    predict(torch.ones(4, 4))  # the first window: directories made, profiler primed
    profkit.force_flush(10.0)
    before = cap.stats["error_reasons"].get("trace_file", 0)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200, resource.RLIM_INFINITY))
    try:
        value = predict(torch.ones(4, 4))
        profkit.force_flush(10.0)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
report(
    value=value,
    paths=[c.trace_path is not None for c in cap.calls],
    trace_file=cap.stats["error_reasons"].get("trace_file", 0) - before,
    exported=cap.stats["exported"],
    files=len([n for n in os.listdir(directory) if n.startswith("profkit-")]),
)
