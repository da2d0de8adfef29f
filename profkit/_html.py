"""``python -m profkit report --html OUT.html FILE...``: the report as one self-contained page.

Inline CSS and SVG only: no script, no font, no image, no link off the page, so it opens
from disk and can be mailed or attached to a ticket. Per label: a histogram of the sampled
calls' durations, the verdict counts, and the op table over the samples (median self CPU
time, p25-p75 spread, in how many samples each op appears). Per sample (the latest
:data:`SAMPLES_PER_LABEL` of each label): a waterfall of its regions on the profiler's own
timestamps (``start_us`` of each region, in µs after the call began) and its op table.
``--baseline OTHER`` (once per file or quoted glob) puts another set of samples beside them
("before" / "after").

The page is the text report's rollup: cold samples are left out of all of it (header,
tables, histograms, waterfalls) unless ``--include-cold``; ``--top N`` sets the op rows of
each table (:data:`TOP` without it). A file that cannot be read, or input with no sample to
show, writes no page (an existing one is left as it was) and exits 1.

Everything the page prints from the files is HTML-escaped and cleaned of control
characters (:func:`profkit._text.clean`).
"""

from __future__ import annotations

import argparse
import html
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ._jsonlines import expand
from ._jsonlines import lines as _lines
from ._jsonlines import write as _write
from ._report import LabelRollup, Sample, percentile, read, rollup
from ._text import clean

__all__ = ["MAX_LABELS", "SAMPLES_PER_LABEL", "add_arguments", "page", "run"]

#: samples per label drawn as waterfalls (the latest ones); the histogram and the op table
#: use every sample
SAMPLES_PER_LABEL = 50
#: samples per label shown unfolded (the latest)
OPEN = 2
#: labels with a section of their own: those with the most samples (the text report's order;
#: a fleet's log of thousands of labels made pages of ~30 kB a label, 92 MB for 3,000)
MAX_LABELS = 100
#: op rows per label table and per sample (``--top`` changes it)
TOP = 10
_BINS = 24
_W = 760  # the SVGs' width in px (the content column)
#: a waterfall's shortest time axis, in µs (a ns: profkit's timestamps' resolution); below
#: it (a file's 0 or subnormal times) the axis is 1 µs long
_MIN_TOTAL_US = 1e-3

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:820px;color:#1b1f24}
h1{font-size:22px}h2{font-size:18px;border-top:1px solid #d0d7de;padding-top:16px}
table{border-collapse:collapse;margin:8px 0;font-variant-numeric:tabular-nums}
td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #eaeef2}
td:first-child,th:first-child{text-align:left;font-family:ui-monospace,monospace}
.meta{color:#57606a}.cols{display:flex;gap:16px}.cols>div{flex:1;min-width:0}
details{margin:6px 0}summary{cursor:pointer;font-family:ui-monospace,monospace}
svg{display:block;max-width:100%}svg text{font:11px system-ui,sans-serif;fill:#1b1f24}
.after{fill:#0969da}.before{fill:#bf8700}.region{fill:#54aeff}.root{fill:#d0d7de}
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--html OUT`` and ``--baseline OTHER`` (on the report's parser)."""
    parser.add_argument("--html", metavar="OUT", help="write the report as one HTML page")
    parser.add_argument(
        "--baseline",
        action="append",
        metavar="OTHER",
        help="with --html: a file or quoted glob of samples to show beside FILE's, as"
        " 'before' (repeat it for more)",
    )


def refused(args: argparse.Namespace) -> str | None:
    """Why the report's options do not go together (None: they do)."""
    if args.baseline and not args.html:
        return (
            "--baseline needs --html (the page shows OTHER beside FILE); to compare two"
            " runs as text: python -m profkit diff BEFORE AFTER"
        )
    if args.html and args.json:
        return "argument --json: not allowed with --html (one output at a time)"
    return None


def run(args: argparse.Namespace) -> int:
    """Write the page to ``args.html``; 1, and no page written (an existing one kept), when a
    file cannot be read or there is no sample to show."""
    unreadable: list[str] = []
    top = TOP if args.top is None else max(1, args.top)
    after, skipped = read(_lines(expand(args.files), unreadable))
    before, skipped_before = read(_lines(expand(args.baseline or []), unreadable))
    shown = _kept(after, args.include_cold)
    for problem in unreadable:
        _write(sys.stderr, f"profkit report: {problem}\n")
    if skipped + skipped_before:
        noun = "line" if skipped + skipped_before == 1 else "lines"
        _write(
            sys.stderr,
            f"profkit report: skipped {skipped + skipped_before} {noun} that could not be read\n",
        )
    if unreadable or not shown:
        if not unreadable:  # as the text report says it
            cold = len(after) - len(shown)
            hint = f" ({cold} cold samples: --include-cold counts them)" if cold else ""
            _write(sys.stderr, f"profkit report: no profkit.profile events found{hint}\n")
        _write(sys.stderr, f"profkit report: {clean(args.html, 200)} not written\n")
        return 1
    text = page(after, before, " ".join(args.files), top=top, include_cold=args.include_cold)
    try:
        with open(args.html, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as exc:
        problem = f"cannot write {clean(args.html, 200)}: {exc.strerror or exc}"
        _write(sys.stderr, f"profkit report: {problem}\n")
        return 1
    return 0


def _kept(samples: Sequence[Sample], include_cold: bool) -> list[Sample]:
    """The samples the rollup counts: cold ones only with ``include_cold``."""
    return [s for s in samples if include_cold or not s.cold]


def _e(value: object, limit: int = 200) -> str:
    return html.escape(clean(str(value), limit), quote=True)


def page(
    samples: Sequence[Sample],
    baseline: Sequence[Sample] = (),
    title: str = "",
    *,
    top: int = TOP,
    include_cold: bool = False,
) -> str:
    """The whole page for ``samples`` (and ``baseline``, shown as "before"): the rollup
    :func:`profkit._report.rollup` gives, ``top`` op rows a table, cold samples left out of
    every part of it unless ``include_cold``."""
    kept, kept_before = _kept(samples, include_cold), _kept(baseline, include_cold)
    now = {r.label: r for r in rollup(kept, top=top, include_cold=True)}
    then = {r.label: r for r in rollup(kept_before, top=top, include_cold=True)}
    cold = len(samples) - len(kept) + len(baseline) - len(kept_before)
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>profkit report {_e(title, 120)}</title><style>{_CSS}</style></head><body>",
        "<h1>profkit report</h1>",
        f"<p class=meta>{len(kept)} samples of {len(now)} labels from {_e(title, 300)}"
        + (f"; baseline: {len(kept_before)} samples" if baseline else "")
        + (f"; {cold} cold samples left out (--include-cold counts them)" if cold else "")
        + ". One sample is noisy: read medians and counts over many.</p>",
    ]
    labels = list(now) + [label for label in then if label not in now]
    left_out = len(labels) - MAX_LABELS
    if left_out > 0:
        labels = labels[:MAX_LABELS]
        parts.append(
            f"<p class=meta>The {MAX_LABELS} labels with the most samples are shown; "
            f"{left_out} more labels are not (python -m profkit report FILE lists every "
            "label as text).</p>"
        )
    by_label: dict[str, list[Sample]] = {}
    for s in kept:
        by_label.setdefault(s.label, []).append(s)
    for number, label in enumerate(labels, 1):
        mine = by_label.get(label, [])
        section = _label_section(label, now.get(label), then.get(label), mine, kept_before, top)
        parts.append(f"<section id=label-{number}>{section}</section>")
    parts.append("</body></html>\n")
    return "".join(parts)


def _label_section(
    label: str,
    now: LabelRollup | None,
    then: LabelRollup | None,
    mine: list[Sample],
    baseline: Sequence[Sample],
    top: int,
) -> str:
    theirs = [s for s in baseline if s.label == label]
    out = [f"<h2>{_e(label)}</h2>"]
    out.append(_histogram(mine, theirs))
    if then is None:
        out.append(_summary(now))
    else:
        out.append(
            "<div class=cols><div><h3>before</h3>"
            + _summary(then)
            + "</div><div><h3>after</h3>"
            + _summary(now)
            + "</div></div>"
        )
    if mine:
        shown = mine[-SAMPLES_PER_LABEL:]
        out.append(f"<h3>samples ({len(shown)} latest of {len(mine)})</h3>")
        out.extend(_sample(s, i < OPEN, top) for i, s in enumerate(reversed(shown)))
    return "".join(out)


def _summary(r: LabelRollup | None) -> str:
    if r is None:
        return "<p class=meta>no samples</p>"
    verdicts = ", ".join(
        f"{_e(v)} {n}" + (f" ({r.borderline[v]} borderline)" if v in r.borderline else "")
        for v, n in r.verdicts.items()
    )
    rows = "".join(
        f"<tr><td>{_e(o.name, 60)}</td><td>{o.samples}/{r.samples}</td>"
        f"<td>{o.median_us:.1f}</td><td>{o.p25_us:.1f}-{o.p75_us:.1f}</td></tr>"
        for o in r.ops
    )
    return (
        f"<p>{r.samples} samples, duration p50 {r.p50_ms:.3f} ms, p95 {r.p95_ms:.3f} ms<br>"
        f"verdicts: {verdicts}</p><table><tr><th>op</th><th>in samples</th>"
        f"<th>median self CPU µs</th><th>p25-p75</th></tr>{rows}</table>"
    )


def _histogram(mine: list[Sample], theirs: list[Sample]) -> str:
    """Counts of samples per duration bin (ms); the baseline's bars behind, in another colour."""
    every = [s.duration_us / 1e3 for s in (*mine, *theirs)]
    if not every:
        return ""
    # the axis ends at 3x the p95 (the last bin holds the samples beyond): one outlier must
    # not squeeze every other sample into the first bin
    low, high = 0.0, max(min(percentile(every, 100), 3 * percentile(every, 95)), 1e-3)
    width = high / _BINS
    beyond = sum(1 for d in every if d > high)
    series = [("after", mine), ("before", theirs)] if theirs else [("after", mine)]
    counts = {
        name: [sum(1 for s in group if _bin(s.duration_us / 1e3, width) == i) for i in range(_BINS)]
        for name, group in series
    }
    top = max(max(c) for c in counts.values()) or 1
    height, base, step = 120, 100, (_W - 40) / _BINS
    bars = []
    for k, (name, _) in enumerate(series):
        for i, n in enumerate(counts[name]):
            h = base * n / top
            x = 30 + i * step + (step / 2 if k else 0)
            w = step / (2 if theirs else 1) - 1
            span = f"{low + i * width:.3f}-{low + (i + 1) * width:.3f} ms"
            bars.append(
                f"<rect class={name} x={x:.1f} y={base - h + 4:.1f} width={w:.1f} "
                f"height={h:.1f}><title>{name}: {n} samples, {span}</title></rect>"
            )
    more = f" (+{beyond} beyond, in the last bin)" if beyond else ""
    axis = (
        f"<text x=30 y={height - 2}>0 ms</text>"
        f"<text x={_W - 10} y={height - 2} text-anchor=end>{high:.3f} ms{more}</text>"
        f"<text x={_W // 2} y={height - 2} text-anchor=middle>tallest bar: {top}</text>"
    )
    legend = " (blue: after, yellow: before)" if theirs else ""
    return (
        f"<p class=meta>call duration, samples per bin{legend}</p>"
        f"<svg width={_W} height={height} viewBox='0 0 {_W} {height}' role=img>"
        f"{''.join(bars)}{axis}</svg>"
    )


def _bin(value: float, width: float) -> int:
    return min(_BINS - 1, int(value / width)) if width > 0 else 0


def _sample(s: Sample, opened: bool, top: int) -> str:
    event = s.event
    when = _e(event.get("start_time", ""), 40)
    head = f"{when} {s.duration_us / 1e3:.3f} ms {_e(s.verdict)}"
    ids = event.get("trace_id")
    trace = (
        f"<p class=meta>trace {_e(ids, 40)} span {_e(event.get('span_id'), 20)}</p>" if ids else ""
    )
    ops = sorted(s.ops.items(), key=lambda kv: -kv[1])[:top]
    rows = "".join(f"<tr><td>{_e(n, 60)}</td><td>{us:.1f}</td></tr>" for n, us in ops)
    table = f"<table><tr><th>op</th><th>self CPU µs</th></tr>{rows}</table>"
    fold = "<details open>" if opened else "<details>"
    return f"{fold}<summary>{head}</summary>{trace}{_waterfall(s, event)}{table}</details>"


def _regions(event: Mapping[str, Any]) -> list[tuple[str, float, float, int]]:
    """(name, start µs, duration µs, depth) of each region of a profile event; regions
    without a start (files written before 0.2) are laid end to end under their parent."""
    raw = event.get("regions")
    rows = [r for r in raw if isinstance(r, Mapping)] if isinstance(raw, list) else []
    depth = {0: 0}
    cursor: dict[int, float] = {}
    out = []
    for index, r in enumerate(rows, 1):
        given = r.get("parent")
        parent = given if isinstance(given, int) else 0
        duration = _num(r.get("duration_us"))
        start = _num(r.get("start_us"), cursor.get(parent, 0.0))
        cursor[parent] = start + duration
        depth[index] = depth.get(parent, 0) + 1
        out.append((str(r.get("region", "?")), start, duration, depth[index]))
    return out


def _num(value: Any, default: float = 0.0) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    return float(value) if ok and 0 <= value < 1e15 else default


def _waterfall(s: Sample, event: Mapping[str, Any]) -> str:
    """The call as a bar, its regions as bars below it, on the profiler's timestamps."""
    regions = _regions(event)
    total = max([s.duration_us, *(a + d for _, a, d, _ in regions)])
    if total < _MIN_TOTAL_US:  # 0, or so small (subnormal) that the scale would be inf
        total = 1.0
    rows = 1 + max([d for *_, d in regions] or [0])
    scale = (_W - 20) / total
    bars = [_bar("root", 10, 0, total * scale, f"{s.label} {s.duration_us / 1e3:.3f} ms", s.label)]
    for name, start, duration, depth in regions:
        tip = f"{name}: {duration / 1e3:.3f} ms, from {start / 1e3:.3f} ms"
        bars.append(_bar("region", 10 + start * scale, depth, duration * scale, tip, name))
    height = rows * 22 + 16
    axis = f"<text x=10 y={height - 2}>0</text><text x={_W - 10} y={height - 2} text-anchor=end>"
    axis += f"{total / 1e3:.3f} ms</text>"
    return f"<svg width={_W} height={height} role=img>{''.join(bars)}{axis}</svg>"


def _bar(kind: str, x: float, row: int, width: float, tip: str, name: str) -> str:
    y = row * 22
    fits = int((width - 6) / 6.5)  # characters of 11 px text that fit in the bar
    label = (
        _e(name if len(name) <= fits else name[: max(fits - 1, 0)] + "…", 60) if fits > 3 else ""
    )
    return (
        f"<g><rect class={kind} x={x:.1f} y={y} width={max(width, 1.0):.1f} height=20>"
        f"<title>{_e(tip, 240)}</title></rect><text x={x + 3:.1f} y={y + 14}>{label}</text></g>"
    )
