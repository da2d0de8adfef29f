"""The vocabulary of profkit's settings: what a :class:`Setting` says, and its kinds.

A :class:`Setting` is one row of the settings table (``profkit._config.Config``'s field
metadata): the rule a value must meet, how the ``PROFKIT_*`` variable's text is parsed and
what ``configure()`` accepts. The kinds here (a flag, an int or a number in a range, a name
from a list, an object) build them, so that each field of the table names its rule once.

Checks never raise: a value of the wrong type, NaN, an infinity or an int too large for a
float is simply refused (compared, never converted), so that ``configure()`` only ever raises
the ``ValueError`` that names the setting.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "ACTIVITIES",
    "ACTIVITY",
    "DIRECTORY",
    "EXPORTERS",
    "EXPORTER_NAMES",
    "EXPORTER_OBJECTS",
    "FLAG",
    "KEY",
    "LOGGER",
    "PROVIDER",
    "SIGNAL",
    "Setting",
    "int_in",
    "number_in",
]

ACTIVITIES = ("auto", "cpu", "cuda", "cpu,cuda")
EXPORTERS = ("console", "json", "log", "otel")
KEY = "profkit"  # where a field's Setting sits in its metadata


def _same(value: Any) -> Any:
    return value


@dataclasses.dataclass(frozen=True)
class Setting:
    """How one setting is checked, read from its environment variable and accepted."""

    check: Callable[[Any], bool]
    """True for an acceptable value (after ``coerce``)."""

    rule: str
    """What ``check`` accepts, in words: errors say "must be RULE", the docs list it."""

    parse: Callable[[str], Any] | None
    """The variable's text to a value (raising ValueError); None: no variable (an object)."""

    accepts: str | None = None
    """``configure()``'s annotation for it where wider than the field's type."""

    coerce: Callable[[Any], Any] = _same
    """What ``configure()`` accepts to the field's type (a list of names to a tuple)."""


# -- parsers and checks ---------------------------------------------------------------------


def _parse_bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {raw!r}")


def _parse_int(raw: str) -> int:
    return int(raw.strip())


def _parse_float(raw: str) -> float:
    return float(raw.strip())


def _parse_text(raw: str) -> str | None:
    return raw.strip() or None


def _parse_names(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _or_none(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse``, with empty or ``none`` meaning None (PROFKIT_MAX_PER_MINUTE=none: no cap)."""
    return lambda raw: None if raw.strip().lower() in ("", "none") else parse(raw)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(bound: float) -> str:
    """A bound as the rule writes it: 1, 0.5, 3600, 1_000_000."""
    if isinstance(bound, float) and not bound.is_integer():
        return repr(bound)
    return f"{int(bound):_}" if abs(bound) >= 10_000 else str(int(bound))


# -- the kinds of setting -------------------------------------------------------------------


def _meta(spec: Setting) -> Mapping[str, Setting]:
    return {KEY: spec}


FLAG = _meta(Setting(lambda v: isinstance(v, bool), "True or False", _parse_bool))


def int_in(low: int, high: int | None = None, *, none: bool = False) -> Mapping[str, Setting]:
    """An int in [low, high] (no upper bound when high is None), or None too with ``none``."""

    def check(value: Any) -> bool:
        if value is None:
            return none
        return _is_int(value) and low <= value and (high is None or value <= high)

    span = f">= {_shown(low)}" if high is None else f"in [{_shown(low)}, {_shown(high)}]"
    parse = _or_none(_parse_int) if none else _parse_int
    return _meta(Setting(check, f"an int {span}" + (" or None" if none else ""), parse))


def number_in(
    low: float, high: float | None = None, *, closed: bool = False, none: bool = False
) -> Mapping[str, Setting]:
    """A finite int or float past ``low`` (at it too when ``closed``) up to ``high``."""

    def check(value: Any) -> bool:
        if value is None:
            return none
        if not _is_real(value):
            return False
        # comparisons, not float(): an int too large for a float is refused, not an error
        above: bool = low <= value if closed else low < value
        return above and (value < math.inf if high is None else value <= high)

    if high is None:
        span = f"{'>=' if closed else '>'} {_shown(low)}"
    else:
        span = f"in {'[' if closed else '('}{_shown(low)}, {_shown(high)}]"
    parse = _or_none(_parse_float) if none else _parse_float
    return _meta(Setting(check, f"a number {span}" + (" or None" if none else ""), parse))


def object_setting(check: Callable[[Any], bool], rule: str, **how: Any) -> Mapping[str, Setting]:
    """A setting that is an object, not a value: no environment variable."""
    return _meta(Setting(check, rule, None, **how))


def _is_signal(name: Any) -> bool:
    """A signal's name that a handler can catch (not SIGKILL, SIGSTOP)."""
    return (
        isinstance(name, str)
        and name.isupper()
        and name.startswith("SIG")
        and name not in ("SIGKILL", "SIGSTOP")
        and isinstance(getattr(signal, name, None), signal.Signals)
    )


def _activities(value: Any) -> Any:
    return value.replace(" ", "").lower() if isinstance(value, str) else value


def _names(value: Any) -> Any:
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list) else value


def _listed(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _path(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _has(value: Any, *methods: str) -> bool:
    return all(callable(getattr(value, m, None)) for m in methods)


SIGNAL = _meta(
    Setting(
        lambda v: v is None or _is_signal(v),
        "the name of a signal this platform has that can be caught, or None",
        _or_none(_parse_text),
    )
)
ACTIVITY = _meta(
    Setting(lambda v: v in ACTIVITIES, f"one of {ACTIVITIES}", _parse_text, coerce=_activities)
)
EXPORTER_NAMES = _meta(
    Setting(
        lambda v: isinstance(v, tuple) and all(n in EXPORTERS for n in v),
        f"a tuple of names from {EXPORTERS}",
        _parse_names,
        accepts="Sequence[str] | str",
        coerce=_names,
    )
)
DIRECTORY = _meta(
    Setting(
        lambda v: v is None or isinstance(v, str),
        "a path or None",
        _or_none(_parse_text),
        accepts="str | os.PathLike[str] | None",
        coerce=_path,
    )
)
PROVIDER = object_setting(
    lambda v: v is None or _has(v, "get_tracer"),
    "an OpenTelemetry TracerProvider (get_tracer()) or None",
    accepts="TracerProvider | None",
)
LOGGER = object_setting(
    lambda v: v is None or _has(v, "info", "warning"),
    "a logger with info() and warning() methods, or None",
)
EXPORTER_OBJECTS = object_setting(
    lambda v: isinstance(v, tuple) and all(_has(e, "export") for e in v),
    "a tuple of objects with an export() method",
    accepts="Sequence[Exporter]",
    coerce=_listed,
)
