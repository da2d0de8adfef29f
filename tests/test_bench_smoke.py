"""The benchmark suite runs end to end in quick mode (numbers are not checked: bench/ reports)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_bench_quick_run_prints_every_table() -> None:
    """`bench/run.py --quick --no-write` exits 0 and prints the targets and every section."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--no-write"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=380,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout
    for header in (
        "| target | limit | measured (median) | met |",
        "### Off-sample overhead",
        "| profiled, off-sample root |",
        "### Sampled call: the request path",
        "### Per-window CPU against torch's raw start and stop (all threads)",
        "| ratio profkit / torch raw, round by round |",
        "### First sampled call after configure() (fresh processes)",
        "### Export pipeline",
        "| 10k |",
        "### Slow-call capture",
        "| capture_slow on, no cap |",
        "| profiled, off-sample root, capture_slow on |",
        "### Overhead budget (in process)",
        "### Overhead budget beside busy neighbours (pool threads)",
        "### End to end (uvicorn + FastAPI)",
        "| without profkit |",
    ):
        assert header in out, f"missing {header!r} in:\n{out}"


def test_first_call_script_has_a_usable_cli() -> None:
    """bench/first_call.py (issue 2's check) documents its flags."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "first_call.py"), "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for flag in ("--quick", "--json", "--processes", "--calls"):
        assert flag in result.stdout


def _spread(median: float) -> dict[str, float]:
    return {"median": median, "q1": median * 0.9, "q3": median * 1.1, "min": median * 0.8}


def test_plots_are_svg_of_the_results(tmp_path: Path) -> None:
    """bench/plots.py draws the three plots the docs show, as SVG with the results' rows."""
    sys.path.insert(0, str(ROOT / "bench"))
    import xml.etree.ElementTree as ET

    from plots import write_all

    results = {
        "overhead": {
            "rows_ns": {"bare call": _spread(37), "raw record_function": _spread(6320)},
            "ratio_to_record_function": _spread(0.104),
        },
        "sampled": {
            "rows": [
                {"model": "mlp", "top_k": 10, "events": 23}
                | {k: _spread(0.5) for k in ("raw_overhead_ms", "profkit_extra_ms", "recording_ms")}
            ]
        },
        "e2e": {"rows": {"off": {"rps": _spread(2633)}, "100": {"rps": _spread(2476)}}},
    }
    paths = write_all(results, tmp_path)
    assert ["off_sample.svg", "window_parts.svg", "throughput.svg"] == [p.name for p in paths]
    texts = {p.name: p.read_text(encoding="utf-8") for p in paths}
    for text in texts.values():
        assert ET.fromstring(text).tag == "{http://www.w3.org/2000/svg}svg"
    assert "raw record_function" in texts["off_sample.svg"]
    assert "profkit beyond torch" in texts["window_parts.svg"]
    assert "without profkit" in texts["throughput.svg"]
    assert "1-in-100 (no cap)" in texts["throughput.svg"]


def test_performance_page_shows_the_generated_plots() -> None:
    """docs/performance.md shows every plot bench/run.py writes into docs/images/bench/."""
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    shown = [
        name
        for name in ("off_sample", "window_parts", "throughput")
        if f"](images/bench/{name}.svg)" in page
    ]
    assert 3 == len(shown)
    assert all((ROOT / "docs" / "images" / "bench" / f"{n}.svg").is_file() for n in shown)


def test_tables_are_separated_from_their_captions() -> None:
    """A caption line directly above a table gets a blank line (Markdown: else one paragraph)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from run import separate_tables

    text = "caption\n| a |\n|---|\n| 1 |\n\n| b |\n|---|\n"
    assert "caption\n\n| a |\n|---|\n| 1 |\n\n| b |\n|---|\n" == separate_tables(text)
