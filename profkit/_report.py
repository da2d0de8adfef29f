"""``python -m profkit report FILE...``: what many samples of each label say together.

Reads JSON lines, the ``"json"`` exporter's (``./scripts/demo --json``) or structlog's JSON
rendering of the ``"log"`` exporter's events, skipping every other line, and prints per
label: the number of samples, the call duration's p50 and p95, how many samples got each
verdict, and the top ops by median self CPU time over the samples that list them, with the
spread (p25-p75) and in how many samples each appears. ``--json`` prints the same as JSON.

One sample is noisy (a busy core, a page fault, a neighbour): read verdicts and op times as
counts and medians over many samples.

Percentiles are nearest-rank: the p-th of n sorted values is the ``ceil(p/100 * n)``-th.

Any input is read without raising: a line that looks like JSON but does not parse, and a
profkit event whose label, duration or op time is not what profkit writes (null, a string,
nan, inf, negative, out of range), is skipped and counted (one line on stderr at the end);
bytes that are not UTF-8 are read as U+FFFD; labels, verdicts and op names are printed
with control characters escaped (:func:`profkit._text.clean`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import io
import json
import math
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any

from ._text import clean

DESCRIPTION = """\
Roll up profkit's JSON lines (the json exporter's, or structlog's JSON of the log
exporter's events; other lines are skipped) per label: samples, call duration p50 and p95
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


@dataclasses.dataclass
class Sample:
    """One sampled call as read from a ``profkit.profile`` event (and its ``profkit.op`` ones)."""

    label: str
    duration_us: float
    verdict: str
    borderline: bool = False
    """The diagnosis said its confidence was low."""
    ops: dict[str, float] = dataclasses.field(default_factory=dict)
    """Self CPU µs per op name (the "other" row left out)."""
    cold: bool = False
    """One of its label's first calls (``"cold": true``): left out of the rollup unless asked."""
    shares: list[float] = dataclasses.field(default_factory=list)
    """A batch (``profkit.batch``): each member's share of it (empty for any other call)."""


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


_EVENTS = ("profkit.profile", "profkit.op")


def _events(lines: Iterable[str], bad: list[int]) -> Iterator[dict[str, Any]]:
    """The JSON objects among ``lines`` whose ``event`` is one of profkit's; ``bad[0]``
    counts the lines that look like JSON objects but do not parse."""
    for line in lines:
        text = line.strip()
        if not text.startswith("{"):
            continue
        try:
            event = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: nested past the limit
            bad[0] += 1
            continue
        if isinstance(event, dict) and event.get("event") in _EVENTS:
            yield event


def _number(value: Any) -> float | None:
    """A finite, non-negative JSON number as a float; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _key(value: Any) -> str | None:
    """A string (a label, a span id, a verdict) from a JSON string or number; else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def _op_time(row: Mapping[str, Any]) -> tuple[str, float] | None:
    """An op row's name and self CPU µs; None for the "other" row or one that cannot be read."""
    name = row.get("op")
    self_us = _number(row.get("self_cpu_us", 0.0))
    if not isinstance(name, str) or name == "other" or self_us is None:
        return None
    return name, self_us


def read(lines: Iterable[str]) -> tuple[list[Sample], int]:
    """Samples from profkit's JSON lines, in file order, and how many lines were skipped
    because they could not be read.

    A ``profkit.profile`` event's ``top_ops`` gives its ops (rows that cannot be read are
    left out); ``profkit.op`` events (the log exporter's) are added to the profile with the
    same ``span_id``, or else to the latest profile of their label.
    """
    bad = [0]
    samples: list[Sample] = []
    by_span: dict[str, Sample] = {}
    latest: dict[str, Sample] = {}
    for event in _events(lines, bad):
        label = _key(event.get("label", "?"))
        if event["event"] == "profkit.profile":
            duration = _number(event.get("duration_us", 0.0))
            if label is None or duration is None:
                bad[0] += 1
                continue
            verdict = _key(event.get("diagnosis")) or "none"
            sample = Sample(label, duration, verdict, event.get("diagnosis_confidence") == "low")
            sample.cold = event.get("cold") is True
            rows = event.get("top_ops")
            for row in rows if isinstance(rows, list) else ():
                _add_op(sample, row)
            members = event.get("batch_members")
            for member in members if isinstance(members, list) else ():
                share = _number(member.get("share")) if isinstance(member, Mapping) else None
                if share is not None and share <= 1.0:
                    sample.shares.append(share)
            samples.append(sample)
            latest[label] = sample
            span = _key(event.get("span_id"))
            if span:
                by_span[span] = sample
            continue
        if event.get("op") == "other":
            continue
        found = _op_time(event)
        if label is None or found is None:
            bad[0] += 1
            continue
        target = by_span.get(_key(event.get("span_id")) or "") or latest.get(label)
        if target is not None:
            target.ops[found[0]] = target.ops.get(found[0], 0.0) + found[1]
    return samples, bad[0]


def read_samples(lines: Iterable[str]) -> list[Sample]:
    """:func:`read`'s samples, without the count of skipped lines."""
    return read(lines)[0]


def _add_op(sample: Sample, row: Any) -> None:
    found = _op_time(row) if isinstance(row, Mapping) else None
    if found is not None:
        name, self_us = found
        sample.ops[name] = sample.ops.get(name, 0.0) + self_us


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
    parser.add_argument("--top", type=int, default=TOP_OPS, help=f"ops per label ({TOP_OPS})")
    parser.add_argument("--json", action="store_true", help="the rollup as JSON")
    parser.add_argument(
        "--include-cold",
        action="store_true",
        help='count cold samples too (a label\'s first calls, marked "cold": true)',
    )


def _open(path: str) -> contextlib.AbstractContextManager[IO[str]]:
    if path != "-":
        return open(path, encoding="utf-8", errors="replace")
    return _stdin()


@contextlib.contextmanager
def _stdin() -> Iterator[IO[str]]:
    """Standard input, bytes that are not UTF-8 read as U+FFFD; left open."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # a replaced stdin (a test's): read it as it is
        yield sys.stdin
        return
    wrapper = io.TextIOWrapper(buffer, encoding="utf-8", errors="replace")
    try:
        yield wrapper
    finally:
        wrapper.detach()  # not closing sys.stdin's buffer with it


def _lines(paths: list[str], unreadable: list[str]) -> Iterator[str]:
    """Every line of every file; a file that cannot be opened or read is noted and skipped."""
    for path in paths:
        try:
            with _open(path) as stream:
                yield from stream
        except OSError as exc:
            unreadable.append(f"cannot read {clean(path, _LIMIT)}: {exc.strerror or exc}")


def _write(stream: IO[str], text: str) -> None:
    """``text`` on ``stream``, with what its encoding cannot write as escapes."""
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "ascii"
        stream.write(text.encode(encoding, "backslashreplace").decode(encoding, "replace"))


def run(args: argparse.Namespace) -> int:
    """Print the report for ``args.files``; 1 when one cannot be read or none holds samples.

    Lines that could not be read are skipped and counted on stderr.
    """
    unreadable: list[str] = []
    samples, skipped = read(_lines(list(args.files), unreadable))
    rollups = rollup(samples, top=max(1, args.top), include_cold=args.include_cold)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rollups], indent=2))
    else:
        _write(sys.stdout, render(rollups))
    for problem in unreadable:
        _write(sys.stderr, f"profkit report: {problem}\n")
    if skipped:
        noun = "line" if skipped == 1 else "lines"
        _write(sys.stderr, f"profkit report: skipped {skipped} {noun} that could not be read\n")
    return 0 if rollups and not unreadable else 1
