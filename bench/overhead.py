"""Off-sample cost of ``@profiled`` and ``region()`` against the bare call and raw record_function.

Targets: an off-sample ``@profiled`` root call adds at most 1 µs to the bare call and at most
0.15x of what wrapping the same function in ``torch.autograd.profiler.record_function`` adds;
an off-sample ``region()`` adds at most 0.5 µs. The function is trivial (returns its argument)
so that the added cost is not hidden by work. All variants run interleaved in one process,
and each added cost is the round-by-round difference to the bare call in the same round.

    .venv/bin/python bench/overhead.py [--quick] [--json]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from _util import batch_ns, diffs, emit, fmt_spread, interleaved, machine, parse_args, spread
from torch.autograd.profiler import record_function

import profkit

US_LIMIT_PROFILED = 1000.0
RATIO_LIMIT = 0.15
US_LIMIT_REGION = 500.0
#: a region() that is itself the root call pays the root call's cost too (issue 14: 1.0 µs)
US_LIMIT_REGION_ROOT = 1000.0
US_LIMIT_CAPTURE_SLOW = 1500.0
#: ``profkit.batch_member()`` in a request's span, off-sample (issue 24: 1 µs)
US_LIMIT_BATCH_MEMBER = 1000.0
#: metrics=True over metrics=False, off-sample, in the same run (issue 23)
US_LIMIT_METRICS = 300.0


def bare(x: Any) -> Any:
    return x


def _rf_wrapped(fn: Callable[[Any], Any], name: str) -> Callable[[Any], Any]:
    def wrapper(x: Any) -> Any:
        with record_function(name):
            return fn(x)

    return wrapper


def _region_body(x: Any) -> Any:
    with profkit.region("stage"):
        return x


async def bare_async(x: Any) -> Any:
    return x


def _awaited(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A coroutine function run to its end by hand (it never suspends): what ``await`` does,
    without an event loop's own cost in the batch."""

    def call(x: Any) -> Any:
        try:
            fn(x).send(None)
        except StopIteration as done:
            return done.value
        raise AssertionError("suspended")

    return call


class _Model:
    @profkit.profiled
    def method(self, x: Any) -> Any:
        return x

    def bare_method(self, x: Any) -> Any:
        return x


def _inside_root(fn: Callable[[Any], Any]) -> Callable[[int], float]:
    """A batch run inside one unsampled root call, so every call in it is a nested scope."""

    def run(n: int) -> float:
        with profkit.region("bench.root"):
            return batch_ns(fn, 1, n)

    return run


def _member(x: Any) -> Any:
    return profkit.batch_member()


def _in_span(fn: Callable[[Any], Any]) -> Callable[[int], float]:
    """A batch run inside one recording OTel span (a request's), as batch_member() is."""
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("bench")

    def run(n: int) -> float:
        with tracer.start_as_current_span("request"):
            return batch_ns(fn, 1, n)

    return run


def _plain(fn: Callable[[Any], Any]) -> Callable[[int], float]:
    def run(n: int) -> float:
        return batch_ns(fn, 1, n)

    return run


def _metrics_rounds(fn: Callable[[Any], Any], rounds: int, n: int) -> dict[str, list[float]]:
    """``fn``'s off-sample cost under a session with metrics off and one with metrics on
    (an SDK MeterProvider read by an in-memory reader; its drain thread runs as in service)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from profkit._config import build_config
    from profkit._label.scope import GLOBAL
    from profkit._session import Session

    def session(**extra: Any) -> Session:
        base = {"sample_every": 100, "max_per_minute": 1e-9, "exporters": ()}
        made = Session(build_config({**base, **extra}))
        made.start()
        GLOBAL.session = made
        fn(1)  # EveryN samples call 0 (the one window the cap allows)
        made.force_flush(10.0)
        return made

    off = session()
    on = session(metrics=True, meter_provider=MeterProvider([InMemoryMetricReader()]))

    def under(made: Session) -> Callable[[int], float]:
        def run(k: int) -> float:
            GLOBAL.session = made
            return batch_ns(fn, 1, k)

        return run

    try:
        return interleaved(
            {"bare": _plain(bare), "off": under(off), "on": under(on)}, rounds=rounds, n=n, seed=4
        )
    finally:
        GLOBAL.session = None
        off.shutdown(5.0)
        on.shutdown(5.0)


def measure(quick: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    rounds, n = (5, 1_000) if quick else (101, 3_000)
    profiled_fn = profkit.profiled(bare)
    rf_fn = _rf_wrapped(bare, "bare")
    obj = _Model()

    # 1-in-100, as in production; the rate cap lets only the first sample through, so the
    # profiler stays off and 1% of calls take the (cheap) rate-limiter branch
    profkit.configure(sample_every=100, max_per_minute=1e-9, exporters=())
    profiled_fn(1)  # EveryN samples call 0 (the one window the cap allows)
    profkit.force_flush(10.0)
    raw = interleaved(
        {
            "bare": _plain(bare),
            "profiled": _plain(profiled_fn),
            "record_function": _plain(rf_fn),
            "region_root": _plain(_region_body),
            "bare_method": _plain(obj.bare_method),
            "profiled_method": _plain(obj.method),
            "nested_bare": _inside_root(bare),
            "nested_profiled": _inside_root(profiled_fn),
            "nested_region": _inside_root(_region_body),
            "bare_async": _plain(_awaited(bare_async)),
            "profiled_async": _plain(_awaited(profkit.profiled(bare_async))),
            "span_bare": _in_span(bare),
            "batch_member": _in_span(_member),
        },
        rounds=rounds,
        n=n,
        seed=2,
    )
    stats = profkit.stats()
    profkit.shutdown(5.0)
    # no session (never configured, or shut down): the decorator's cheapest path
    unconfigured = interleaved(
        {"bare": _plain(bare), "profiled": _plain(profiled_fn)}, rounds=rounds, n=n, seed=1
    )

    # capture_slow (issue 16): every unprofiled root call is timed for its label's latency
    # book; a budget of nothing lets no speculative window through (nor a sampled one past
    # the first: the rate cap lets none more)
    profkit.configure(
        sample_every=100, max_per_minute=1e-9, max_overhead=1e-9, capture_slow=True, exporters=()
    )
    profiled_fn(1)
    profkit.force_flush(10.0)
    # (and, issue 37, its nested scopes are timed for a stage record: a clock pair, an append)
    slow = interleaved(
        {
            "bare": _plain(bare),
            "profiled": _plain(profiled_fn),
            "nested_bare": _inside_root(bare),
            "nested_profiled": _inside_root(profiled_fn),
            "nested_region": _inside_root(_region_body),
        },
        rounds=rounds,
        n=n,
        seed=3,
    )
    slow_stats = profkit.stats()
    profkit.shutdown(5.0)

    # metrics (issue 23): the same calls with metrics on and off in one run, each batch under
    # its own session (swapped between batches, outside the timed loop)
    fleet = _metrics_rounds(profiled_fn, rounds, n)

    added_prof = diffs(raw["profiled"], raw["bare"])
    added_rf = diffs(raw["record_function"], raw["bare"])
    rows = {
        "bare call": spread(raw["bare"]),
        "profiled, no session": spread(diffs(unconfigured["profiled"], unconfigured["bare"])),
        "profiled, off-sample root": spread(added_prof),
        "profiled method, off-sample root": spread(
            diffs(raw["profiled_method"], raw["bare_method"])
        ),
        "profiled, nested in off-sample root": spread(
            diffs(raw["nested_profiled"], raw["nested_bare"])
        ),
        "profiled coroutine, off-sample root": spread(
            diffs(raw["profiled_async"], raw["bare_async"])
        ),
        "region, off-sample root": spread(diffs(raw["region_root"], raw["bare"])),
        "region, nested in off-sample root": spread(
            diffs(raw["nested_region"], raw["nested_bare"])
        ),
        "raw record_function (no profiler)": spread(added_rf),
        "profiled, off-sample root, capture_slow on": spread(diffs(slow["profiled"], slow["bare"])),
        "profiled, nested in unprofiled root, capture_slow on": spread(
            diffs(slow["nested_profiled"], slow["nested_bare"])
        ),
        "region, nested in unprofiled root, capture_slow on": spread(
            diffs(slow["nested_region"], slow["nested_bare"])
        ),
        "batch_member(), in a request's span": spread(diffs(raw["batch_member"], raw["span_bare"])),
        "profiled, off-sample root, metrics off": spread(diffs(fleet["off"], fleet["bare"])),
        "profiled, off-sample root, metrics on": spread(diffs(fleet["on"], fleet["bare"])),
        "metrics on over metrics off": spread(diffs(fleet["on"], fleet["off"])),
    }
    ratio = spread([p / r for p, r in zip(added_prof, added_rf, strict=True)])
    return {
        "section": "overhead",
        "machine": machine(),
        "rounds": rounds,
        "calls_per_round": n,
        "rows_ns": rows,
        "ratio_to_record_function": ratio,
        "sampled_during_bench": stats["sampled"],
        "speculative_windows_during_bench": slow_stats["windows"] - 1,
        "targets": {
            "profiled_off_sample_us": {
                "value": rows["profiled, off-sample root"].median / 1000,
                "limit": US_LIMIT_PROFILED / 1000,
                "ok": rows["profiled, off-sample root"].median <= US_LIMIT_PROFILED,
            },
            "profiled_vs_record_function": {
                "value": ratio.median,
                "limit": RATIO_LIMIT,
                "ok": ratio.median <= RATIO_LIMIT,
            },
            "region_nested_off_sample_us": {
                "value": rows["region, nested in off-sample root"].median / 1000,
                "limit": US_LIMIT_REGION / 1000,
                "ok": rows["region, nested in off-sample root"].median <= US_LIMIT_REGION,
            },
            "capture_slow_off_sample_us": {
                "value": rows["profiled, off-sample root, capture_slow on"].median / 1000,
                "limit": US_LIMIT_CAPTURE_SLOW / 1000,
                "ok": rows["profiled, off-sample root, capture_slow on"].median
                <= US_LIMIT_CAPTURE_SLOW,
            },
            "batch_member_off_sample_us": {
                "value": rows["batch_member(), in a request's span"].median / 1000,
                "limit": US_LIMIT_BATCH_MEMBER / 1000,
                "ok": rows["batch_member(), in a request's span"].median <= US_LIMIT_BATCH_MEMBER,
            },
            "metrics_off_sample_added_us": {
                "value": rows["metrics on over metrics off"].median / 1000,
                "limit": US_LIMIT_METRICS / 1000,
                "ok": rows["metrics on over metrics off"].median <= US_LIMIT_METRICS,
            },
            "region_root_off_sample_us": {
                "value": rows["region, off-sample root"].median / 1000,
                "limit": US_LIMIT_REGION_ROOT / 1000,
                "ok": rows["region, off-sample root"].median <= US_LIMIT_REGION_ROOT,
            },
        },
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"off-sample overhead ({result['rounds']} rounds x {result['calls_per_round']} calls)",
        "| case | ns per call (added to bare), median [IQR] |",
        "|---|---|",
    ]
    for name, s in result["rows_ns"].items():
        lines.append(f"| {name} | {fmt_spread(s, 0)} min {s['min']:.0f} |")
    r = result["ratio_to_record_function"]
    lines.append(f"| profiled / record_function added cost | {fmt_spread(r, 3)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    args = parse_args(__doc__ or "")
    emit(measure(args.quick), args.json, render)
