"""Run a test body in a fresh Python interpreter: exit-time and fork behaviour need one.

The body sees ``f`` (a profiled function returning 6.0), ``report(**values)`` (one JSON line
the test reads back), ``CaptureExporter`` and the modules json, os, sys, threading, time,
torch and profkit. Nothing is configured before the body runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

__all__ = ["run_fresh"]

PRELUDE = """
import json, os, sys, threading, time
import torch
import profkit
from profkit.testing import CaptureExporter

@profkit.profiled("f")
def f():
    return float(torch.ones(3).add_(1).sum())

def report(**values):
    print("REPORT " + json.dumps(values), flush=True)
"""


def run_fresh(body: str, timeout: float = 150.0) -> tuple[int, dict[str, Any], str]:
    """Run PRELUDE + body; its exit status, its last report ({} if none) and its stderr."""
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    report = json.loads(lines[-1][len("REPORT ") :]) if lines else {}
    return proc.returncode, report, proc.stderr
