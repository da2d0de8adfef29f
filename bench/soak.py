"""Soak: many root calls on a small MLP at 1-in-N sampling, printing the RSS curve.

Run from the repository root::

    .venv/bin/python bench/soak.py                      # 20,000 calls at 1-in-20
    .venv/bin/python bench/soak.py --calls 3000 --json  # what tests/test_soak.py runs

Every sampled call goes the whole way: profiler window, summary, diagnosis, OTel spans
(through a TracerProvider whose exporter only counts them) and structlog events (rendered to
JSON and thrown away). At each checkpoint the queue is flushed, so RSS is measured with no
window pending. Growth is measured from the end of the warm-up (the first ``--warmup``
calls, which load torch's profiler machinery and fill allocator caches) to the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import psutil
import structlog
import torch
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import profkit
from profkit._global import get_session

MB = 1024 * 1024


class CountingSpanExporter(SpanExporter):
    """Counts spans and keeps none of them."""

    def __init__(self) -> None:
        self.count = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.count += len(spans)
        return SpanExportResult.SUCCESS


class CountingExporter:
    """A profkit exporter that counts calls and keeps nothing."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def export(self, summary: profkit.WindowSummary) -> None:
        self.calls += len(summary.calls)


def rss() -> int:
    return int(psutil.Process(os.getpid()).memory_info().rss)


def soak(calls: int, every: int, warmup: int, checkpoints: int) -> dict[str, Any]:
    """Run the soak; returns counts and the RSS curve as (calls done, RSS bytes) pairs."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    ).eval()
    batch = torch.randn(32, 64)
    spans = CountingSpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    logger = structlog.wrap_logger(
        structlog.ReturnLogger(), processors=[structlog.processors.JSONRenderer()]
    )
    counting = CountingExporter()
    profkit.configure(
        sample_every=every,
        max_per_minute=None,  # every sampled call is a window: the soak counts on it
        exporters=("otel", "log"),
        tracer_provider=provider,
        logger=logger,
        extra_exporters=(counting,),
    )
    session = get_session()

    @profkit.profiled("predict")
    def predict(x: torch.Tensor) -> torch.Tensor:
        with profkit.region("forward"), torch.inference_mode():
            return model(x)

    step = max(1, calls // checkpoints)
    # back-pressure, as a steady service gets from its clients: the loop waits for the
    # worker before the queue fills, so every sampled call is a window (--every 1 made
    # 434 windows of 2,000 calls: the rest were skipped_backlog)
    pace = max(1, every * (profkit.get_config().queue_size // 2))
    curve: list[tuple[int, int]] = [(0, rss())]
    t0 = time.perf_counter()
    for i in range(1, calls + 1):
        predict(batch)
        if i % step == 0 or i in (calls, warmup):
            session.force_flush(30.0)
            curve.append((i, rss()))
        elif i % pace == 0:
            session.force_flush(30.0)
    seconds = time.perf_counter() - t0
    session.force_flush(30.0)
    stats = profkit.stats()
    profkit.shutdown(10.0)
    base = next(r for n, r in curve if n >= warmup)
    after = [r for n, r in curve if n >= warmup]
    return {
        "calls": calls,
        "every": every,
        "warmup_calls": warmup,
        "seconds": round(seconds, 2),
        "root_calls": stats["root_calls"],
        "sampled": stats["sampled"],
        "exported": stats["exported"],
        "dropped": stats["dropped"],
        "dropped_reasons": stats["dropped_reasons"],
        "errors": stats["errors"],
        "windows": stats["windows"],
        "skipped_backlog": stats["skipped_backlog"],
        "summaries": counting.calls,
        "spans": spans.count,
        "rss_start_mb": round(curve[0][1] / MB, 1),
        "rss_after_warmup_mb": round(base / MB, 1),
        "rss_end_mb": round(curve[-1][1] / MB, 1),
        "rss_max_after_warmup_mb": round(max(after) / MB, 1),
        "growth_after_warmup_mb": round((curve[-1][1] - base) / MB, 2),
        "curve": [(n, round(r / MB, 1)) for n, r in curve],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=None, help="default: calls // 5")
    parser.add_argument("--checkpoints", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    warmup = args.warmup if args.warmup is not None else args.calls // 5
    result = soak(args.calls, args.every, warmup, args.checkpoints)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{'calls':>8} {'RSS MB':>8}")
    for n, mb in result["curve"]:
        print(f"{n:>8} {mb:>8.1f}" + ("  <- end of warm-up" if n == warmup else ""))
    for key, value in result.items():
        if key != "curve":
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
