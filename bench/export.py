"""The export pipeline: windows summarised and exported per second, and a full queue that drops.

Part 1, throughput. Real windows are recorded through profkit's own request path (a
``@profiled`` call with ``sample_every=1``), but instead of going to the worker each stopped
window is kept; then the worker's steps are timed on this thread, one window at a time:

* ``summarise``: profkit reads the events (its raw kineto reader for CPU-only profiles) and
  builds the per-call scope trees, op tables and diagnosis;
* ``export``: the OTel span exporter (SDK ``TracerProvider`` + ``BatchSpanProcessor``) and
  the structlog event exporter, as configured in production;
* ``torch parse``, for reference only: what ``prof.events()`` would have cost on the same
  window (torch's ``FunctionEvent`` parser, which profkit uses for memory and device
  profiles), timed after the pipeline.

``windows/s = 1 / (summarise + export)`` for windows of about 1k and 10k events.

Part 2, back-pressure. An exporter that takes 50 ms per window and a queue of 2: a burst of
sampled calls must not wait for the worker. The table shows the calls' latency next to the
plain sampled-call latency, and the counters: windows dropped with reason ``queue_full``.

    .venv/bin/python bench/export.py [--quick] [--json]
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from _util import emit, fmt_spread, machine, parse_args, quiet_exporter_settings, spread
from torch.profiler import ProfilerActivity, profile

import profkit
from profkit._global import get_session
from profkit._session import Session

SLOW_EXPORT_S = 0.05


def _ops(n_ops: int) -> torch.Tensor:
    y = torch.zeros(4)
    o = torch.ones(4)
    with torch.inference_mode():
        for _ in range(n_ops // 5):
            y = y.add(o)
            y = y.mul(o)
            y = torch.relu(y)
            y = y.sub(o)
            y = y.abs()
    return y


handler = profkit.profiled("handler")(_ops)


def _events_per_op() -> float:
    _ops(100)
    prof = profile(activities=[ProfilerActivity.CPU])
    prof.start()
    _ops(1000)
    prof.stop()
    return len(prof.profiler.kineto_results.events()) / 1000  # type: ignore[union-attr]


def _record_windows(n_ops: int, count: int) -> tuple[Session, list[Any]]:
    """Windows recorded by the real request path, held back from the worker."""
    profkit.configure(sample_every=1, max_events=50_000, **quiet_exporter_settings())
    session = get_session()
    assert session is not None
    kept: list[Any] = []
    session.pipeline.offer = kept.append  # type: ignore[method-assign]
    for _ in range(count):
        handler(n_ops)
    return session, kept


def _time_windows(session: Session, windows: list[Any]) -> dict[str, Any]:
    processor, fanout = session.pipeline.processor, session.pipeline.fanout
    parse, summarise, export, events = [], [], [], []
    for win in windows:
        t1 = time.perf_counter()
        summary = processor.summarise(win)
        t2 = time.perf_counter()
        delivered, failure = (0, summary) if isinstance(summary, str) else fanout.export(summary)
        t3 = time.perf_counter()
        if isinstance(summary, str) or delivered < len(summary.calls):
            raise RuntimeError(f"window not exported: {failure}")
        win.prof.events()  # reference: torch's own parser on the same window
        t4 = time.perf_counter()
        parse.append(t4 - t3)
        summarise.append(t2 - t1)
        export.append(t3 - t2)
        events.append(summary.events_total)
        win.prof = None
    total = [a + b for a, b in zip(summarise, export, strict=True)]
    return {
        "events": int(statistics.median(events)),
        "parse_ms": spread([t * 1000 for t in parse]),
        "summarise_ms": spread([t * 1000 for t in summarise]),
        "export_ms": spread([t * 1000 for t in export]),
        "total_ms": spread([t * 1000 for t in total]),
        "windows_per_s": 1 / statistics.median(total),
    }


class _SlowExporter:
    name = "slow"

    def export(self, summary: Any) -> None:
        time.sleep(SLOW_EXPORT_S)


def _back_pressure(calls: int) -> dict[str, Any]:
    profkit.configure(
        sample_every=1, queue_size=2, exporters=(), extra_exporters=(_SlowExporter(),)
    )
    x = 200
    handler(x)
    profkit.force_flush(10.0)
    latencies = []
    t_burst = time.perf_counter()
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        handler(x)
        latencies.append((time.perf_counter_ns() - t0) / 1e6)
    burst_s = time.perf_counter() - t_burst
    profkit.force_flush(30.0)
    stats = profkit.stats()
    profkit.shutdown(5.0)
    return {
        "calls": calls,
        "burst_s": burst_s,
        "latency_ms": spread(latencies),
        "exported": stats["exported"] - 1,
        "dropped_queue_full": stats["dropped_reasons"].get("queue_full", 0),
        "dropped": stats["dropped"],
        "worker_could_export": burst_s / SLOW_EXPORT_S,
    }


def measure(quick: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    per_op = _events_per_op()
    sizes = (1_000, 10_000)
    counts = {1_000: 3 if quick else 15, 10_000: 1 if quick else 4}
    rows = {}
    for size in sizes:
        session, windows = _record_windows(round(size / per_op), counts[size])
        rows[f"{size // 1000}k"] = _time_windows(session, windows)
        profkit.shutdown(5.0)
    bp = _back_pressure(20 if quick else 100)
    return {
        "section": "export",
        "machine": machine(),
        "rows": rows,
        "back_pressure": bp,
        "targets": {
            "queue_full_drops_counted": {
                "value": bp["dropped_queue_full"],
                "limit": 1,
                "ok": bp["dropped_queue_full"] >= 1
                and bp["exported"] + bp["dropped"] == bp["calls"],
            },
        },
    }


def _f(s: dict[str, float]) -> str:
    return fmt_spread(s, 2)


def render(result: dict[str, Any]) -> str:
    lines = [
        "export pipeline, per window (ms: median [IQR])",
        "| window | events | profkit summarise (incl. reading events) | export (otel + log) "
        "| total | windows/s | torch's prof.events() on the same window (reference) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in result["rows"].items():
        lines.append(
            f"| {name} | {r['events']} | {_f(r['summarise_ms'])} | {_f(r['export_ms'])} "
            f"| {_f(r['total_ms'])} | {r['windows_per_s']:.1f} | {_f(r['parse_ms'])} |"
        )
    bp = result["back_pressure"]
    lines += [
        "",
        f"back-pressure: {bp['calls']} sampled calls in {bp['burst_s'] * 1000:.0f} ms, "
        f"exporter {SLOW_EXPORT_S * 1000:.0f} ms per window, queue_size=2",
        "| call latency ms (median [IQR], max) | exported | dropped (queue_full) |",
        "|---|---|---|",
        f"| {_f(bp['latency_ms'])}, max {bp['latency_ms']['max']:.3f} | {bp['exported']} "
        f"| {bp['dropped']} ({bp['dropped_queue_full']}) |",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    args = parse_args(__doc__ or "")
    emit(measure(args.quick), args.json, render)
