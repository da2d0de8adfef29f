"""Shared benchmark helpers: interleaved timing, robust statistics, machine facts, JSON output.

Every section script in ``bench/`` can run alone (it prints its own table) or under
``bench/run.py``, which starts it in a fresh interpreter with ``--json`` and collects the
result. A shared 2-core machine is noisy, so comparisons are made *within one round*
(variants interleaved, in a shuffled order) and summarised over rounds by the median and
the interquartile range.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "Spread",
    "batch_ns",
    "diffs",
    "emit",
    "interleaved",
    "machine",
    "parse_args",
    "spread",
]


class Spread(dict[str, float]):
    """median, q1, q3, min, max and n of a sample (a dict, so it serialises as JSON)."""

    @property
    def median(self) -> float:
        return self["median"]


def spread(values: Sequence[float]) -> Spread:
    """Median and interquartile range of ``values`` (needs at least one value)."""
    data = sorted(values)
    if len(data) >= 4:
        q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive")
    else:
        q1, q3 = data[0], data[-1]
    return Spread(
        median=statistics.median(data),
        q1=q1,
        q3=q3,
        min=data[0],
        max=data[-1],
        n=float(len(data)),
    )


def batch_ns(fn: Callable[[Any], Any], arg: Any, n: int) -> float:
    """Mean CPU ns per call of ``fn(arg)`` over one batch of ``n`` calls (loop included).

    The clock is this thread's CPU time, not the wall clock: on a shared machine a batch that
    is preempted by another process would otherwise be charged for the time it did not run.
    """
    clock = time.thread_time_ns
    t0 = clock()
    for _ in range(n):
        fn(arg)
    return (clock() - t0) / n


def interleaved(
    batches: dict[str, Callable[[int], float]],
    *,
    rounds: int,
    n: int,
    seed: int = 0,
) -> dict[str, list[float]]:
    """Run every batch function once per round, in a shuffled order.

    Each ``batches[name](n)`` runs ``n`` calls and returns ns per call; the result maps each
    name to its per-round values, so callers compare variants round by round.
    """
    rng = random.Random(seed)
    names = list(batches)
    out: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm every code path (and the CPU caches) before measuring
        batches[name](max(1, n // 10))
    for _ in range(rounds):
        rng.shuffle(names)
        for name in names:
            out[name].append(batches[name](n))
    return out


def diffs(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Round-by-round ``a - b``."""
    return [x - y for x, y in zip(a, b, strict=True)]


def machine() -> dict[str, Any]:
    """The facts a reader needs to compare numbers: CPU, cores, Python, torch, load."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    from importlib.metadata import version

    return {
        "cpu": cpu,
        "cores": os.cpu_count() or 0,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "wrapt": version("wrapt"),
        "profkit": version("profkit"),
        "os": f"{platform.system()} {platform.release()}",
        "loadavg_1m": round(load[0], 2),
    }


def parse_args(description: str) -> argparse.Namespace:
    """The flags every section script takes: ``--quick`` and ``--json``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="few, short rounds (smoke test)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return parser.parse_args()


def emit(result: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], str]) -> None:
    """Print the section's result: JSON for ``run.py``, a table for a person."""
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        sys.stdout.write(render(result) + "\n")
    sys.stdout.flush()


def quiet_exporter_settings() -> dict[str, Any]:
    """``configure()`` settings for exporters that do real work but print nothing.

    Spans go through an SDK ``TracerProvider`` and a ``BatchSpanProcessor`` into an
    in-memory exporter that is cleared as it fills; log events through a structlog logger
    whose processors run and whose output is discarded.
    """
    import structlog
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    class _Sink(InMemorySpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            result = super().export(spans)
            if len(self.get_finished_spans()) > 10_000:
                self.clear()
            return result

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Sink()))
    logger = structlog.wrap_logger(
        structlog.ReturnLogger(),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.JSONRenderer(),
        ],
    )
    return {"exporters": ("otel", "log"), "tracer_provider": provider, "logger": logger}


def fmt_spread(s: dict[str, float], digits: int = 2) -> str:
    """A spread as "median [q1-q3]" for the tables."""
    return f"{s['median']:.{digits}f} [{s['q1']:.{digits}f}-{s['q3']:.{digits}f}]"


def seeded_mlp(sizes: tuple[int, int, int] = (64, 128, 10), rows: int = 32) -> tuple[Any, Any]:
    """The benchmarks' MLP (Linear, ReLU, Linear; eval) and a batch, on one thread.

    By default the small one (64 -> 128 -> 10, a 32 x 64 batch). Seeded, so every process
    and both trees of ``compare.py`` measure the same numbers.
    """
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    d_in, hidden, d_out = sizes
    model = torch.nn.Sequential(
        torch.nn.Linear(d_in, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, d_out)
    ).eval()
    return model, torch.randn(rows, d_in)
