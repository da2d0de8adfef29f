"""A fresh process, default settings: the first call of a label sleeps 80 ms."""

from __future__ import annotations

import time

import torch
from _fresh import report

import profkit
from profkit.testing import CaptureExporter

cap = CaptureExporter()
config = profkit.configure(exporters=(), extra_exporters=(cap,), max_per_minute=None)
first = [True]


@profkit.profiled("predict")
def predict() -> float:
    if first[0]:
        first[0] = False
        time.sleep(0.08)
    return float(torch.ones(4).sum())


for _ in range(250):
    predict()
profkit.force_flush(30.0)
report(
    samples=len(cap.calls),
    durations_ms=[c.duration_us / 1000.0 for c in cap.calls],
    cold_calls=config.cold_calls,
)
profkit.shutdown(10.0)
