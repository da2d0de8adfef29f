"""``python -m profkit report --html OUT.html FILE...``: the report as one self-contained page.

Inline CSS and SVG only: no script, no font, no image, no link off the page, so it opens
from disk and can be mailed or attached to a ticket. Per label: a histogram of the sampled
calls' durations (counts on a y axis, round ms ticks; the axis ends at the p99 or Tukey's far
fence p75 + 3 IQR, whichever is shorter, and the calls past it make one more bar, "> x ms"),
the verdict counts, and the op table over the samples (median self CPU time, p25-p75
spread, in how many samples each op appears; numbers never wrap, a long op name is cut
with an ellipsis and shown whole on hover). Per sample (the latest
:data:`SAMPLES_PER_LABEL` of each label): a waterfall of its regions on the profiler's own
timestamps (``start_us`` of each region, in µs after the call began) and its op table.
``--baseline OTHER`` (once per file or quoted glob) puts another set of samples beside them
("before" / "after"), side by side where the window is wide enough (a laptop's 1280 px).
The page fills the window up to 1600 px; its charts are as wide as the column.

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
import math
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
#: bins of the histogram's axis, about (the axis ends on a round number of ms)
_BINS = 40
#: the SVGs' width in their own units: they are drawn at the content column's width, text
#: at 11 px on a laptop's 1280 px window
_W = 1200
#: a waterfall's shortest time axis, in µs (a ns: profkit's timestamps' resolution); below
#: it (a file's 0 or subnormal times) the axis is 1 µs long
_MIN_TOTAL_US = 1e-3

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:1600px;padding:0 24px;
color:#1b1f24}
h1{font-size:22px}h2{font-size:18px;border-top:1px solid #d0d7de;padding-top:16px}
table{border-collapse:collapse;margin:8px 0;font-variant-numeric:tabular-nums}
td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #eaeef2;white-space:nowrap}
th{vertical-align:bottom}
td:first-child,th:first-child{text-align:left;font-family:ui-monospace,monospace}
table.ops{width:100%;max-width:900px}
.ops td:first-child{max-width:0;width:100%;overflow:hidden;text-overflow:ellipsis}
.meta{color:#57606a}.cols{display:flex;flex-wrap:wrap;gap:0 32px}
.cols>div{flex:1 1 480px;min-width:0}
details{margin:6px 0}summary{cursor:pointer;font-family:ui-monospace,monospace}
svg{display:block;width:100%;height:auto}svg text{font:11px system-ui,sans-serif;fill:#1b1f24}
.after{fill:#0969da}.before{fill:#bf8700}.region{fill:#54aeff}.root{fill:#d0d7de}
.grid{stroke:#eaeef2}.axis{stroke:#8c959f}
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
        f"<tr><td title='{_e(o.name)}'>{_e(o.name, 60)}</td><td>{o.samples}/{r.samples}</td>"
        f"<td>{o.median_us:.1f}</td><td>{o.p25_us:.1f}-{o.p75_us:.1f}</td></tr>"
        for o in r.ops
    )
    return (
        f"<p>{r.samples} samples, duration p50 {r.p50_ms:.3f} ms, p95 {r.p95_ms:.3f} ms<br>"
        f"verdicts: {verdicts}</p><table class=ops><tr><th>op</th><th>in samples</th>"
        f"<th>median self CPU µs</th><th>p25-p75</th></tr>{rows}</table>"
    )


def _histogram(mine: list[Sample], theirs: list[Sample]) -> str:
    """Counts of samples per duration bin (ms), with a y axis of counts and round ticks along
    x; the baseline's bars beside, in another colour. The x axis ends at the p99 or at
    Tukey's far fence (p75 + 3 IQR), whichever is shorter (rounded up to a tick): the calls past
    it are counted in one more bar, labelled "> x ms", so one outlier cannot squeeze every
    other call into a corner."""
    every = [s.duration_us / 1e3 for s in (*mine, *theirs)]
    if not every:
        return ""
    low, high, step = _axis(every)
    bins = max(1, round((high - low) / step)) * max(1, round(_BINS * step / (high - low)))
    width = (high - low) / bins
    series = [("after", mine), ("before", theirs)] if theirs else [("after", mine)]
    counts = {name: [0] * (bins + 1) for name, _ in series}  # the last one: beyond the axis
    for name, group in series:
        for s in group:
            value = s.duration_us / 1e3
            index = bins if value > high else min(bins - 1, max(0, int((value - low) / width)))
            counts[name][index] += 1
    beyond = int(any(c[bins] for c in counts.values()))  # 1: the overflow bar is drawn
    tallest = max(max(c) for c in counts.values()) or 1
    y_step = max(1, math.ceil(_round_step(tallest / 4)))
    y_top = y_step * math.ceil(tallest / y_step)
    left, top, base, height = 48, 8, 148, 186
    right = _W - (96 if beyond else 24)
    pitch = (right - left) / bins
    out = []
    for k in range(y_top // y_step + 1):
        y = base - (base - top) * k * y_step / y_top
        out.append(
            f"<line class=grid x1={left} x2={right} y1={y:.1f} y2={y:.1f} />"
            f"<text class=ytick x={left - 6} y={y + 4:.1f} text-anchor=end>{k * y_step}</text>"
        )
    digits = max(0, -math.floor(math.log10(step) + 1e-9))
    ticks = round((high - low) / step)
    for k in range(ticks + 1):
        x = left + (right - left) * k / ticks
        out.append(
            f"<line class=axis x1={x:.1f} x2={x:.1f} y1={base} y2={base + 4} />"
            f"<text class=xtick x={x:.1f} y={base + 16} text-anchor=middle>"
            f"{low + k * step:.{digits}f}</text>"
        )
    over, share = f"&gt; {high:.{digits}f} ms", 2 if theirs else 1
    for k, (name, _) in enumerate(series):
        for i, n in enumerate(counts[name][: bins + beyond]):
            h, w = (base - top) * n / y_top, (pitch if i < bins else 48) / share
            first, last = low + i * width, low + (i + 1) * width
            span = f"{first:.{digits + 2}f}-{last:.{digits + 2}f} ms" if i < bins else over
            x = (left + i * pitch if i < bins else right + 24) + k * w
            out.append(
                f"<rect class={name} x={x + 0.5:.1f} y={base - h:.1f} width={max(w - 1, 0.5):.1f}"
                f" height={h:.1f}><title>{name}: {n} samples, {span}</title></rect>"
            )
    if beyond:
        out.append(
            f"<text class=xtick x={right + 48} y={base + 16} text-anchor=middle>{over}</text>"
        )
    out.append(
        f"<line class=axis x1={left} x2={right} y1={base} y2={base} /><text x={(left + right) // 2}"
        f" y={height - 4} text-anchor=middle>call duration (ms)</text>"
    )
    legend = " (blue: after, yellow: before)" if theirs else ""
    fence = f"; the last bar: calls {over} (past the p99 or p75 + 3 IQR)" if beyond else ""
    return (
        f"<p class=meta>call duration: samples per bin{legend}{fence}</p>"
        f"<svg width={_W} height={height} viewBox='0 0 {_W} {height}' role=img>"
        f"{''.join(out)}</svg>"
    )


def _round_step(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is at least ``value`` (> 0)."""
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value * (1 - 1e-9))


def _axis(values: list[float]) -> tuple[float, float, float]:
    """(low, high, tick step) in ms of the histogram's x axis: round ticks from the shortest
    value (from 0 when that is near it) to the p99 or Tukey's far fence p75 + 3 IQR, whichever
    is shorter; a tenth of the value wide (1 µs at the least) when all values are alike."""
    q1, q3 = percentile(values, 25), percentile(values, 75)
    fence = q3 + 3 * max(q3 - q1, 0.05 * q3)
    first, last = min(values), min(percentile(values, 99), fence)
    if first < (last - first) / 3:
        first = 0.0
    step = _round_step(max(last - first, 0.1 * last, 1e-3) / 8)
    low = step * math.floor(first / step + 1e-9)
    high = max(step * math.ceil(last / step - 1e-9), low + 4 * step)
    return low, high, step


def _sample(s: Sample, opened: bool, top: int) -> str:
    event = s.event
    when = _e(event.get("start_time", ""), 40)
    head = f"{when} {s.duration_us / 1e3:.3f} ms {_e(s.verdict)}"
    ids = event.get("trace_id")
    trace = (
        f"<p class=meta>trace {_e(ids, 40)} span {_e(event.get('span_id'), 20)}</p>" if ids else ""
    )
    ops = sorted(s.ops.items(), key=lambda kv: -kv[1])[:top]
    rows = "".join(
        f"<tr><td title='{_e(n)}'>{_e(n, 60)}</td><td>{us:.1f}</td></tr>" for n, us in ops
    )
    table = f"<table class=ops><tr><th>op</th><th>self CPU µs</th></tr>{rows}</table>"
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
    height = rows * 22 + 18
    axis = f"<text x=10 y={height - 5}>0</text><text x={_W - 10} y={height - 5} text-anchor=end>"
    axis += f"{total / 1e3:.3f} ms</text>"
    return (
        f"<svg width={_W} height={height} viewBox='0 0 {_W} {height}' role=img>"
        f"{''.join(bars)}{axis}</svg>"
    )


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
