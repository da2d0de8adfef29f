"""#25: the log exporter under an unconfigured structlog (its defaults: every key on stdout):
one compact ``profkit.profile`` line per sampled call, which ``profkit report`` reads."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _fresh import report

import profkit

torch.manual_seed(0)
weight = torch.randn(128, 64)


@profkit.profiled("predict")
def predict(x: torch.Tensor) -> torch.Tensor:
    with profkit.region("forward"):
        return F.relu(F.linear(x, weight))


profkit.configure(sample_every=2, exporters=("log",))
for _ in range(10):
    predict(torch.randn(32, 64))
report(flushed=profkit.force_flush(10.0), exported=profkit.stats()["exported"])
profkit.shutdown()
