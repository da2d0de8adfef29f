"""What a sampled call costs on the request path, and proof that summarising is not on it.

Target: profiler start + stop + hand-off at most 1.5 ms on the MLP (Linear 64-128-10, batch
32), apart from the profiler's own per-op recording cost, and no growth with ``top_k`` or
with the number of events to summarise (the worker does that).

Each round times single calls, interleaved, of the same handler (``inference_mode`` +
forward):

* ``bare``: no profkit, no profiler;
* ``recording``: inside a raw ``torch.profiler.profile`` that is already running (the per-op
  recording cost alone);
* ``raw start/stop``: ``prof.start(); handler(); prof.stop()`` (what torch itself charges);
* ``sampled``: the ``@profiled`` handler with ``sample_every=1``; the export worker is
  flushed between calls, outside the timed region, so its work cannot leak into the next
  call.

``request-path overhead = sampled - recording``: start, stop, profkit's bookkeeping and the
hand-off to the queue. ``summarise`` is the worker's time for the same window (events parsed,
summarised, diagnosed), timed on the worker; were it on the request path, the overhead would
grow by that much.

    .venv/bin/python bench/sampled.py [--quick] [--json]
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import structlog
import torch
from _util import emit, fmt_spread, machine, parse_args, spread
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from torch.profiler import ProfilerActivity, profile

import profkit
from profkit._global import get_session
from profkit._session import Session

LIMIT_MS = 1.5


def mlp() -> torch.nn.Module:
    """The MLP the tests profile: Linear 64-128, ReLU, Linear 128-10."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    ).eval()


def deep_mlp() -> torch.nn.Module:
    """Ten times the MLP's layers (30 modules), so ten times its profiler events."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(10):
        layers += [torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)]
    return torch.nn.Sequential(*layers).eval()


def _forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out: torch.Tensor = model(x)
    return out


predict = profkit.profiled("predict")(_forward)


def _time_one(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall ms, this thread's CPU ms) of one call."""
    c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
    fn()
    t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
    return (t1 - t0) / 1e6, (c1 - c0) / 1e6


def _raw_start_stop(model: torch.nn.Module, x: torch.Tensor) -> None:
    prof = profile(activities=[ProfilerActivity.CPU])
    prof.start()
    _forward(model, x)
    prof.stop()


def _recording(model: torch.nn.Module, x: torch.Tensor) -> tuple[float, float]:
    prof = profile(activities=[ProfilerActivity.CPU])
    prof.start()
    try:
        return _time_one(lambda: _forward(model, x))
    finally:
        prof.stop()


class _SummariseTimer:
    """Wraps a session's ``Processor.summarise`` to time it on the worker (bench only)."""

    def __init__(self, session: Session) -> None:
        processor = session.pipeline.processor
        self._inner = processor.summarise
        self.ms: list[float] = []
        self.events: list[int] = []
        processor.summarise = self  # type: ignore[method-assign]

    def __call__(self, win: Any) -> Any:
        t0 = time.perf_counter_ns()
        summary = self._inner(win)
        self.ms.append((time.perf_counter_ns() - t0) / 1e6)
        if not isinstance(summary, str):
            self.events.append(summary.events_total)
        return summary


def _configure(top_k: int) -> tuple[Session, _SummariseTimer]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    profkit.configure(
        sample_every=1,
        max_per_minute=None,
        top_k=top_k,
        exporters=("otel", "log"),
        tracer_provider=provider,
        logger=structlog.wrap_logger(structlog.ReturnLogger()),
    )
    session = get_session()
    assert session is not None
    return session, _SummariseTimer(session)


VARIANTS = ("bare", "recording", "raw", "sampled")


def _block(
    model: torch.nn.Module, x: torch.Tensor, rounds: int, out: dict[str, list[float]]
) -> None:
    rng = random.Random(len(out["bare"]))
    order = list(VARIANTS)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            if name == "bare":
                wall, cpu = _time_one(lambda: _forward(model, x))
            elif name == "recording":
                wall, cpu = _recording(model, x)
            elif name == "raw":
                wall, cpu = _time_one(lambda: _raw_start_stop(model, x))
            else:
                wall, cpu = _time_one(lambda: predict(model, x))
                profkit.force_flush(10.0)  # the worker is idle again before the next call
            out[name].append(wall)
            out[name + "_cpu"].append(cpu)


def _paired(a: list[float], b: list[float]) -> list[float]:
    return [x - y for x, y in zip(a, b, strict=True)]


def measure(quick: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    x = torch.randn(32, 64)
    models = {"mlp": mlp(), "mlp x10": deep_mlp()}
    configs = [("mlp", 10), ("mlp", 5), ("mlp", 100), ("mlp x10", 10), ("mlp x10", 100)]
    reps, rounds = (1, 5) if quick else (6, 15)
    samples: dict[tuple[str, int], dict[str, list[float]]] = {
        c: {k: [] for v in VARIANTS for k in (v, v + "_cpu")} for c in configs
    }
    timers: dict[tuple[str, int], list[_SummariseTimer]] = {c: [] for c in configs}
    for _ in range(reps):  # configurations cycle, so slow spells of the machine hit them all
        for name, top_k in configs:
            _session, timer = _configure(top_k)
            model = models[name]
            for _ in range(3):  # warm this model's path (allocator, dispatch caches)
                predict(model, x)
                profkit.force_flush(10.0)
            _block(model, x, rounds, samples[(name, top_k)])
            timers[(name, top_k)].append(timer)
    profkit.shutdown(5.0)
    rows = []
    for key in configs:
        s = samples[key]
        summarise_ms = [ms for t in timers[key] for ms in t.ms]
        events = [e for t in timers[key] for e in t.events]
        rows.append(
            {
                "model": key[0],
                "top_k": key[1],
                "events": int(spread(events).median) if events else 0,
                "bare_ms": spread(s["bare"]),
                "recording_ms": spread(s["recording"]),
                "raw_ms": spread(s["raw"]),
                "sampled_ms": spread(s["sampled"]),
                "overhead_ms": spread(_paired(s["sampled"], s["recording"])),
                "overhead_cpu_ms": spread(_paired(s["sampled_cpu"], s["recording_cpu"])),
                "raw_overhead_ms": spread(_paired(s["raw"], s["recording"])),
                "profkit_extra_ms": spread(_paired(s["sampled"], s["raw"])),
                "summarise_ms": spread(summarise_ms),
            }
        )
    base = rows[0]["overhead_ms"]["median"]
    extras = [r["profkit_extra_ms"]["median"] for r in rows]
    growth = max(extras) - min(extras)
    worst_summarise = max(r["summarise_ms"]["median"] for r in rows)
    return {
        "section": "sampled",
        "machine": machine(),
        "rounds": reps * rounds,
        "rows": rows,
        "targets": {
            "sampled_overhead_ms": {"value": base, "limit": LIMIT_MS, "ok": base <= LIMIT_MS},
            "summarise_off_request_path": {
                # profkit's own share (sampled minus torch's start/stop) must not grow with
                # top_k or with 10x the events by anything like what summarising them costs
                "value": growth,
                "limit": worst_summarise / 2,
                "ok": growth < worst_summarise / 2,
            },
        },
    }


def _f(s: dict[str, float]) -> str:
    return fmt_spread(s, 3)


def render(result: dict[str, Any]) -> str:
    lines = [
        f"sampled call, request path ({result['rounds']} calls per row), ms: median [IQR]",
        "| model | top_k | events | bare | recording only | sampled | overhead = sampled - "
        "recording (wall) | same, request-thread CPU | torch start/stop alone | profkit beyond "
        "torch | summarise (worker) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        cells = [
            r[k]
            for k in (
                "bare_ms",
                "recording_ms",
                "sampled_ms",
                "overhead_ms",
                "overhead_cpu_ms",
                "raw_overhead_ms",
                "profkit_extra_ms",
                "summarise_ms",
            )
        ]
        lines.append(
            f"| {r['model']} | {r['top_k']} | {r['events']} | "
            + " | ".join(_f(c) for c in cells)
            + " |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    args = parse_args(__doc__ or "")
    emit(measure(args.quick), args.json, render)
