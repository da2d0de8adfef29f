"""Diagnosis: classify one sampled call as input-, launch-, compute-bound or balanced.

A pure function of a :class:`~profkit._model.CallSummary` and four thresholds; nothing here
imports torch, so every rule is testable on synthetic summaries.

The rules, checked in order (the first that holds wins):

1. **input-bound**: the call's *input share* is at least ``input_bound_share``. When device
   activity was recorded, the device must also be idle for at least ``input_bound_share`` of
   the call, and then an input share of one half is enough (when the threshold is higher):
   the host outside ops may be waiting for a busy device, which is not input.
2. **launch-bound**: at least ``launch_bound_min_ops`` op events, an (estimated) median op
   self CPU time of at most ``launch_bound_op_us``, and a *launch share* of at least one
   half: tiny ops (at most ``launch_bound_op_us`` per event) and the launch glue between ops
   take most of the time in and between ops. A call whose heavy ops carry most of that time
   is never launch-bound, however many tiny ops run beside them.
3. **compute-bound**: the two heaviest op rows take at least ``compute_bound_top2_share`` of
   the op time (device kernels' self time when the device recorded any, host self CPU time
   otherwise).
4. **balanced**: none of the above, and also the verdict for a call with no wall time.
5. **no-ops**: a call in which no torch op was recorded (nothing to judge), checked first.

Each verdict has a **confidence** from its *margin* (``figures["margin"]``): how far the
figures are from the nearest threshold that would change it (:mod:`.thresholds`).

The self time of torch's range around a data loader's ``__next__`` (``enumerate(DataLoader)#...``:
rows fetched in Python, or waited for from worker processes) is input time, not op time: it
counts as outside torch ops, and the range is not an op the compute-bound rule ranks.

The input share is the time outside torch ops (``wall - self CPU time of the ops``) less a
*launch-glue allowance* of ``launch_bound_op_us`` per op event, over the wall time. The
allowance is what keeps a loop of thousands of tiny ops launch-bound: the Python, the
dispatcher and the profiler's own bookkeeping between two ops are outside every op, but they
are part of launching it, not input. The allowance is taken scope by scope (the root's own
part and each nested region's own part, child regions excluded), so a ``preprocess`` region
with no ops keeps all of its time however many ops the model region runs.

The launch share is ``(tiny + glue) / (op time + glue)``: ``tiny`` is the self CPU time of the
op rows whose mean per event is at most ``launch_bound_op_us``, ``glue`` the outside time the
allowance gives to launching. On a device: the tiny kernel rows' share of kernel device time.

The median op time is an estimate: a summary holds only aggregated rows, so each row stands
for ``count`` events of its mean duration ``self_cpu_us / count``, and the median is taken
over those expanded events (the "other" row included, since it stands for real events;
device kernel rows left out, since they take no host time).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from profkit._model import CallSummary, Diagnosis, OpRow, ScopeSummary

from .events import LOADER_RANGES
from .thresholds import HALF, LAUNCH_SHARE, Figures, Thresholds, ThresholdSource, Verdict
from .thresholds import confidence as _confidence
from .thresholds import margin as _margin

__all__ = ["ThresholdSource", "Thresholds", "amdahl_speedup", "diagnose"]

AmdahlEntry = tuple[str, float, float]

_MAX_F = 0.999999
"""Largest fraction used in Amdahl entries, so that the best speed-up stays finite."""

_MAX_AMDAHL = 5
"""Amdahl entries kept per call."""

_MU = "\u00b5"

_NAMED_SHARE = 0.1
"""The compute-bound reason names the second op only when it takes this share of op time."""


def amdahl_speedup(f: float, s: float) -> float:
    """Overall speed-up when a fraction ``f`` of the time is made ``s`` times faster.

    Args:
        f: Fraction of the time that is sped up, in [0, 1].
        s: Speed-up of that fraction, > 0; ``math.inf`` means it takes no time at all.

    Returns:
        ``1 / ((1 - f) + f / s)``; with ``s = inf`` that is ``1 / (1 - f)`` (``inf`` at f = 1).

    Raises:
        ValueError: ``f`` is outside [0, 1] or ``s`` is not > 0.
    """
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"amdahl_speedup: f must be in [0, 1], got {f!r}")
    if not s > 0.0:
        raise ValueError(f"amdahl_speedup: s must be > 0, got {s!r}")
    rest = (1.0 - f) + (0.0 if math.isinf(s) else f / s)
    return math.inf if rest <= 0.0 else 1.0 / rest


def diagnose(call: CallSummary, thresholds: Thresholds) -> Diagnosis:
    """Classify one call and say where a speed-up would pay.

    Args:
        call: The summarised call (root scope, nested scopes, op rows).
        thresholds: The four diagnosis thresholds.

    Returns:
        The verdict, a one-line reason, the figures that decided it, and the Amdahl entries.
    """
    figures = _figures(call, thresholds)
    verdict, reason = _judge(call, figures, thresholds)
    figures["margin"] = _margin(verdict, figures, thresholds)
    if call.batch is not None and call.batch.size:  # one forward for many requests
        figures["batch_member_count"] = call.batch.size
        figures["per_request_us"] = figures["wall_us"] / call.batch.size
        reason += f"; a batch of {call.batch.size}: {figures['per_request_us']:.1f} µs per request"
    return Diagnosis(
        verdict=verdict,
        reason=reason,
        figures=figures,
        amdahl=_amdahl(call),
        confidence=_confidence(figures["margin"]),
    )


def _judge(call: CallSummary, figures: Figures, th: Thresholds) -> tuple[Verdict, str]:
    """Apply the rules in order and return the first verdict that holds, with its reason."""
    if call.root.op_count <= 0:
        return "no-ops", "no torch ops recorded in the call: nothing to judge"
    if figures["wall_us"] <= 0.0:
        return "balanced", "the call took no measurable wall time: nothing to judge"
    if _is_input_bound(figures, th):
        return "input-bound", _input_reason(call, figures, th)
    if _is_launch_bound(figures, th):
        return "launch-bound", _launch_reason(call, figures, th)
    if figures["top2_share"] >= th.compute_bound_top2_share:
        return "compute-bound", _compute_reason(call, figures, th)
    return "balanced", _balanced_reason(figures)


# --- figures -------------------------------------------------------------------------------


def _share(part: float, whole: float) -> float:
    """``part / whole`` clamped to [0, 1]; 0 when ``whole`` is not positive."""
    if whole <= 0.0:
        return 0.0
    return min(1.0, max(0.0, part / whole))


def _is_loader(row: OpRow) -> bool:
    """Whether a row is torch's range around a data loader's ``__next__``."""
    return not row.is_other and not row.is_kernel and row.name.startswith(LOADER_RANGES)


def _op_self_us(scope: ScopeSummary) -> float:
    """A scope's host time inside torch ops: its self CPU time less its data loaders' own."""
    loading = sum(row.self_cpu_us for row in scope.ops if _is_loader(row))
    return max(0.0, scope.self_cpu_us - loading)


def _uses_device(call: CallSummary) -> bool:
    """Whether op time is read from device self time (device recorded and some time > 0)."""
    return call.device_active and call.root.self_device_us > 0.0


def _top_rows(call: CallSummary) -> list[OpRow]:
    """The rows that rank ops, heaviest first (stable on ties), the "other" row left out.

    On a device these are the kernel rows by device self time (a CPU op's device time only
    mirrors the kernels it launched); otherwise the host op rows by self CPU time.
    """
    if _uses_device(call):
        kernels = [row for row in call.root.ops if row.is_kernel and not row.is_other]
        return sorted(kernels, key=lambda row: row.self_device_us, reverse=True)
    rows = [r for r in call.root.ops if not r.is_other and not r.is_kernel and not _is_loader(r)]
    return sorted(rows, key=lambda row: row.self_cpu_us, reverse=True)


def _host_rows(root: ScopeSummary) -> list[tuple[OpRow, int]]:
    """Each host row with the op events it stands for (kernel rows take no host time).

    A named row stands for its count; the "other" row may hold kernels too, so it stands for
    the host events no named row holds (``op_count`` less the named rows' counts).
    """
    named = sum(r.count for r in root.ops if not r.is_kernel and not r.is_other)
    rows = []
    for row in (r for r in root.ops if not r.is_kernel):
        count = min(row.count, max(0, root.op_count - named)) if row.is_other else row.count
        if count > 0:
            rows.append((row, count))
    return rows


def _median_op_us(root: ScopeSummary) -> float:
    """Estimated median op self CPU time: the median of row means expanded by row count.

    Falls back to the overall mean (``self_cpu_us / op_count``) when no row has events.
    """
    rows = sorted((row.self_cpu_us / count, count) for row, count in _host_rows(root))
    total = sum(count for _, count in rows)
    if total == 0:
        return root.self_cpu_us / root.op_count if root.op_count > 0 else 0.0
    return (_nth_event(rows, (total - 1) // 2) + _nth_event(rows, total // 2)) / 2.0


def _nth_event(rows: Sequence[tuple[float, int]], n: int) -> float:
    """The mean of the row holding the ``n``-th (0-based) event in ``rows`` expanded by count."""
    seen = 0
    for mean, count in rows:
        seen += count
        if n < seen:
            return mean
    return rows[-1][0]


def _input_by_scope(call: CallSummary, glue_us: float) -> list[float]:
    """Input time (µs) of each scope's own part: outside ops, less ``glue_us`` per own op.

    A scope's own part is the scope without its child scopes: its outside time and op count
    less those of its direct children (both are inclusive in the summary).
    """
    outside = [max(0.0, s.duration_us - _op_self_us(s)) for s in call.scopes]
    own_outside = list(outside)
    own_ops = [float(s.op_count) for s in call.scopes]
    for i, scope in enumerate(call.scopes):
        if i > 0 and 0 <= scope.parent < len(call.scopes) and scope.parent != i:
            own_outside[scope.parent] -= outside[i]
            own_ops[scope.parent] -= scope.op_count
    return [
        max(0.0, max(0.0, out) - max(0.0, ops) * glue_us)
        for out, ops in zip(own_outside, own_ops, strict=True)
    ]


def _launch_share(call: CallSummary, op_self: float, input_us: float, op_us: float) -> float:
    """Share of the time in and between ops taken by tiny ops and launch glue (rule 2).

    On a device: the share of the named kernel rows' device time in tiny kernels.
    """
    if _uses_device(call):
        kernels = [r for r in call.root.ops if r.is_kernel and not r.is_other]
        tiny = sum(r.self_device_us for r in kernels if r.self_device_us <= op_us * r.count)
        return _share(tiny, sum(r.self_device_us for r in kernels))
    glue = max(0.0, call.root.duration_us - op_self - input_us)
    rows = [(r, n) for r, n in _host_rows(call.root) if not _is_loader(r)]
    tiny = sum(row.self_cpu_us for row, count in rows if row.self_cpu_us <= op_us * count)
    return _share(tiny + glue, op_self + glue)


def _figures(call: CallSummary, th: Thresholds) -> Figures:
    """Every figure the rules read, keyed as documented on :class:`Diagnosis`."""
    root = call.root
    wall = root.duration_us
    device = _uses_device(call)
    op_self = _op_self_us(root)
    op_total = root.self_device_us if device else op_self
    top = [row.self_device_us if device else row.self_cpu_us for row in _top_rows(call)]
    input_us = sum(_input_by_scope(call, th.launch_bound_op_us))
    figures: Figures = {
        "wall_us": wall,
        "op_self_us": op_self,
        "outside_ops_share": _share(max(0.0, wall - op_self), wall),
        "input_share": _share(input_us, wall),
        "op_count": float(root.op_count),
        "median_op_us": _median_op_us(root),
        "launch_share": _launch_share(call, op_self, input_us, th.launch_bound_op_us),
        "top1_share": _share(sum(top[:1]), op_total),
        "top2_share": _share(sum(top[:2]), op_total),
    }
    if call.device_active:
        figures["device_busy_us"] = root.self_device_us
        figures["device_idle_share"] = 1.0 - _share(root.self_device_us, wall) if wall > 0 else 0.0
    return figures


# --- rules and reasons ---------------------------------------------------------------------


def _is_input_bound(figures: Figures, th: Thresholds) -> bool:
    """Rule 1: mostly input time; on a device, also the device idle for most of the call.

    On a device the host may be outside ops while it waits for the device (a bare
    synchronize), so host input time alone never makes a device call input-bound.
    """
    share = figures["input_share"]
    if "device_idle_share" not in figures:
        return share >= th.input_bound_share
    idle = figures["device_idle_share"] >= th.input_bound_share
    return idle and share >= min(th.input_bound_share, HALF)


def _is_launch_bound(figures: Figures, th: Thresholds) -> bool:
    """Rule 2: many ops, a small median op time, and tiny ops (with glue) take most time."""
    many = figures["op_count"] >= th.launch_bound_min_ops
    tiny = figures["median_op_us"] <= th.launch_bound_op_us
    return many and tiny and figures["launch_share"] >= LAUNCH_SHARE


def _busiest_region(call: CallSummary, th: Thresholds) -> tuple[str, float] | None:
    """The nested scope with the most input time and that time; None if there is none."""
    input_us = _input_by_scope(call, th.launch_bound_op_us)
    best: tuple[str, float] | None = None
    for i, scope in enumerate(call.scopes[1:], 1):
        if input_us[i] > 0.0 and (best is None or input_us[i] > best[1]):
            best = (scope.label, input_us[i])
    return best


def _where_input(call: CallSummary, th: Thresholds) -> str:
    """The ", mostly in region 'x'" tail of the input-bound reason ("" without regions)."""
    region = _busiest_region(call, th)
    total = sum(_input_by_scope(call, th.launch_bound_op_us))
    if region is None or total <= 0.0:
        return ""
    label, value = region
    share = _share(value, total)
    if share >= 0.5:
        return f", mostly in region {label!r}"
    return f", the largest part ({share:.0%}) in region {label!r}"


def _input_reason(call: CallSummary, figures: Figures, th: Thresholds) -> str:
    """E.g. "82% of the call outside torch ops, mostly in region 'preprocess'"."""
    input_share = figures["input_share"]
    where = _where_input(call, th)
    if "device_idle_share" not in figures:
        return f"{input_share:.0%} of the call outside torch ops{where}"
    idle = figures["device_idle_share"]
    return f"device idle for {idle:.0%} of the call, {input_share:.0%} outside torch ops{where}"


def _launch_reason(call: CallSummary, figures: Figures, th: Thresholds) -> str:
    """E.g. "1,234 ops with a median of 3.1 µs each: tiny ops (≤ 20 µs) and the gaps between
    them take 85% of the time in and between ops, the host is busy launching them"."""
    count = int(figures["op_count"])
    median = figures["median_op_us"]
    share = figures["launch_share"]
    tiny = f"(\u2264 {th.launch_bound_op_us:g} {_MU}s)"
    if _uses_device(call):
        what = f"tiny kernels {tiny} take {share:.0%} of device kernel time"
    else:
        gaps = "and the gaps between them take"
        what = f"tiny ops {tiny} {gaps} {share:.0%} of the time in and between ops"
    head = f"{count:,} ops with a median of {median:.1f} {_MU}s each"
    return f"{head}: {what}, the host is busy launching them"


def _compute_reason(call: CallSummary, figures: Figures, th: Thresholds) -> str:
    """E.g. "aten::addmm and aten::mm take 91% of op time", or "aten::addmm takes 99% of op
    time" when the second op is trivial (under ``_NAMED_SHARE``) and not needed to decide."""
    of_what = "device kernel time" if _uses_device(call) else "op time"
    top = _top_rows(call)[:2]
    top1, top2 = figures["top1_share"], figures["top2_share"]
    if len(top) == 2 and top2 - top1 >= _NAMED_SHARE:
        return f"{top[0].name} and {top[1].name} take {top2:.0%} of {of_what}"
    reason = f"{top[0].name} takes {top1:.0%} of {of_what}"
    if len(top) == 2 and top1 < th.compute_bound_top2_share:
        reason += f" (the top two ops {top2:.0%})"
    return reason


def _balanced_reason(figures: Figures) -> str:
    """Why no rule held: the three deciding figures in one line."""
    return (
        f"no single cause: {figures['outside_ops_share']:.0%} outside torch ops, "
        f"median op {figures['median_op_us']:.1f} {_MU}s, "
        f"tiny ops and launch gaps {figures['launch_share']:.0%} of the time in and between ops, "
        f"top two ops take {figures['top2_share']:.0%} of op time"
    )


# --- Amdahl --------------------------------------------------------------------------------


def _amdahl(call: CallSummary) -> list[AmdahlEntry]:
    """(what, f, 1 / (1 - f)) for nested scopes, host ops and kernels, largest f first, <= 5.

    ``f`` is a scope's duration, a host op row's self CPU time or a kernel row's device self
    time over the wall time, clamped to [0, 0.999999]; entries with ``f == 0`` are left out.
    """
    wall = call.root.duration_us
    if wall <= 0.0:
        return []
    candidates = [(f"region:{s.label}", s.duration_us) for s in call.scopes[1:]]
    for row in call.root.ops:
        if row.is_other:
            continue
        if row.is_kernel:
            candidates.append((f"kernel:{row.name}", row.self_device_us))
        else:
            candidates.append((f"op:{row.name}", row.self_cpu_us))
    entries: list[AmdahlEntry] = []
    for what, time_us in candidates:
        f = min(_MAX_F, max(0.0, time_us / wall))
        if f > 0.0:
            entries.append((what, f, 1.0 / (1.0 - f)))
    entries.sort(key=lambda entry: entry[1], reverse=True)
    return entries[:_MAX_AMDAHL]
