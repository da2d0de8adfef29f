"""A service using profkit writes nothing on stderr by default (#25): kineto's per-window
``USDT ... profiler_start/stop`` lines are silenced unless the user set ``KINETO_LOG_LEVEL``."""

from __future__ import annotations

import os

import pytest
from fresh_interpreter import run_fresh


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROFKIT_", "KINETO_"))}
    return {**env, **extra}


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_service_prints_nothing_on_stderr_by_default() -> None:
    """5 sampled requests of a FastAPI service: exported, stderr empty, the env left as it was."""
    rc, report, err = run_fresh("service_quiet_stderr", env=_env())
    assert (0, "") == (rc, err)
    expected = {"codes": [200], "flushed": True, "exported": 5, "kineto_env": None}
    assert expected == report


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_kineto_log_level_set_by_the_user_is_kept() -> None:
    """``KINETO_LOG_LEVEL=5`` (the user's): kineto's lines are shown, the variable untouched."""
    rc, report, err = run_fresh("service_quiet_stderr", env=_env(KINETO_LOG_LEVEL="5"))
    assert (0, "5") == (rc, report["kineto_env"])
    assert "profiler_start" in err
