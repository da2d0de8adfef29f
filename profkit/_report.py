"""``python -m profkit report FILE...``: what many samples of each label say together.

Reads JSON lines, the ``"json"`` exporter's (``./scripts/demo --json``) or structlog's JSON
rendering of the ``"log"`` exporter's events, and the log exporter's compact lines under an
unconfigured structlog (:func:`profkit.exporters.logs.parse_compact`), skipping every other
line, and prints per
label: the number of samples, the call duration's p50 and p95, how many samples got each
verdict, and the top ops by median self CPU time over the samples that list them, with the
spread (p25-p75) and in how many samples each appears. ``--json`` prints the same as JSON.

One sample is noisy (a busy core, a page fault, a neighbour): read verdicts and op times as
counts and medians over many samples.

Percentiles are nearest-rank: the p-th of n sorted values is the ``ceil(p/100 * n)``-th.

The lines are read by :mod:`profkit._jsonlines`, the one reading ``diff`` shares. Any input
is read without raising: a line that looks like JSON but does not parse, and a
profkit event whose label, duration or op time is not what profkit writes (null, a string,
nan, inf, negative, out of range), is skipped and counted (one line on stderr at the end);
bytes that are not UTF-8 are read as U+FFFD; labels, verdicts and op names are printed
with control characters escaped (:func:`profkit._text.clean`).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import sys
from collections.abc import Iterable
from typing import Any

from ._jsonlines import Sample, dumps, expand, lines, read, read_samples, write
from ._text import clean

DESCRIPTION = """\
Roll up profkit's JSON lines (the json exporter's, or structlog's JSON of the log
exporter's events) and the log exporter's compact lines (structlog unconfigured; other
lines are skipped) per label: samples, call duration p50 and p95
(nearest rank), verdict counts (how many borderline), and the top ops by median self CPU
time over the samples that list them, with their p25-p75 spread.
"""

__all__ = [
    "LabelRollup",
    "OpRollup",
    "Sample",
    "percentile",
    "read",
    "read_samples",
    "rollup",
]

TOP_OPS = 5
"""Op rows printed per label (``--top`` changes it)."""


@dataclasses.dataclass(frozen=True)
class OpRollup:
    """One op over the samples of a label that list it."""

    name: str
    samples: int
    p25_us: float
    median_us: float
    p75_us: float


@dataclasses.dataclass(frozen=True)
class LabelRollup:
    """Every sample of one label, summed up."""

    label: str
    samples: int
    p50_ms: float
    """Median duration of the sampled calls, in ms (as profiled: see the observer effect)."""
    p95_ms: float
    verdicts: dict[str, int]
    """Verdict -> samples, most frequent first."""
    borderline: dict[str, int]
    """Verdict -> samples whose diagnosis had low confidence (verdicts with none left out)."""
    ops: list[OpRollup]
    """Ops by median self CPU time, largest first."""
    batch: dict[str, Any] | None = None
    """Batches: ``sizes`` (size -> samples), ``request_p50_ms`` / ``request_p95_ms`` (each
    member's share of its batch's duration); None when no sample was a batch."""


def percentile(values: Iterable[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in (0, 100]) of non-empty ``values``."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[rank - 1]


def rollup(
    samples: Iterable[Sample], top: int = TOP_OPS, *, include_cold: bool = False
) -> list[LabelRollup]:
    """One rollup per label, labels with the most samples first (then by name); cold samples
    (a label's first calls, profiled by a trigger or baggage) only with ``include_cold``."""
    groups: dict[str, list[Sample]] = collections.defaultdict(list)
    for sample in samples:
        if include_cold or not sample.cold:
            groups[sample.label].append(sample)
    out = [_label_rollup(label, group, top) for label, group in groups.items()]
    return sorted(out, key=lambda r: (-r.samples, r.label))


def _label_rollup(label: str, group: list[Sample], top: int) -> LabelRollup:
    durations = [s.duration_us / 1000.0 for s in group]
    verdicts = collections.Counter(s.verdict for s in group)
    borderline = collections.Counter(s.verdict for s in group if s.borderline)
    per_op: dict[str, list[float]] = collections.defaultdict(list)
    for sample in group:
        for name, self_us in sample.ops.items():
            per_op[name].append(self_us)
    ops = [
        OpRollup(name, len(v), percentile(v, 25), _median(v), percentile(v, 75))
        for name, v in per_op.items()
    ]
    ops.sort(key=lambda o: (-o.median_us, o.name))
    return LabelRollup(
        label=label,
        samples=len(group),
        p50_ms=percentile(durations, 50),
        p95_ms=percentile(durations, 95),
        verdicts=dict(sorted(verdicts.items(), key=lambda kv: (-kv[1], kv[0]))),
        borderline={v: borderline[v] for v in sorted(borderline)},
        ops=ops[:top],
        batch=_batch_rollup(group),
    )


def _batch_rollup(group: list[Sample]) -> dict[str, Any] | None:
    """Batch sizes and each request's share of its batch's time, over the batch samples."""
    batches = [s for s in group if s.shares]
    if not batches:
        return None
    per_request = [share * s.duration_us / 1000.0 for s in batches for share in s.shares]
    sizes = collections.Counter(len(s.shares) for s in batches)
    return {
        "sizes": dict(sorted(sizes.items())),
        "request_p50_ms": percentile(per_request, 50),
        "request_p95_ms": percentile(per_request, 95),
    }


def _median(values: list[float]) -> float:
    """The middle value (the mean of the two middle ones for an even count)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


# -- output ---------------------------------------------------------------------------------


def render(rollups: list[LabelRollup]) -> str:
    """The readable report."""
    if not rollups:
        return "no profkit.profile events found\n"
    blocks = [_render_one(r) for r in rollups]
    return "\n".join(blocks)


#: the most characters of a label or verdict printed
_LIMIT = 200


def _render_one(r: LabelRollup) -> str:
    verdicts = ", ".join(
        f"{clean(name, _LIMIT)} {count}"
        + (f" ({r.borderline[name]} borderline)" if name in r.borderline else "")
        for name, count in r.verdicts.items()
    )
    label = clean(r.label, _LIMIT)
    lines = [
        f"{label}  {r.samples} samples  duration p50 {r.p50_ms:.3f} ms  p95 {r.p95_ms:.3f} ms",
        f"  verdicts: {verdicts}",
        *_render_batch(r.batch),
        f"  {'op':<34} {'samples':>8} {'median self cpu us':>19} {'p25-p75':>19}",
    ]
    for op in r.ops:
        seen = f"{op.samples}/{r.samples}"
        spread = f"{op.p25_us:.1f}-{op.p75_us:.1f}"
        lines.append(f"  {clean(op.name, 34):<34} {seen:>8} {op.median_us:>19.1f} {spread:>19}")
    return "\n".join(lines) + "\n"


def _render_batch(batch: dict[str, Any] | None) -> list[str]:
    if batch is None:
        return []
    sizes = ", ".join(f"{size}: {n}" for size, n in batch["sizes"].items())
    return [
        f"  batch sizes (size: samples): {sizes}",
        f"  per request share of batch time p50 {batch['request_p50_ms']:.3f} ms"
        f"  p95 {batch['request_p95_ms']:.3f} ms",
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The report's options."""
    parser.add_argument(
        "files", nargs="+", metavar="FILE", help="JSON lines written by profkit ('-' reads stdin)"
    )
    parser.add_argument(
        "--top", type=int, help=f"op rows per label ({TOP_OPS}; on the --html page: 10)"
    )
    parser.add_argument("--json", action="store_true", help="the rollup as JSON")
    parser.add_argument(
        "--include-cold",
        action="store_true",
        help='count cold samples too (a label\'s first calls, marked "cold": true)',
    )


def run(args: argparse.Namespace) -> int:
    """Print the report for ``args.files``; 1 when one cannot be read or none holds samples.

    Lines that could not be read are skipped and counted on stderr.
    """
    unreadable: list[str] = []
    samples, skipped = read(lines(expand(args.files), unreadable))
    top = TOP_OPS if args.top is None else max(1, args.top)
    rollups = rollup(samples, top=top, include_cold=args.include_cold)
    if args.json:
        print(dumps([dataclasses.asdict(r) for r in rollups]))
    else:
        write(sys.stdout, render(rollups))
    for problem in unreadable:
        write(sys.stderr, f"profkit report: {problem}\n")
    cold = 0 if args.include_cold else sum(sample.cold for sample in samples)
    if cold:  # (as the HTML page's header says it)
        write(
            sys.stderr,
            f"profkit report: {cold} cold samples left out (--include-cold counts them)\n",
        )
    if skipped:
        noun = "line" if skipped == 1 else "lines"
        write(sys.stderr, f"profkit report: skipped {skipped} {noun} that could not be read\n")
    return 0 if rollups and not unreadable else 1
