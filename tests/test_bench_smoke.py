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
        "### First sampled call after configure() (fresh processes)",
        "### Export pipeline",
        "| 10k |",
        "### Slow-call capture",
        "| capture_slow on, no cap |",
        "| profiled, off-sample root, capture_slow on |",
        "### Overhead budget (in process)",
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
