"""``python -m profkit report --html``: one self-contained page, checked as text and in a real
headless Chromium (Debian's ``chromium``; skipped with a reason where it is missing).

The Chromium test keeps its screenshot in ``build/artifacts/html-report.png`` (CI keeps
``build/artifacts/``).
"""

from __future__ import annotations

import html
import io
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

import profkit
from profkit import __main__ as cli
from profkit._html import page
from profkit._report import read
from profkit.exporters.console import JsonLinesExporter
from profkit.testing import capture

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "build" / "artifacts"

torch.manual_seed(0)
MODEL = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


@profkit.profiled("predict")
def predict(x: torch.Tensor) -> list[int]:
    """Three regions around a small model."""
    with profkit.region("preprocess"):
        x = (x - x.mean()) / (x.std() + 1e-6)
    with profkit.region("inference"), torch.no_grad():
        logits = MODEL(x)
    with profkit.region("postprocess"):
        return [int(i) for i in logits.argmax(dim=1)]


def _json_lines(calls: int) -> str:
    """The json exporter's lines for ``calls`` sampled calls of ``predict``."""
    out = io.StringIO()
    settings = {
        "sample_every": 1,
        "max_overhead": 1.0,
        # room for every window: the report is under test, not the back-pressure (with the
        # default 16, a worker slower than this loop skips calls as skipped_backlog)
        "queue_size": 200,
        "extra_exporters": (JsonLinesExporter(out),),
    }
    with capture(**settings):
        for _ in range(calls):
            predict(torch.randn(32, 64))
        assert profkit.force_flush(60.0)
    return out.getvalue()


@pytest.fixture(scope="module")
def run_lines() -> str:
    """100 samples of a real run, as JSON lines."""
    return _json_lines(100)


_EXTERNAL = re.compile(r"""(?:src|href)\s*=|url\(|@import|<script|<link|https?://""", re.I)


def test_page_of_100_samples_is_self_contained_and_small(run_lines: str, tmp_path: Path) -> None:
    """100 samples: waterfalls (SVG) with the regions and op names, no external reference,
    under 3 MB; written by ``python -m profkit report --html``."""
    src, out = tmp_path / "run.jsonl", tmp_path / "report.html"
    src.write_text(run_lines, encoding="utf-8")
    assert 0 == cli.main(["report", "--html", str(out), str(src)])
    text = out.read_text(encoding="utf-8")
    assert 100 == len(read(run_lines.splitlines())[0])
    assert len(text.encode()) < 3_000_000
    assert [] == _EXTERNAL.findall(text)
    assert text.count("<svg") == 1 + 50  # the histogram, the 50 latest samples' waterfalls
    for name in ("predict", "preprocess", "inference", "postprocess", "aten::addmm"):
        assert name in text
    assert "100 samples, duration p50" in text


def test_globs_are_read_and_empty_input_is_said(
    run_lines: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Quoted globs work as for the text report and diff (files and ``--baseline``); input
    with no samples says so on stderr, exits 1 and writes no page."""
    half = run_lines.splitlines(keepends=True)
    (tmp_path / "a.jsonl").write_text("".join(half[:50]), encoding="utf-8")
    (tmp_path / "b.jsonl").write_text("".join(half[50:]), encoding="utf-8")
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    out = tmp_path / "report.html"
    pattern = str(tmp_path / "*.jsonl")
    assert 0 == cli.main(["report", "--html", str(out), pattern, "--baseline", pattern])
    assert "100 samples, duration p50" in out.read_text(encoding="utf-8")
    capsys.readouterr()
    empty_out = tmp_path / "empty.html"
    assert 1 == cli.main(["report", "--html", str(empty_out), str(tmp_path / "empty.txt")])
    assert "no profkit.profile events found" in capsys.readouterr().err
    assert not empty_out.exists()


def test_baseline_is_shown_beside(run_lines: str) -> None:
    """``--baseline``: the label's rollup twice, "before" and "after", histograms overlaid."""
    samples = read(run_lines.splitlines())[0]
    text = page(samples[50:], samples[:50])
    assert ("<h3>before</h3>", "<h3>after</h3>") == (
        text[text.index("<h3>before") :][:15],
        text[text.index("<h3>after") :][:14],
    )
    assert "class=before" in text
    assert "class=after" in text
    assert 2 == text.count("50 samples, duration p50")


def test_what_the_files_say_is_escaped() -> None:
    """A label or op name with markup in it is shown as text, never as markup."""
    line = (
        '{"event": "profkit.profile", "label": "<script>x</script>", "duration_us": 10,'
        ' "regions": [{"region": "<b>r</b>", "start_us": 1, "duration_us": 5, "parent": 0}],'
        ' "top_ops": [{"op": "<img src=x>", "self_cpu_us": 3}]}'
    )
    text = page(read([line])[0])
    assert "<script>x" not in text
    assert "<img" not in text
    assert "<b>r" not in text
    assert "&lt;script&gt;x&lt;/script&gt;" in text
    assert "&lt;img src=x&gt;" in text


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return path


def _headless(browser: str, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=900,1400",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _console(stderr: str) -> list[str]:
    """The page's console messages in Chromium's log (``INFO:CONSOLE:1] "..."``)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.timeout(300)
def test_page_renders_in_chromium_without_console_errors(run_lines: str, tmp_path: Path) -> None:
    """Headless Chromium renders the page (the DOM has the waterfalls), logs nothing on its
    console (a page that logs is caught: the check can fail), and a screenshot is kept."""
    browser = _chromium()
    out = tmp_path / "report.html"
    out.write_text(page(read(run_lines.splitlines())[0]), encoding="utf-8")
    dom = _headless(browser, out.as_uri(), "--dump-dom")
    assert 0 == dom.returncode, dom.stderr[-2000:]
    assert [] == _console(dom.stderr)
    assert dom.stdout.count("<svg") == 51
    assert "postprocess" in dom.stdout
    bad = tmp_path / "bad.html"
    bad.write_text("<script>console.error('boom')</script>", encoding="utf-8")
    assert 1 == len(_console(_headless(browser, bad.as_uri(), "--dump-dom").stderr))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "html-report.png"
    shot.unlink(missing_ok=True)
    taken = _headless(browser, out.as_uri(), f"--screenshot={shot}")
    assert 0 == taken.returncode, taken.stderr[-2000:]
    assert shot.stat().st_size > 10_000


def _event(label: str, duration_us: float, *, cold: bool = False) -> str:
    """A json exporter's line: one region, 12 ops (more than any page's op table shows)."""
    rows = [{"op": f"aten::op{i:02}", "self_cpu_us": 100.0 - i} for i in range(12)]
    region = {"region": "encode", "start_us": 1.0, "duration_us": duration_us / 2, "parent": 0}
    event = {"event": "profkit.profile", "label": label, "duration_us": duration_us}
    return json.dumps({**event, "cold": cold, "regions": [region], "top_ops": rows}) + "\n"


def _counts(text: str) -> dict[str, Any]:
    """What the page says about how many samples it shows, in each of the places it says it."""
    header = re.findall(r"<p class=meta>(\d+) samples of (\d+) labels", text)
    return {
        "header": header,
        "baseline": re.findall(r"baseline: (\d+) samples", text),
        "labels": re.findall(r"<h2>([^<]*)</h2>", text),
        "tables": re.findall(r"<p>(\d+) samples, duration", text),
        "lists": re.findall(r"<h3>samples \((\d+) latest of (\d+)\)</h3>", text),
        "histogram": sum(int(n) for n in re.findall(r"after: (\d+) samples", text)),
        "waterfalls": text.count("<svg") - text.count("samples per bin"),
    }


def test_cold_samples_are_left_out_everywhere_unless_included(tmp_path: Path) -> None:
    """The page is the text report's rollup: cold samples left out of the header, the
    label tables, the histograms and the sample lists alike (a cold-only label is not
    counted), and all of them counted with ``--include-cold``. (The header once counted
    31 samples where the label table said 20.)"""
    src, base, out = tmp_path / "cold.jsonl", tmp_path / "base.jsonl", tmp_path / "cold.html"
    warm = [_event("predict", 1000.0 + i) for i in range(20)]
    cold = [_event("predict", 5000.0, cold=True)] * 10 + [_event("only_cold", 9.0, cold=True)]
    src.write_text("".join(cold[:10] + warm + cold[10:]), encoding="utf-8")
    base.write_text("".join(warm[:5] + cold[:3]), encoding="utf-8")
    assert 0 == cli.main(["report", "--html", str(out), str(src), "--baseline", str(base)])
    assert {
        "header": [("20", "1")],
        "baseline": ["5"],
        "labels": ["predict"],
        "tables": ["5", "20"],  # before, after
        "lists": [("20", "20")],
        "histogram": 20,
        "waterfalls": 20,
    } == _counts(out.read_text(encoding="utf-8"))
    assert 0 == cli.main(["report", "--html", str(out), str(src), "--include-cold"])
    assert {
        "header": [("31", "2")],
        "baseline": [],
        "labels": ["predict", "only_cold"],
        "tables": ["30", "1"],
        "lists": [("30", "30"), ("1", "1")],
        "histogram": 31,
        "waterfalls": 31,
    } == _counts(out.read_text(encoding="utf-8"))


def test_top_sets_the_op_rows_of_the_page(tmp_path: Path) -> None:
    """``--top N``: N op rows in each label's table and in each sample's; 10 without it."""
    src, out = tmp_path / "run.jsonl", tmp_path / "top.html"
    src.write_text("".join(_event("predict", 1000.0) for _ in range(4)), encoding="utf-8")

    def rows_per_table() -> list[int]:
        tables = re.split(r"<table[^>]*>", out.read_text(encoding="utf-8"))[1:]
        return [table.split("</table>")[0].count("<tr>") - 1 for table in tables]

    assert 0 == cli.main(["report", "--html", str(out), str(src), "--top", "3"])
    assert [3] * 5 == rows_per_table()  # the label's table, then 4 samples'
    assert 0 == cli.main(["report", "--html", str(out), str(src)])
    assert [10] * 5 == rows_per_table()


@pytest.mark.parametrize("where", ["files", "baseline", "cold only"])
def test_a_page_is_never_replaced_by_an_empty_one(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped path (as FILE or as ``--baseline``), or input with nothing to show, leaves
    an existing page as it was: exit 1, what went wrong on stderr, no page written. (A
    mistyped path once replaced a report with an empty page.)"""
    src, out = tmp_path / "run.jsonl", tmp_path / "report.html"
    src.write_text("".join(_event("predict", 1000.0) for _ in range(3)), encoding="utf-8")
    assert 0 == cli.main(["report", "--html", str(out), str(src)])
    before = out.read_bytes()
    capsys.readouterr()
    missing = str(tmp_path / "runn.jsonl")
    if where == "cold only":
        (tmp_path / "cold.jsonl").write_text(_event("p", 9.0, cold=True), encoding="utf-8")
        argv = [str(tmp_path / "cold.jsonl")]
    else:
        argv = [missing] if where == "files" else [str(src), "--baseline", missing]
    assert 1 == cli.main(["report", "--html", str(out), *argv])
    err = capsys.readouterr().err
    assert before == out.read_bytes()
    assert f"{out} not written" in err
    if where == "cold only":
        assert "no profkit.profile events found" in err
    else:
        assert f"cannot read {missing}" in err


def test_a_page_of_many_labels_shows_the_busiest_and_says_how_many_it_left_out(
    tmp_path: Path,
) -> None:
    """Past ``MAX_LABELS`` labels the page shows those with the most samples (the text
    report's order) and says how many more there are: a fleet's log of 3,000 labels made a
    92 MB page."""
    from profkit._html import MAX_LABELS

    src, out = tmp_path / "many.jsonl", tmp_path / "many.html"
    busy = [_event("busy", 1000.0) for _ in range(3)]
    rare = [_event(f"rare-{i:04}", 500.0) for i in range(MAX_LABELS + 40)]
    src.write_text("".join(rare[:10] + busy + rare[10:]), encoding="utf-8")
    assert 0 == cli.main(["report", "--html", str(out), str(src)])
    text = out.read_text(encoding="utf-8")
    counts = _counts(text)
    assert [(str(len(rare) + 3), str(len(rare) + 1))] == counts["header"]
    assert ["busy"] + [f"rare-{i:04}" for i in range(MAX_LABELS - 1)] == counts["labels"]
    assert ["41 more labels"] == re.findall(r"(\d+ more labels)", text)


@pytest.mark.parametrize("duration_us", [1e-320, 5e-324])
def test_a_subnormal_time_in_a_file_still_makes_a_page(duration_us: float) -> None:
    """A call or region time too small for its bar's scale (a subnormal float: the scale
    overflowed to inf) is drawn as a zero-width bar; the page is written, not an
    OverflowError."""
    region = {"region": "r", "start_us": 0, "duration_us": duration_us, "parent": 0}
    event = {"event": "profkit.profile", "label": "x", "duration_us": duration_us}
    line = json.dumps({**event, "regions": [region]})
    text = page(read([line])[0])
    assert 1 == text.count("<rect class=region")


def _outlier_run(run_lines: str, duration_us: float = 9400.0) -> list[str]:
    """The real run's lines, the last one's call made ``duration_us`` long (one outlier)."""
    lines = run_lines.splitlines()
    last = json.loads(lines[-1])
    lines[-1] = json.dumps({**last, "duration_us": duration_us})
    return lines


def _bins(text: str, series: str = "after") -> list[tuple[int, str]]:
    """(count, span) of each histogram bar of ``series``, left to right."""
    found = re.findall(rf"<title>{series}: (\d+) samples, ([^<]*)</title>", text)
    return [(int(n), span) for n, span in found]


def test_one_outlier_gets_an_overflow_bar_and_the_rest_spread_over_the_axis() -> None:
    """One 9.4 ms call among 99 of 1.0-1.3 ms: it is counted in an overflow bar labelled
    "> x ms", and the other calls' bars span at least half the axis (they were squeezed
    into its left third); the axis has tick labels along x and a y axis of counts."""
    lines = [_event("predict", 1000.0 + 3 * i) for i in range(99)] + [_event("predict", 9400.0)]
    samples = read(lines)[0]
    text = page(samples)
    bins = _bins(text)
    overflow = [(n, span) for n, span in bins if span.startswith("&gt;")]
    assert 1 == len(overflow)
    assert 1 == overflow[0][0]
    assert 100 == sum(n for n, _ in bins)
    ranged = [tuple(float(v) for v in span.split(" ")[0].split("-")) for _, span in bins[:-1]]
    full = ranged[-1][1] - ranged[0][0]
    used = [r for r, (n, _) in zip(ranged, bins, strict=False) if n]
    assert (used[-1][1] - used[0][0]) / full >= 0.5
    assert 4 <= len(re.findall(r"<text class=xtick", text))
    assert 2 <= len(re.findall(r"<text class=ytick", text))
    histogram = text.split("</svg>")[0]
    assert [overflow[0][1]] == re.findall(r">(&gt; [0-9.]+ ms)</text>", histogram)


#: run in a copy of the page (the page itself has no script): what does not fit, as JSON in
#: the body's ``data-layout`` (``--dump-dom`` returns it)
_LAYOUT = """<script>
const box = (e) => e.getBoundingClientRect();
const shown = (e) => e.getClientRects().length > 0;
const lines = (e) => {
  const r = document.createRange();
  r.selectNodeContents(e);
  const rects = [...r.getClientRects()].filter((x) => x.width > 0);
  return new Set(rects.map((x) => Math.round(x.top))).size;
};
const found = {
  overflow: Math.max(0, document.documentElement.scrollWidth - window.innerWidth),
  wrapped: [...document.querySelectorAll("td")].filter((td) => shown(td) && lines(td) > 1)
    .map((td) => td.textContent),
  outside: [...document.querySelectorAll("table, svg")].filter((e) => shown(e))
    .filter((e) => box(e).right > box(e.parentElement).right + 1
      || box(e).left < box(e.parentElement).left - 1)
    .map((e) => e.tagName + " in " + e.parentElement.tagName + ": " + e.textContent.slice(0, 40)),
  clipped: [...document.querySelectorAll("svg")].filter((s) => shown(s)).flatMap((s) => {
    const v = s.viewBox.baseVal && s.viewBox.baseVal.width ? s.viewBox.baseVal
      : {x: 0, y: 0, width: s.width.baseVal.value, height: s.height.baseVal.value};
    return [...s.querySelectorAll("text")].map((t) => [t, t.getBBox()])
      .filter(([t, b]) => b.width > 0 && (b.x < v.x - 0.5 || b.y < v.y - 0.5
        || b.x + b.width > v.x + v.width + 0.5 || b.y + b.height > v.y + v.height + 0.5))
      .map(([t, b]) => t.textContent);
  }),
  chart: Math.round(box(document.querySelector("svg")).width),
};
document.body.setAttribute("data-layout", JSON.stringify(found));
</script></body>"""


def _layout(browser: str, page_path: Path, width: int, *shot: str) -> dict[str, Any]:
    """What does not fit in ``page_path`` at a ``width`` px window, measured by Chromium
    (``shot``: ``--screenshot=PATH`` too, in the same run)."""
    measured = page_path.with_name(f"measured-{width}-{page_path.name}")
    text = page_path.read_text(encoding="utf-8")
    measured.write_text(text.replace("</body>", _LAYOUT, 1), encoding="utf-8")
    dom = _headless(browser, measured.as_uri(), f"--window-size={width},1000", "--dump-dom", *shot)
    found = re.search(r'data-layout="([^"]*)"', dom.stdout)
    assert found is not None, dom.stderr[-2000:]
    return dict(json.loads(html.unescape(found.group(1))))


_FITS = {"overflow": 0, "wrapped": [], "outside": [], "clipped": []}


@pytest.mark.timeout(300)
def test_the_layout_check_catches_what_does_not_fit(tmp_path: Path) -> None:
    """The check itself: a page that scrolls sideways, a numeric cell that wraps, a table
    wider than its column and an SVG text past its viewBox are each reported."""
    browser = _chromium()
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<html><body><div style='width:90px'><table><tr><td>12.5-13.5</td>"
        "<td style='white-space:nowrap'>aten::a_very_long_op_name</td></tr></table></div>"
        "<div style='width:2000px'>wide</div><svg width=100 height=20 viewBox='0 0 100 20'>"
        "<text x=90 y=15>cut off here</text></svg></body></html>",
        encoding="utf-8",
    )
    found = _layout(browser, bad, 1280)
    assert found["overflow"] > 0
    assert ["12.5-13.5"] == found["wrapped"]
    assert 1 == len(found["outside"])
    assert ["cut off here"] == found["clipped"]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("width", [1400, 1280])
def test_baseline_page_fits_a_wide_and_a_laptop_window(
    width: int, run_lines: str, tmp_path: Path
) -> None:
    """``--baseline`` with an outlier, in Chromium at 1400 px and a laptop's 1280 px: no
    sideways scroll, no numeric cell wrapped (the p25-p75 cells of the tables side by side
    were), no table or chart outside its column, no chart text outside its viewBox, and the
    page uses the window (it was fixed at ~850 px); a screenshot is kept."""
    browser = _chromium()
    lines = _outlier_run(run_lines)
    samples = read(lines)[0]
    out = tmp_path / "baseline.html"
    out.write_text(page(samples[50:], samples[:50], "after.jsonl"), encoding="utf-8")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"html-report-baseline-{width}.png"
    shot.unlink(missing_ok=True)
    found = _layout(browser, out, width, f"--screenshot={shot}")
    assert _FITS == {k: found[k] for k in _FITS}
    assert found["chart"] >= 0.85 * width  # the histogram spans the window, less margins
    assert shot.stat().st_size > 10_000
