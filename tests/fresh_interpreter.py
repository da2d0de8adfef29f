"""Run a test body in a fresh Python interpreter: exit-time and fork behaviour need one.

Each body is a script in ``tests/scripts/`` (linted like the tests), run by name with its
arguments and environment; it imports what it shares with the others from
``tests/scripts/_fresh.py`` (``f``, a profiled function returning 6.0, and
``report(**values)``, one JSON line the test reads back). Nothing is configured before the
body runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["SCRIPTS", "run_fresh"]

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "scripts"


def run_fresh(
    script: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 150.0,
) -> tuple[int, dict[str, Any], str]:
    """Run ``tests/scripts/<script>.py args``; its exit status, last report ({} if none), stderr.

    ``env`` replaces the environment (default: this process's). The repository root leads
    ``PYTHONPATH`` either way, so the script imports this checkout's profkit.
    """
    path = SCRIPTS / f"{script}.py"
    assert path.is_file(), f"no script {path}"
    environ = dict(os.environ if env is None else env)
    environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), environ.get("PYTHONPATH", "")) if p
    )
    proc = subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True,
        text=True,
        errors="replace",
        env=environ,
        timeout=timeout,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    report = json.loads(lines[-1][len("REPORT ") :]) if lines else {}
    return proc.returncode, report, proc.stderr
