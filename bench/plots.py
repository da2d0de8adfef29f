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
"""

from __future__ import annotations

import html
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

WIDTH = 800
_ROW = 26
_LEFT = 340
_COLOURS = ("#0969da", "#bf8700", "#1a7f37", "#cf222e", "#8250df")


def _svg(title: str, height: int, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="system-ui, sans-serif" font-size="12">'
        f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>'
        f'<text x="8" y="18" font-size="14" font-weight="bold">{html.escape(title)}</text>'
        + "".join(body)
        + "</svg>\n"
    )


def bars(
    title: str,
    rows: Sequence[tuple[str, float, float, float]],
    unit: str,
    note: str = "",
) -> str:
    """Horizontal bars: (name, median, q1, q3) per row, the IQR as a whisker."""
    top = max([r[3] for r in rows] + [r[1] for r in rows] + [1e-9])
    scale = (WIDTH - _LEFT - 70) / top
    body = []
    for i, (name, median, q1, q3) in enumerate(rows):
        y = 32 + i * _ROW
        body.append(
            f'<text x="{_LEFT - 8}" y="{y + 15}" text-anchor="end">{html.escape(name)}</text>'
            f'<rect x="{_LEFT}" y="{y + 4}" width="{max(median * scale, 1):.1f}" height="16" '
            f'fill="{_COLOURS[0]}"/>'
            f'<line x1="{_LEFT + q1 * scale:.1f}" x2="{_LEFT + q3 * scale:.1f}" y1="{y + 12}" '
            f'y2="{y + 12}" stroke="#1b1f24" stroke-width="1.5"/>'
            f'<text x="{_LEFT + max(median, q3) * scale + 6:.1f}" y="{y + 16}">'
            f"{_fmt(median)} {html.escape(unit)}</text>"
        )
    height = 40 + len(rows) * _ROW + (18 if note else 0)
    if note:
        body.append(f'<text x="8" y="{height - 8}" fill="#57606a">{html.escape(note)}</text>')
    return _svg(title, height, body)


def stacked(
    title: str,
    rows: Sequence[tuple[str, Sequence[float]]],
    parts: Sequence[str],
    unit: str,
) -> str:
    """Horizontal stacked bars: per row, one segment per part (medians), with a legend."""
    top = max([sum(max(v, 0.0) for v in values) for _, values in rows] + [1e-9])
    scale = (WIDTH - _LEFT - 70) / top
    body = []
    for i, (name, values) in enumerate(rows):
        y, x = 32 + i * _ROW, float(_LEFT)
        body.append(
            f'<text x="{_LEFT - 8}" y="{y + 15}" text-anchor="end">{html.escape(name)}</text>'
        )
        for k, value in enumerate(values):
            w = max(value, 0.0) * scale
            body.append(
                f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="16" '
                f'fill="{_COLOURS[k % len(_COLOURS)]}"><title>{html.escape(parts[k])}: '
                f"{value:.3f} {html.escape(unit)}</title></rect>"
            )
            x += w
        body.append(
            f'<text x="{x + 6:.1f}" y="{y + 16}">{_fmt(sum(values))} {html.escape(unit)}</text>'
        )
    y = 40 + len(rows) * _ROW
    for k, part in enumerate(parts):
        x, colour = 8 + k * (WIDTH - 16) / len(parts), _COLOURS[k % len(_COLOURS)]
        body.append(
            f'<rect x="{x:.1f}" y="{y}" width="12" height="12" fill="{colour}"/>'
            f'<text x="{x + 16:.1f}" y="{y + 10}">{html.escape(part)}</text>'
        )
    return _svg(title, y + 24, body)


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
