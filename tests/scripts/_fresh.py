"""What the fresh-interpreter scripts share: a profiled ``f`` and ``report(**values)``.

Each script in this folder is one test body that needs an interpreter of its own (exit-time,
fork and signal behaviour); ``tests/fresh_interpreter.py`` runs it and reads its last
report back. Importing this module configures nothing.
"""

from __future__ import annotations

import json
import os
import time

import torch

import profkit

__all__ = ["f", "reap", "report"]


@profkit.profiled("f")
def f() -> float:
    """A profiled root call that returns 6.0."""
    return float(torch.ones(3).add_(1).sum())


def report(**values: object) -> None:
    """One JSON line on stdout, which the test reads back (the last one wins)."""
    print("REPORT " + json.dumps(values), flush=True)


def reap(pid: int, seconds: float) -> int | None:
    """A forked child's exit status, or None when it was killed after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.1)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None
