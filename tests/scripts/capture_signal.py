"""Defect #20.5: ``testing.capture(trigger_signal=...)`` installs the handler and puts back
the previous one on exit. Without a handler the first SIGUSR1 ends the process (-10)."""

from __future__ import annotations

import json
import os
import signal

import torch

import profkit
from profkit.testing import capture


@profkit.profiled("f")
def f() -> float:
    return float(torch.ones(3).add_(1).sum())


with capture(sample_every=10**9, trigger_signal="SIGUSR1") as cap:
    for _ in range(3):
        f()
    profkit.force_flush()
    before = len(cap.calls)  # (a 1-in-N sampler may take the very first call)
    os.kill(os.getpid(), signal.SIGUSR1)  # default action: the process ends (-10)
    for _ in range(3):
        f()
    profkit.force_flush()
    after = len(cap.calls)
restored = signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
out = {"triggered": after - before, "restored": restored}
print("REPORT " + json.dumps(out), flush=True)
