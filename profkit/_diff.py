"""``python -m profkit diff BEFORE AFTER``: what changed between two sets of samples, per label.

BEFORE and AFTER are each a file or a glob (quote it) of profkit's JSON lines, read by
:mod:`profkit._jsonlines` (the reading ``report`` uses). Cold samples (``cold`` or
``profkit.cold`` true) are left out. For each label found on both sides, each op and each
region gets its per-call time before and after (the median over the samples that list it,
in ms: one preempted call does not move it), the ratio after / before, and whether the
change is **significant**:

* a two-sided Mann-Whitney U test on the per-sample values (normal approximation with the
  tie correction) gives p < ``ALPHA`` (0.01), which needs at least ``MIN_SAMPLES`` (8)
  samples on each side (fewer: never significant, and the output says so); and
* the per-call time moved by at least ``MIN_CHANGE`` (10%) of the larger of the two: with
  hundreds of samples a rank test finds differences too small to matter (a busier machine
  during one of the runs).

An op seen only after is new (``before_ms`` null), one seen only before is gone
(``after_ms`` null); either is significant with ``MIN_SAMPLES`` a side unless it may only
have fallen past ``top_k`` (the other side's "other" row has a median at least half as
large). Compact log lines keep the top ``COMPACT_OPS`` ops and no region: an op or region
only the other side lists, which they may have cut, is **unknown** (``?``; never
significant), and each label's header says how many samples were compact lines. The human
output lists each label's rows by impact (ms per call gained or lost, largest first;
unknown rows last); ``--json`` prints ``{"labels": {LABEL: {"samples": {...},
"compact_samples": {...}, "ops": [{"op", "before_ms", "after_ms", "ratio", "significant",
"p", "unknown"}, ...], "regions": [...]}}}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Sequence
from typing import Any

from ._jsonlines import Sample, dumps, expand, lines, read, write
from ._text import clean
from .exporters.logs import COMPACT_OPS

__all__ = [
    "ALPHA",
    "MIN_CHANGE",
    "MIN_SAMPLES",
    "Change",
    "LabelDiff",
    "diff",
    "mann_whitney_p",
]

DESCRIPTION = """\
Compare two sets of profkit JSON lines (files or globs): per label, the per-call time of
each op and region before and after, the ratio, and whether the change is significant
(two-sided Mann-Whitney U, p < 0.01, at least 8 samples a side, and at least a 10% change).
Cold samples are left out. Rows are sorted by impact (ms per call).
"""

ALPHA = 0.01
"""p below which a difference is statistically significant."""
MIN_SAMPLES = 8
"""Samples each side needs before any change is called significant."""
MIN_CHANGE = 0.10
"""Smallest change (a share of the larger per-call time) called significant."""


@dataclasses.dataclass(frozen=True)
class Change:
    """One op or region of a label, before and after."""

    name: str
    before_ms: float | None
    """Median per-call time before, in ms (None: not seen before, a new op)."""
    after_ms: float | None
    """Median per-call time after, in ms (None: not seen after)."""
    ratio: float | None
    """after / before (None when either side is missing or before is 0)."""
    significant: bool
    p: float | None
    """The rank test's two-sided p (None: too few samples to test)."""
    unknown: bool = False
    """Listed on one side only, and the other side's samples cannot say whether it is there:
    compact log lines, which keep the top ``COMPACT_OPS`` ops and no region (the missing
    side's ``*_ms`` is None, as for a new or gone op; never significant)."""

    @property
    def impact_ms(self) -> float:
        """ms per call gained (positive) or saved (negative); 0 when :attr:`unknown`."""
        if self.unknown:
            return 0.0
        return (self.after_ms or 0.0) - (self.before_ms or 0.0)


@dataclasses.dataclass(frozen=True)
class LabelDiff:
    """Every op and region of one label, by impact."""

    label: str
    before: int
    after: int
    """Samples read after (cold ones left out)."""
    ops: list[Change]
    regions: list[Change]
    before_compact: int = 0
    """Of the samples before, how many were compact log lines (top ops only, no regions)."""
    after_compact: int = 0


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p of the Mann-Whitney U test of ``a`` against ``b`` (normal approximation,
    tie-corrected, continuity-corrected); 1.0 when every value is the same."""
    n1, n2 = len(a), len(b)
    pooled = sorted([(v, 0) for v in a] + [(v, 1) for v in b])
    ranks = [0.0] * len(pooled)
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2.0 + 1.0
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    r1 = sum(r for r, (_, side) in zip(ranks, pooled, strict=True) if side == 0)
    u = r1 - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    var = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2.0) - 0.5) / math.sqrt(var)
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2.0)))


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def _both(name: str, before: list[float], after: list[float]) -> Change:
    """An op or region the samples of both sides list (``before``/``after``: µs each)."""
    mb, ma = _median_ms(before), _median_ms(after)
    ratio = ma / mb if mb else None
    if min(len(before), len(after)) < MIN_SAMPLES:
        return Change(name, mb, ma, ratio, False, None)
    p = mann_whitney_p(before, after)
    larger = max(mb, ma)
    significant = p < ALPHA and larger > 0 and abs(ma - mb) >= MIN_CHANGE * larger
    return Change(name, mb, ma, ratio, significant, p)


def _median_ms(us: list[float]) -> float:
    """The median of µs samples in ms, to the ns the JSON output keeps: rows are sorted by
    the impact their written values give (unrounded, two impacts within a ns could swap)."""
    return round(_median(us) / 1000.0, 6)


def _one_side(name: str, seen: list[float], missing: list[Sample], new: bool, field: str) -> Change:
    """An op or region one side's samples list, the other's never: new (or gone). Significant
    with enough samples a side, unless it may hide in the other side's "other" row (past
    ``top_k``: the median "other" row there is at least half this one's median), or past a
    compact line's top ops (its smallest op at least half this one's median: then unknown).
    A compact line shows no region: for a region the other side's compact samples say
    nothing, and with none but those it is unknown."""
    median = _median_ms(seen)
    evidence = [s for s in missing if field == "ops" or not s.compact]
    hidden = bool(evidence) and _median([_hides(s) for s in evidence]) / 1000.0 >= median / 2
    unknown = not evidence or (hidden and any(s.compact for s in evidence))
    enough = min(len(seen), len(evidence)) >= MIN_SAMPLES
    significant = enough and not hidden and not unknown and median > 0
    before, after = (None, median) if new else (median, None)
    return Change(name, before, after, None, significant, None, unknown)


def _hides(sample: Sample) -> float:
    """How large (µs) an op the sample does not list may be: its "other" row; for a compact
    line that lists its full ``COMPACT_OPS``, the smallest of them (the rest were cut)."""
    if sample.compact:
        return min(sample.ops.values()) if len(sample.ops) >= COMPACT_OPS else 0.0
    return sample.other_us


def _changes(before: list[Sample], after: list[Sample], field: str) -> list[Change]:
    """Each op (``field`` "ops") or region ("regions") over the samples that list it."""
    values: dict[str, tuple[list[float], list[float]]] = {}
    for side, samples in ((0, before), (1, after)):
        for sample in samples:
            for name, us in getattr(sample, field).items():
                values.setdefault(name, ([], []))[side].append(us)
    out = []
    for name, (b, a) in values.items():
        if b and a:
            out.append(_both(name, b, a))
        else:
            out.append(_one_side(name, a or b, before if a else after, bool(a), field))
    return sorted(out, key=lambda c: (c.unknown, -abs(c.impact_ms), c.name))


def diff(before: list[Sample], after: list[Sample]) -> list[LabelDiff]:
    """One :class:`LabelDiff` per label with samples on both sides (cold ones left out),
    labels with the most samples first."""
    groups: dict[str, tuple[list[Sample], list[Sample]]] = {}
    for side, samples in ((0, before), (1, after)):
        for sample in samples:
            if not sample.cold:
                groups.setdefault(sample.label, ([], []))[side].append(sample)
    out = [
        LabelDiff(
            label,
            len(b),
            len(a),
            _changes(b, a, "ops"),
            _changes(b, a, "regions"),
            sum(s.compact for s in b),
            sum(s.compact for s in a),
        )
        for label, (b, a) in groups.items()
        if b and a
    ]
    return sorted(out, key=lambda d: (-(d.before + d.after), d.label))


# -- output ---------------------------------------------------------------------------------

_LIMIT = 200


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render(diffs: list[LabelDiff]) -> str:
    """The readable diff: each label, its ops and regions by impact."""
    if not diffs:
        return "no label has samples in both BEFORE and AFTER\n"
    blocks = []
    for d in diffs:
        head = f"{clean(d.label, _LIMIT)}  {d.before} samples before, {d.after} after"
        if min(d.before, d.after) < MIN_SAMPLES:
            head += f"  (significance needs {MIN_SAMPLES} a side)"
        for side, n in (("before", d.before_compact), ("after", d.after_compact)):
            if n:
                head += f"  ({side}: {n} compact log lines: top {COMPACT_OPS} ops, no regions)"
        rows = [head]
        for kind, changes in (("op", d.ops), ("region", d.regions)):
            if not changes:
                continue
            rows.append(
                f"  {kind:<34} {'before ms':>10} {'after ms':>10} {'ratio':>7} {'impact ms':>10}"
            )
            rows.extend(_render_row(c) for c in changes)
        blocks.append("\n".join(rows) + "\n")
    note = f"* significant: Mann-Whitney p < {ALPHA} and a change of at least {MIN_CHANGE:.0%}\n"
    if any(c.unknown for d in diffs for c in (*d.ops, *d.regions)):
        note += (
            "? unknown: the other side's compact log lines (structlog unconfigured) show only"
            f" their top {COMPACT_OPS} ops and no regions\n"
        )
    return "\n".join(blocks) + "\n" + note


def _render_row(c: Change) -> str:
    ratio = (
        "?"
        if c.unknown
        else "new"
        if c.before_ms is None
        else "gone"
        if c.after_ms is None
        else (f"{c.ratio:.2f}x" if c.ratio is not None else "-")
    )
    impact = f"{'?':>10}" if c.unknown else f"{c.impact_ms:>+10.3f}"
    mark = "  *" if c.significant else ""
    return (
        f"  {clean(c.name, 34):<34} {_ms(c.before_ms):>10} {_ms(c.after_ms):>10}"
        f" {ratio:>7} {impact}{mark}"
    )


def _row(change: Change, key: str) -> dict[str, Any]:
    return {
        key: change.name,
        "before_ms": None if change.before_ms is None else round(change.before_ms, 6),
        "after_ms": None if change.after_ms is None else round(change.after_ms, 6),
        "ratio": None if change.ratio is None else round(change.ratio, 4),
        "significant": change.significant,
        "p": None if change.p is None else float(f"{change.p:.3g}"),
        "unknown": change.unknown,
    }


def as_json(diffs: list[LabelDiff]) -> dict[str, Any]:
    """``{"labels": {LABEL: {"samples", "compact_samples", "ops", "regions"}}}``."""
    return {
        "labels": {
            d.label: {
                "samples": {"before": d.before, "after": d.after},
                "compact_samples": {"before": d.before_compact, "after": d.after_compact},
                "ops": [_row(c, "op") for c in d.ops],
                "regions": [_row(c, "region") for c in d.regions],
            }
            for d in diffs
        }
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The diff's options."""
    parser.add_argument("before", metavar="BEFORE", help="JSON lines file or glob (quoted)")
    parser.add_argument("after", metavar="AFTER", help="JSON lines file or glob (quoted)")
    parser.add_argument("--json", action="store_true", help="the diff as JSON")


def run(args: argparse.Namespace) -> int:
    """Print the diff; 1 when a file cannot be read or no label is on both sides."""
    unreadable: list[str] = []
    before, bad_b = read(lines(expand([args.before]), unreadable))
    after, bad_a = read(lines(expand([args.after]), unreadable))
    diffs = diff(before, after)
    if args.json:
        print(dumps(as_json(diffs)))
    else:
        write(sys.stdout, render(diffs))
    for problem in unreadable:
        write(sys.stderr, f"profkit diff: {problem}\n")
    if bad_b + bad_a:
        write(sys.stderr, f"profkit diff: skipped {bad_b + bad_a} lines that could not be read\n")
    return 0 if diffs and not unreadable else 1
