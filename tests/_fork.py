"""Waiting for a forked child, killed at a deadline (a hung child fails the test, never the run)."""

from __future__ import annotations

import os
import signal
import time

import pytest


def exit_code(pid: int, timeout: float = 30.0, hung: str = "the child hung") -> int:
    """The exit code of child ``pid``; past ``timeout`` s it is killed and the test fails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(hung)
