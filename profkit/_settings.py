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
import importlib
import os
import re
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
    "MAX_COUNT",
    "METER_PROVIDER",
    "PROVIDER",
    "SIGNAL",
    "Setting",
    "int_in",
    "number_in",
    "signal_number",
]

ACTIVITIES = ("auto", "cpu", "cuda", "cpu,cuda")
EXPORTERS = ("console", "json", "log", "otel")
KEY = "profkit"  # where a field's Setting sits in its metadata
#: the upper bound of counts and sizes with no natural one: far from any C integer's limit
MAX_COUNT = 2**31 - 1


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


#: what a number in an environment variable may look like: ASCII, no ``_`` separators
#: (``int()`` and ``float()`` also take ``5_0`` and other scripts' digits, as 50 and 3)
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(
    r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)", re.I
)


def _parse_int(raw: str) -> int:
    text = raw.strip()
    if not _INT.fullmatch(text):
        raise ValueError(f"not an integer: {raw!r}")
    return int(text)


def _parse_float(raw: str) -> float:
    text = raw.strip()
    if not _FLOAT.fullmatch(text):
        raise ValueError(f"not a number: {raw!r}")
    value = float(text)
    if value == 0.0 and re.search(r"[1-9]", text.lower().split("e")[0]):
        raise ValueError(f"{raw!r} is too small to tell from 0")  # (1e-400: off, silently)
    return value


def _parse_text(raw: str) -> str | None:
    return raw.strip() or None


def _parse_names(raw: str) -> tuple[str, ...]:
    """Comma-separated names; ``none`` for no name at all (an empty value is a mistake: it
    would silently drop every sample as ``no_exporter``)."""
    if raw.strip().lower() == "none":
        return ()
    names = tuple(part.strip() for part in raw.split(",") if part.strip())
    if not names:
        raise ValueError("empty: unset it for the default, or write 'none' for no name")
    return names


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


def int_in(low: int, high: int, *, none: bool = False) -> Mapping[str, Setting]:
    """An int in [low, high], or None too with ``none``."""

    def check(value: Any) -> bool:
        if value is None:
            return none
        return _is_int(value) and low <= value <= high

    rule = f"an int in [{_shown(low)}, {_shown(high)}]" + (" or None" if none else "")
    return _meta(Setting(check, rule, _or_none(_parse_int) if none else _parse_int))


def number_in(
    low: float, high: float, *, closed: bool = False, none: bool = False
) -> Mapping[str, Setting]:
    """An int or float above ``low`` (or at it, when ``closed``) and at most ``high``."""

    def check(value: Any) -> bool:
        if value is None:
            return none
        if not _is_real(value):
            return False
        # compared, never converted: NaN, infinities and ints too large for a float are
        # refused here rather than raising OverflowError here or in the session later
        above: bool = low <= value if closed else low < value
        return above and value <= high

    span = f"{'[' if closed else '('}{_shown(low)}, {_shown(high)}]"
    rule = f"a number in {span}" + (" or None" if none else "")
    return _meta(Setting(check, rule, _or_none(_parse_float) if none else _parse_float))


def object_setting(check: Callable[[Any], bool], rule: str, **how: Any) -> Mapping[str, Setting]:
    """A setting that is an object, not a value: no environment variable."""
    return _meta(Setting(check, rule, None, **how))


_REAL_TIME = re.compile(r"SIGRTM(IN|AX)(?:([+-])([0-9]{1,2}))?")


def signal_number(name: Any) -> int | None:
    """The number of signal ``name`` if profkit may take it over, else None.

    SIGUSR1 and SIGUSR2 are left to applications, and so is the real-time range (SIGRTMIN
    to SIGRTMAX, also written SIGRTMIN+n and SIGRTMAX-n). Every other signal means
    something to someone: SIGTERM and SIGINT stop the process for its manager and the shell,
    SIGSEGV is a crash, SIGCHLD reaps children, SIGALRM is someone's timeout. A trigger on
    one of those would take that meaning away from the process.
    """
    if not isinstance(name, str):
        return None
    if name in ("SIGUSR1", "SIGUSR2"):
        number = getattr(signal, name, None)
        return None if number is None else int(number)
    low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    match = _REAL_TIME.fullmatch(name)
    if low is None or high is None or match is None:
        return None
    end, sign, offset = match.groups()
    number = int(low) if end == "IN" else int(high)
    if sign is not None:
        number += int(offset) if sign == "+" else -int(offset)
    return number if int(low) <= number <= int(high) else None


def _activities(value: Any) -> Any:
    return value.replace(" ", "").lower() if isinstance(value, str) else value


def _names(value: Any) -> Any:
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list) else value


def _listed(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _path(value: Any) -> Any:
    if not isinstance(value, os.PathLike):
        return value
    try:
        return os.fspath(value)
    except Exception as exc:  # (its __fspath__ raised: a ValueError naming the setting)
        raise ValueError(f"its __fspath__() raised {type(exc).__name__}: {exc}") from exc


def _has(value: Any, *methods: str) -> bool:
    """Whether ``value`` is an object with these methods: a class has them too, unbound,
    and every call then fails (``TracerProvider`` given for ``TracerProvider()``)."""
    return not isinstance(value, type) and all(callable(getattr(value, m, None)) for m in methods)


SIGNAL = _meta(
    Setting(
        lambda v: v is None or signal_number(v) is not None,
        "SIGUSR1, SIGUSR2, a real-time signal (SIGRTMIN, SIGRTMIN+n, SIGRTMAX-n, SIGRTMAX) or None",
        _or_none(_parse_text),
    )
)


def _activity_ok(value: Any) -> bool:
    if not (isinstance(value, str) and value in ACTIVITIES):
        return False
    if value != "cuda":
        return True  # ("cpu,cuda" without a device records the CPU, as "auto" does)
    import torch  # (only for this rule: the table stays importable without torch)

    return bool(torch.cuda.is_available())  # "cuda" alone without one: every start fails


ACTIVITY = _meta(
    Setting(
        _activity_ok,
        f'one of {ACTIVITIES} ("cuda" alone only where torch.cuda.is_available())',
        _parse_text,
        coerce=_activities,
    )
)
EXPORTER_NAMES = _meta(
    Setting(
        lambda v: (
            isinstance(v, tuple)
            and all(isinstance(n, str) and n in EXPORTERS for n in v)
            and len(set(v)) == len(v)
        ),  # a name twice would export every window twice
        f"a tuple of distinct names from {EXPORTERS}",
        _parse_names,
        accepts="Sequence[str] | str",
        coerce=_names,
    )
)
DIRECTORY = _meta(
    Setting(
        lambda v: v is None or (isinstance(v, str) and v != "" and "\0" not in v),
        "a path (not empty, no NUL character) or None",
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
METER_PROVIDER = object_setting(
    lambda v: v is None or _has(v, "get_meter"),
    "an OpenTelemetry MeterProvider (get_meter()) or None",
    accepts="MeterProvider | None",
)
LOGGER = object_setting(
    lambda v: v is None or _has(v, "info", "warning"),
    "a logger with info() and warning() methods, or None",
)


#: OpenTelemetry SDK exporters: their ``export()`` takes spans, metrics or log records, and
#: fails on every profkit summary; each goes on its own provider
_OTEL_EXPORTERS = (
    ("opentelemetry.sdk.trace.export", ("SpanExporter",)),
    ("opentelemetry.sdk.metrics.export", ("MetricExporter",)),
    ("opentelemetry.sdk._logs.export", ("LogRecordExporter", "LogExporter")),
)


def _profkit_exporter(value: Any) -> bool:
    """An object with ``export()``, and not an OpenTelemetry SDK span, metric or log
    exporter (see :data:`_OTEL_EXPORTERS`)."""
    if not _has(value, "export"):
        return False
    for module, names in _OTEL_EXPORTERS:
        try:
            found = importlib.import_module(module)
        except ImportError:  # (an SDK without that signal)
            continue
        bases = tuple(b for n in names if isinstance(b := getattr(found, n, None), type))
        if bases and isinstance(value, bases):
            return False
    return True


EXPORTER_OBJECTS = object_setting(
    lambda v: isinstance(v, tuple) and all(_profkit_exporter(e) for e in v),
    "a tuple of objects with an export() method (not OpenTelemetry SDK span, metric or log "
    "exporters: those go on the TracerProvider, MeterProvider or LoggerProvider, in a "
    "processor or reader)",
    accepts="Sequence[Exporter]",
    coerce=_listed,
)
