"""SVG plots of the benchmark results, written by our own small code (no plotting library).

    .venv/bin/python bench/plots.py bench/out/results.json docs/images/bench

``bench/run.py`` writes them next to its results (``bench/out/``) and, on a full run that
updates docs/performance.md, into ``docs/images/bench/``, which that page shows:

* ``off_sample.svg``: what each off-sample variant adds to a call, against raw
  ``record_function`` and the bare call (ns, median with the interquartile range);
* ``window_parts.svg``: what one sampled call costs on the request path, by part (torch's
  profiler start/stop, profkit beyond it, recording), per model and top_k;
* ``window_cost.svg``: one sampled call's process CPU beyond the bare call, torch's raw
  start+call+stop against profkit's by thread (request thread less the call itself, export
  worker, exporter threads);
* ``throughput.svg``: end-to-end requests per second by sampling rate, against the same
  service without profkit.

No text leaves a plot: widths are bounded from above (:func:`text_width`), titles and notes
wrap, the name and value columns are as wide as their longest text, and a plot is made
wider than :data:`WIDTH` where its names need it (tests/test_site.py renders them in
Chromium).
"""

from __future__ import annotations

import html
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

WIDTH = 800  # at least; a plot whose labels need more is wider (its viewBox with it)
_ROW = 26
_COLOURS = ("#0969da", "#bf8700", "#1a7f37", "#cf222e", "#8250df")
_SIZE, _TITLE_SIZE = 12, 14
_MIN_BARS = 260  # px the bars get at the least
#: characters narrower or wider than most, for :func:`text_width`
_NARROW, _WIDE = set("fijlrtI.,:;'|!()[]{} "), set("mwMW@%")


def text_width(text: str, size: float, bold: bool = False) -> float:
    """An upper bound of ``text``'s width in px at ``size``: per character, a width at least
    that of DejaVu Sans (what "system-ui, sans-serif" is on Debian, and among the widest
    sans-serif fonts), 12% more in bold. Layout uses it so no text can leave the viewBox."""
    em = 0.0
    for c in text:
        if c in _NARROW:
            em += 0.42
        elif c in _WIDE:
            em += 1.0
        elif c.isupper():
            em += 0.8
        else:
            em += 0.66
    return em * size * (1.12 if bold else 1.0)


def wrap(text: str, size: float, room: float, bold: bool = False) -> list[str]:
    """``text`` in lines no wider than ``room`` px (by :func:`text_width`), broken at
    spaces (a word longer than the room gets a line of its own)."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and text_width(f"{lines[-1]} {word}", size, bold) <= room:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    return lines or [""]


def _title(title: str, width: float) -> tuple[list[str], int]:
    """The title's lines, and the y the plot's first row starts at below them."""
    lines = wrap(title, _TITLE_SIZE, width - 16, bold=True)
    return [
        f'<text x="8" y="{18 + 18 * i}" font-size="{_TITLE_SIZE}" font-weight="bold">'
        f"{html.escape(line)}</text>"
        for i, line in enumerate(lines)
    ], 14 + 18 * len(lines)


def _note(note: str, width: float, y: float) -> tuple[list[str], float]:
    """The note's lines (grey) from ``y`` down, and the y below them."""
    lines = wrap(note, _SIZE, width - 16) if note else []
    body = [
        f'<text x="8" y="{y + 12 + 16 * i:.0f}" fill="#57606a">{html.escape(line)}</text>'
        for i, line in enumerate(lines)
    ]
    return body, y + 16 * len(lines) + (6 if lines else 0)


def _columns(names: Sequence[str], values: Sequence[str]) -> tuple[float, float]:
    """(x where the bars start, the plot's width): room for the longest name on the left and
    the longest value label on the right, and at least :data:`_MIN_BARS` px of bars."""
    left = max([text_width(n, _SIZE) for n in names] + [100.0]) + 16
    right = max([text_width(v, _SIZE) for v in values] + [0.0]) + 6 + 10
    return left, max(float(WIDTH), left + _MIN_BARS + right)


def _svg(width: float, height: float, body: list[str]) -> str:
    w, h = f"{width:.0f}", f"{height:.0f}"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" font-family="system-ui, sans-serif" font-size="{_SIZE}">'
        f'<rect width="{w}" height="{h}" fill="#ffffff"/>' + "".join(body) + "</svg>\n"
    )


def bars(
    title: str,
    rows: Sequence[tuple[str, float, float, float]],
    unit: str,
    note: str = "",
) -> str:
    """Horizontal bars: (name, median, q1, q3) per row, the IQR as a whisker."""
    labels = [f"{_fmt(r[1])} {unit}" for r in rows]
    left, width = _columns([r[0] for r in rows], labels)
    room = width - left - (max([text_width(v, _SIZE) for v in labels] + [0.0]) + 16)
    top = max([r[3] for r in rows] + [r[1] for r in rows] + [1e-9])
    scale = room / top
    body, start = _title(title, width)
    for i, ((name, median, q1, q3), label) in enumerate(zip(rows, labels, strict=True)):
        y = start + i * _ROW
        body.append(
            f'<text x="{left - 8:.0f}" y="{y + 15}" text-anchor="end">{html.escape(name)}</text>'
            f'<rect x="{left:.0f}" y="{y + 4}" width="{max(median * scale, 1):.1f}" height="16" '
            f'fill="{_COLOURS[0]}"/>'
            f'<line x1="{left + q1 * scale:.1f}" x2="{left + q3 * scale:.1f}" y1="{y + 12}" '
            f'y2="{y + 12}" stroke="#1b1f24" stroke-width="1.5"/>'
            f'<text x="{left + max(median, q3, 0.0) * scale + 6:.1f}" y="{y + 16}">'
            f"{html.escape(label)}</text>"
        )
    lines, height = _note(note, width, start + len(rows) * _ROW + 4)
    body.extend(lines)
    return _svg(width, height + 4, body)


def stacked(
    title: str,
    rows: Sequence[tuple[str, Sequence[float]]],
    parts: Sequence[str],
    unit: str,
) -> str:
    """Horizontal stacked bars: per row, one segment per part (medians), with a legend."""
    labels = [f"{_fmt(sum(values))} {unit}" for _, values in rows]
    left, width = _columns([name for name, _ in rows], labels)
    room = width - left - (max([text_width(v, _SIZE) for v in labels] + [0.0]) + 16)
    top = max([sum(max(v, 0.0) for v in values) for _, values in rows] + [1e-9])
    scale = room / top
    body, start = _title(title, width)
    for i, ((name, values), label) in enumerate(zip(rows, labels, strict=True)):
        y, x = start + i * _ROW, left
        body.append(
            f'<text x="{left - 8:.0f}" y="{y + 15}" text-anchor="end">{html.escape(name)}</text>'
        )
        for k, value in enumerate(values):
            w = max(value, 0.0) * scale
            body.append(
                f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="16" '
                f'fill="{_COLOURS[k % len(_COLOURS)]}"><title>{html.escape(parts[k])}: '
                f"{value:.3f} {html.escape(unit)}</title></rect>"
            )
            x += w
        body.append(f'<text x="{x + 6:.1f}" y="{y + 16}">{html.escape(label)}</text>')
    y, x = start + len(rows) * _ROW + 8, 8.0
    for k, part in enumerate(parts):
        item = 16 + text_width(part, _SIZE) + 24
        if x > 8 and x + item > width - 8:  # the legend goes on on a new line
            y, x = y + 20, 8.0
        body.append(
            f'<rect x="{x:.1f}" y="{y}" width="12" height="12" '
            f'fill="{_COLOURS[k % len(_COLOURS)]}"/>'
            f'<text x="{x + 16:.1f}" y="{y + 10}">{html.escape(part)}</text>'
        )
        x += item
    return _svg(width, y + 22, body)


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _when(result: dict[str, Any]) -> str:
    """Where the numbers come from: the machine and its load while the section ran."""
    m, load = result.get("machine", {}), result.get("loadavg", [])
    where = f"{m.get('cores', '?')} cores, torch {m.get('torch', '?')}"
    return f"{where}, 1-min load {min(load):.1f}-{max(load):.1f}" if load else where


def _spread(s: dict[str, float]) -> tuple[float, float, float]:
    return s["median"], s["q1"], s["q3"]


def off_sample(result: dict[str, Any]) -> str:
    rows = [(name, *_spread(s)) for name, s in result["rows_ns"].items()]
    ratio = result["ratio_to_record_function"]["median"]
    note = f"@profiled adds {ratio:.2f}x what raw record_function adds; {_when(result)}"
    return bars("Off-sample cost per call (CPU ns, median, IQR)", rows, "ns", note)


def window_parts(result: dict[str, Any]) -> str:
    keys = ("raw_overhead_ms", "profkit_extra_ms", "recording_ms")
    parts = ("torch profiler start/stop", "profkit beyond torch", "recording the call")
    rows = [
        (f"{r['model']}, top_k {r['top_k']} ({r['events']} events)", [r[k]["median"] for k in keys])
        for r in result["rows"]
    ]
    title = f"One sampled call on the request path, by part (ms, medians; {_when(result)})"
    return stacked(title, rows, parts, "ms")


def window_cost(result: dict[str, Any]) -> str:
    threads = result["threads"]
    bare = result["us"]["bare"]["median"]
    names = ("MainThread", "profkit-export", "profkit-otel", "profkit-log")
    parts = ("request thread", "export worker", "span exporter", "log exporter", "other")
    mine = [threads.get(n, {"median": 0.0})["median"] for n in names]
    mine[0] = max(mine[0] - bare, 0.0)  # the request thread's figure includes the call
    rest = result["us"]["profkit"]["median"] - sum(mine)
    torch_raw = result["us"]["torch raw"]["median"]
    rows = [
        ("torch raw start+call+stop", [torch_raw, 0.0, 0.0, 0.0, 0.0]),
        ("profkit sampled call + export", [*mine, max(rest, 0.0)]),
    ]
    ratio = result["ratio"]["median"]
    title = f"One window's process CPU beyond the call (µs, medians; {ratio:.2f}x; {_when(result)})"
    return stacked(title, rows, parts, "µs")


def throughput(result: dict[str, Any], labels: dict[str, str]) -> str:
    rows = [(labels.get(mode, mode), *_spread(r["rps"])) for mode, r in result["rows"].items()]
    title = "End to end: requests per second by sampling rate (median, IQR)"
    return bars(title, rows, "req/s", f"uvicorn + FastAPI, MLP; {_when(result)}")


def write_all(results: dict[str, dict[str, Any]], folder: Path) -> list[Path]:
    """The plots the results allow (a section not run: its plot is not written)."""
    folder.mkdir(parents=True, exist_ok=True)
    made: dict[str, str] = {}
    if "overhead" in results:
        made["off_sample.svg"] = off_sample(results["overhead"])
    if "sampled" in results:
        made["window_parts.svg"] = window_parts(results["sampled"])
    if "window_cost" in results:
        made["window_cost.svg"] = window_cost(results["window_cost"])
    if "e2e" in results:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from e2e import LABELS

        made["throughput.svg"] = throughput(results["e2e"], LABELS)
    for name, text in made.items():
        (folder / name).write_text(text, encoding="utf-8")
    return [folder / name for name in made]


if __name__ == "__main__":
    source, target = Path(sys.argv[1]), Path(sys.argv[2])
    for path in write_all(json.loads(source.read_text(encoding="utf-8")), target):
        print(path)
