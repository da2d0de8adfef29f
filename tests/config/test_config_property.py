"""No setting can break the process (issue #26): properties over random values.

Any value for any setting either builds a Config or raises the ValueError that names the
setting; any text in any PROFKIT_* variable builds a Config with at most a
ProfkitConfigWarning. A Config that was built is valid (it builds again from its own fields)
and what the session later computes from it (nanoseconds, deadlines, lock timeouts, the rate
cap, the samplers, the thresholds, the signal) raises nothing.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import threading
import time
import warnings
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import profkit
from profkit._capture.decide import make_sampler
from profkit._config import ENV_VARS, Config, build_config, setting
from profkit._deadline import Deadline
from profkit._sampling import RateLimiter
from profkit._settings import signal_number
from profkit._summary.thresholds import Thresholds
from profkit._targeting.slow import LatencyBook

NAMES = [f.name for f in dataclasses.fields(Config)]
NUMERIC = [
    f.name
    for f in dataclasses.fields(Config)
    if f.type in ("int", "float", "int | None", "float | None")
]


def _safe_signals() -> dict[str, int]:
    """The signals a process may hand to profkit, by name, worked out apart from profkit."""
    safe = {n: int(getattr(signal, n)) for n in ("SIGUSR1", "SIGUSR2") if hasattr(signal, n)}
    if hasattr(signal, "SIGRTMIN") and hasattr(signal, "SIGRTMAX"):
        low, high = int(signal.SIGRTMIN), int(signal.SIGRTMAX)
        safe |= {"SIGRTMIN": low, "SIGRTMAX": high}
        for i in range(high - low + 1):
            safe |= {f"SIGRTMIN+{i}": low + i, f"SIGRTMAX-{i}": high - i}
    return safe


SAFE_SIGNALS = _safe_signals()
EDGES = [1e308, -1e308, math.inf, -math.inf, math.nan, -0.0, 0.0, 5e-324, 2**31, 2**63, 10**400]
WORDS = ["SIGUSR1", "SIGTERM", "SIGINT", "SIGKILL", "SIGRTMIN+3", "SIGRTMAX-1", "SIGRTMIN+99"]
WORDS += ["cpu", "auto", "CPU, CUDA", "otel", "log", "", "none", "/tmp", "1e308", "-0.0"]

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**30, max_value=2**70),
    st.sampled_from([*EDGES, 10**5000]),  # 10**5000: too long for repr() in an error message
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(WORDS),
    st.tuples(st.sampled_from(["otel", "log", "json", "console", "nope"])),
    st.lists(st.sampled_from(["otel", "log", 3]), max_size=3),
)
BOUNDS = [1, 3600, 3_600_000, 1_000_000, 2**31 - 1, 2**40]


def accepted(name: str) -> st.SearchStrategy[Any]:
    """Values of the setting's type up to the largest of BOUNDS it accepts (that one too),
    that its rule accepts: examples go on to build a Config and use it."""
    check = setting(name).check
    if name == "trigger_signal":
        return st.sampled_from(sorted(SAFE_SIGNALS))
    top = max(b for b in BOUNDS if check(b))
    if next(f.type for f in dataclasses.fields(Config) if f.name == name).startswith("int"):
        values = st.one_of(st.integers(0 if check(0) else 1, top), st.just(top))
    else:
        above = st.floats(0.0, top, exclude_min=not check(0.0))
        values = st.one_of(above, st.just(float(top)))
    return values.filter(check)


def mostly_accepted(name: str) -> st.SearchStrategy[Any]:
    """Four times in five a value the setting accepts, else any value at all."""
    return st.integers(0, 4).flatmap(lambda k: VALUES if k == 0 else accepted(name))


def some_settings(names: list[str], max_size: int) -> st.SearchStrategy[dict[str, Any]]:
    """Up to ``max_size`` of ``names``, each with a value that is mostly acceptable."""
    chosen = st.lists(st.sampled_from(names), unique=True, max_size=max_size)
    return chosen.flatmap(lambda keys: st.fixed_dictionaries({k: mostly_accepted(k) for k in keys}))


TEXTS = st.one_of(
    st.text(max_size=16),
    st.sampled_from([*WORDS, "inf", "nan", "1e400", "9" * 5000, "1_000", " 7 ", "true", "on"]),
    st.integers().map(str),
    st.floats().map(repr),
    st.sampled_from(EDGES).map(repr),
)


def consequences(config: Config) -> None:
    """What profkit computes from the settings once a session runs: none of it may raise."""
    if config.slow_ms is not None:
        assert LatencyBook(config.slow_ms).slow_ns is not None  # int(slow_ms * 1e6)
    if config.max_per_minute is not None:
        RateLimiter(config.max_per_minute).allow()
    sampler = make_sampler(config)
    next(sampler.picks())
    sampler.decide(2**127)
    Thresholds.from_config(config)
    lock = threading.Lock()
    for timeout in (config.export_timeout, max(5.0, 2 * config.max_window_s)):
        # the standard library's limit (OverflowError past threading.TIMEOUT_MAX)
        assert lock.acquire(timeout=timeout)
        lock.release()
        Deadline(timeout).wait_arg()
    assert math.isfinite(time.monotonic() + config.max_window_s)
    assert config.warmup + config.window < 2**63
    if config.trigger_signal is not None:  # the number _signals installs a handler on
        assert SAFE_SIGNALS[config.trigger_signal] == signal_number(config.trigger_signal)


def rebuilt(config: Config) -> Config:
    """``config`` built again from its own fields (each one must still be acceptable)."""
    return build_config({name: getattr(config, name) for name in NAMES}, environ={})


def build_or_value_error(overrides: dict[str, Any]) -> Config | None:
    """build_config(overrides), or None where it raised a ValueError naming a setting."""
    try:
        return build_config(overrides, environ={})
    except ValueError as exc:
        error = str(exc)
    assert "profkit setting" in error
    return None


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(NAMES), value=VALUES)
def test_any_value_of_any_setting(name: str, value: Any) -> None:
    """One setting, any value: a valid Config or a ValueError naming that setting."""
    try:
        config = build_config({name: value}, environ={})
    except ValueError as exc:
        error = str(exc)
        config = None
    event("refused" if config is None else "built")
    if config is None:
        assert f"profkit setting '{name}'" in error
        return
    assert config == rebuilt(config)
    consequences(config)


@settings(max_examples=200, deadline=None)
@given(some_settings(NUMERIC, 6))
def test_any_values_of_the_numbers_together(overrides: dict[str, Any]) -> None:
    """Several numeric settings at once (sums and products of them included) stay safe."""
    config = build_or_value_error(overrides)
    event("refused" if config is None else "built")
    if config is not None:
        assert config == rebuilt(config)
        consequences(config)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(ENV_VARS.values())), TEXTS, max_size=8))
def test_any_text_in_any_variable(environ: dict[str, str]) -> None:
    """Any PROFKIT_* text: a valid Config; the only warnings are ProfkitConfigWarnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = build_config({}, environ=environ)
    assert all(issubclass(w.category, profkit.ProfkitConfigWarning) for w in caught)
    assert config == rebuilt(config)
    consequences(config)


@pytest.mark.timeout(120)
@settings(max_examples=25, deadline=None)
@given(some_settings([*NUMERIC, "trigger_signal"], 3))
def test_configure_itself(overrides: dict[str, Any]) -> None:
    """The real configure() (a session starts, a signal may be installed), then shutdown()."""
    try:
        config = profkit.configure(exporters=(), **overrides)
    except ValueError as exc:
        error = str(exc)
        config = None
    event("refused" if config is None else "configured")
    if config is None:
        assert ("profkit setting", None) == (error[:15], profkit.get_config())
        return
    try:
        assert config is profkit.get_config()
        consequences(config)
    finally:
        assert profkit.shutdown(10.0)
