"""Settings: one frozen dataclass, each field documented and readable from a ``PROFKIT_*`` env var.

Explicit ``configure()`` arguments are validated strictly and raise ``ValueError`` naming the
setting. Environment variables only fill settings that were not passed; a malformed one warns
(``ProfkitConfigWarning``) and falls back to the default, so a bad deployment variable never
crashes an import or a request.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["ENV_VARS", "MAX_EXPORT_TIMEOUT", "Config", "ProfkitConfigWarning", "build_config"]

_ACTIVITIES = ("auto", "cpu", "cuda", "cpu,cuda")
#: longest ``export_timeout`` (an hour): an exporter that may take longer per window than
#: this is hung, and timeouts near ``threading.TIMEOUT_MAX`` overflow the standard library
MAX_EXPORT_TIMEOUT = 3600.0
_EXPORTERS = ("console", "json", "log", "otel")


class ProfkitConfigWarning(UserWarning):
    """A ``PROFKIT_*`` environment variable could not be parsed and was ignored."""


@dataclasses.dataclass(frozen=True)
class Config:
    """Every profkit setting. Build it with :func:`profkit.configure`; fields are read-only."""

    enabled: bool = True
    """Master switch. When false, decorated code runs unprofiled and nothing is counted."""

    sample_every: int | None = None
    """Profile one root call in N (counter-based, exact). Default 100 when no rate is given."""

    sample_rate: float | None = None
    """Profile this fraction of root calls, consistent with the active OTel trace id."""

    max_per_minute: float | None = 60.0
    """Cap on profiler windows opened per minute (token bucket, bursts up to the same number);
    None means no cap. The default, one a second on average, bounds what profkit costs a
    busy service whatever the sampling rate."""

    max_overhead: float | None = None
    """Largest share of the process's CPU time profkit may use (0.01: 1%), over the last ~10 s;
    past it, sampled calls are skipped (``skipped_budget``). None means no budget."""

    capture_slow: bool = False
    """Time root calls per label and profile some speculatively; export those slower than the
    label's recent p95 (policy "slow"), release the others unread."""

    slow_ms: float | None = None
    """With ``capture_slow``: a call slower than this many ms is slow (None: the label's p95)."""

    baggage_trigger: bool = False
    """Profile a root call whose OTel baggage holds ``profkit.profile=1`` (policy "baggage");
    still under ``max_per_minute`` and ``max_overhead``."""

    trigger_signal: str | None = None
    """Signal name ("SIGUSR1") on which the process profiles its next root call; None: none."""

    window: int = 1
    """Root calls recorded per profiler window (on the thread that opened it)."""

    warmup: int = 0
    """Root calls run under the profiler and discarded before the recorded ones."""

    activities: str = "auto"
    """Profiler activities: "auto" (CPU, plus CUDA when available), "cpu", "cuda", "cpu,cuda"."""

    record_shapes: bool = False
    """Record operator input shapes (rows are then grouped by name and shapes)."""

    profile_memory: bool = False
    """Record tensor allocations (self CPU / device memory per op)."""

    with_flops: bool = False
    """Estimate FLOPs for matmul and convolution ops."""

    with_stack: bool = False
    """Record Python stacks (expensive; for the Chrome trace only)."""

    all_threads: bool = False
    """Record every thread, not only the sampled call's (for handlers that offload to pools)."""

    top_k: int = 10
    """Op rows kept per scope; the rest is folded into one "other" row."""

    max_window_s: float = 1.0
    """Seconds a window may record; past it, it stops at profkit's next checkpoint (truncated)."""

    max_events: int = 20_000
    """Profiler events summarised per window; past it, the earliest are kept (truncated)."""

    queue_size: int = 16
    """Stopped windows waiting for the export worker; a full queue drops and counts."""

    export_timeout: float = 5.0
    """Seconds (at most 3600) one exporter may take for one window before it is cut off and
    counted."""

    exporters: tuple[str, ...] = ("otel", "log")
    """Built-in exporters by name: "otel" (spans), "log" (structlog events), "console", "json"."""

    trace_dir: str | None = None
    """Directory for one Chrome/Perfetto trace file per window; None disables trace files."""

    trace_max_files: int = 20
    """Trace files kept in ``trace_dir`` (oldest removed first)."""

    trace_max_bytes: int = 200 * 1024 * 1024
    """Total bytes of trace files kept in ``trace_dir``."""

    trace_gzip: bool = True
    """Write trace files gzip-compressed (``.json.gz``)."""

    max_attribute_length: int = 256
    """Longest string (label, op name, attribute value) written to a span or log event."""

    max_attributes: int = 64
    """User attributes kept per scope."""

    launch_bound_op_us: float = 20.0
    """Diagnosis: median op self time (µs) at or below which many ops read as launch-bound.

    Also the launch-glue allowance: this much host time per op event outside the ops (Python,
    dispatch, profiler bookkeeping between ops) counts as launching them, not as input.
    """

    launch_bound_min_ops: int = 200
    """Diagnosis: ops per call at or above which a call can be launch-bound."""

    input_bound_share: float = 0.5
    """Diagnosis: share of the call outside torch ops (less launch glue) making it input-bound."""

    compute_bound_top2_share: float = 0.6
    """Diagnosis: share of op time taken by the top two ops at which a call is compute-bound."""

    tracer_provider: Any = None
    """OTel TracerProvider for spans, flushed by profkit's flushes; None uses the global one,
    which profkit never flushes."""

    logger: Any = None
    """structlog-style logger (``info``, ``warning``) for events; None uses
    ``structlog.get_logger("profkit")``."""

    extra_exporters: tuple[Any, ...] = ()
    """Exporter objects (see :class:`profkit.exporters.Exporter`) added to the named ones."""

    @property
    def every(self) -> int | None:
        """The effective 1-in-N setting (100 when neither sampling setting is given)."""
        if self.sample_rate is not None:
            return None
        return self.sample_every if self.sample_every is not None else 100


#: settings that are objects, not values, and so have no environment variable
_NO_ENV = frozenset({"tracer_provider", "logger", "extra_exporters"})

#: env var name for each setting
ENV_VARS: Mapping[str, str] = {
    f.name: f"PROFKIT_{f.name.upper()}" for f in dataclasses.fields(Config) if f.name not in _NO_ENV
}


def _parse_bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {raw!r}")


def _parse_env(name: str, raw: str) -> Any:
    field_type = _FIELD_TYPES[name]
    if field_type.endswith("| None") and raw.strip().lower() in ("", "none"):
        return None  # e.g. PROFKIT_MAX_PER_MINUTE=none: no cap
    if field_type == "bool":
        return _parse_bool(raw)
    if field_type in ("int", "int | None"):
        return int(raw.strip())
    if field_type in ("float", "float | None"):
        return float(raw.strip())
    if field_type == "tuple[str, ...]":
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    return raw.strip() or None


_FIELD_TYPES = {f.name: str(f.type) for f in dataclasses.fields(Config)}


def _check(name: str, ok: bool, value: Any, rule: str) -> None:
    if not ok:
        raise ValueError(f"profkit setting {name!r}: {rule}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def validate(values: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the first setting in ``values`` that is not acceptable."""
    for name, value in values.items():
        _validate_one(name, value)
    if values.get("sample_every") is not None and values.get("sample_rate") is not None:
        raise ValueError(
            "profkit settings 'sample_every' and 'sample_rate' are exclusive: give one of them"
        )


def _is_signal(name: str) -> bool:
    """A signal's name that a handler can catch (not SIGKILL, SIGSTOP)."""
    return (
        name.isupper()
        and name.startswith("SIG")
        and name not in ("SIGKILL", "SIGSTOP")
        and isinstance(getattr(signal, name, None), signal.Signals)
    )


def _validate_one(name: str, value: Any) -> None:
    if name not in _FIELD_TYPES:
        raise ValueError(f"unknown profkit setting {name!r}")
    kind = _FIELD_TYPES[name]
    if kind == "bool":
        _check(name, isinstance(value, bool), value, "must be True or False")
    elif name == "sample_every":
        _check(name, value is None or (_is_int(value) and value >= 1), value, "must be an int >= 1")
    elif name == "sample_rate":
        ok = value is None or (_is_num(value) and 0.0 <= value <= 1.0)
        _check(name, ok, value, "must be a number in [0, 1]")
    elif name == "max_per_minute":
        _check(name, value is None or (_is_num(value) and value > 0), value, "must be > 0 or None")
    elif name == "max_overhead":
        ok = value is None or (_is_num(value) and 0 < value <= 1)
        _check(name, ok, value, "must be a fraction in (0, 1] or None")
    elif name in (
        "window",
        "top_k",
        "max_events",
        "queue_size",
        "trace_max_files",
        "trace_max_bytes",
        "max_attribute_length",
        "max_attributes",
        "launch_bound_min_ops",
    ):
        _check(name, _is_int(value) and value >= 1, value, "must be an int >= 1")
    elif name == "warmup":
        _check(name, _is_int(value) and value >= 0, value, "must be an int >= 0")
    elif name == "export_timeout":
        ok = _is_num(value) and 0 < value <= MAX_EXPORT_TIMEOUT
        _check(name, ok, value, f"must be a number of seconds in (0, {MAX_EXPORT_TIMEOUT:g}]")
    elif name == "slow_ms":
        _check(name, value is None or (_is_num(value) and value > 0), value, "must be > 0 or None")
    elif name == "trigger_signal":
        ok = value is None or (isinstance(value, str) and _is_signal(value))
        rule = "must be the name of a signal this platform has that can be caught, or None"
        _check(name, ok, value, rule)
    elif name in ("launch_bound_op_us", "max_window_s"):
        _check(name, _is_num(value) and value > 0, value, "must be a number > 0")
    elif name in ("input_bound_share", "compute_bound_top2_share"):
        _check(name, _is_num(value) and 0 < value <= 1, value, "must be a number in (0, 1]")
    elif name == "activities":
        norm = value.replace(" ", "").lower() if isinstance(value, str) else value
        _check(name, norm in _ACTIVITIES, value, f"must be one of {_ACTIVITIES}")
    elif name == "exporters":
        ok = isinstance(value, tuple) and all(v in _EXPORTERS for v in value)
        _check(name, ok, value, f"must be a tuple of names from {_EXPORTERS}")
    elif name == "trace_dir":
        _check(name, value is None or isinstance(value, str), value, "must be a path or None")
    elif name == "tracer_provider":
        ok = value is None or callable(getattr(value, "get_tracer", None))
        _check(name, ok, value, "must be an OpenTelemetry TracerProvider (get_tracer()) or None")
    elif name == "logger":
        ok = value is None or all(callable(getattr(value, m, None)) for m in ("info", "warning"))
        _check(name, ok, value, "must be a logger with info() and warning() methods, or None")
    elif name == "extra_exporters":
        ok = isinstance(value, tuple) and all(callable(getattr(v, "export", None)) for v in value)
        _check(name, ok, value, "must be a tuple of objects with an export() method")


def _from_env(name: str, environ: Mapping[str, str]) -> tuple[bool, Any]:
    var = ENV_VARS.get(name)
    if var is None or var not in environ:
        return False, None
    raw = environ[var]
    try:
        value = _parse_env(name, raw)
        _validate_one(name, value)
    except ValueError as exc:
        warnings.warn(
            f"profkit: ignoring {var}={raw!r} ({exc}); using the default",
            ProfkitConfigWarning,
            stacklevel=4,
        )
        return False, None
    return True, value


def build_config(overrides: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Config:
    """Validate ``overrides`` strictly, fill the rest from ``environ`` leniently, build a Config."""
    values = dict(overrides)
    if isinstance(values.get("exporters"), (list, str)):
        raw = values["exporters"]
        values["exporters"] = (raw,) if isinstance(raw, str) else tuple(raw)
    if isinstance(values.get("extra_exporters"), list):
        values["extra_exporters"] = tuple(values["extra_exporters"])
    if isinstance(values.get("trace_dir"), os.PathLike):
        values["trace_dir"] = os.fspath(values["trace_dir"])
    validate(values)
    env = os.environ if environ is None else environ
    sampling_given = "sample_every" in values or "sample_rate" in values
    for f in dataclasses.fields(Config):
        if f.name in values:
            continue
        if sampling_given and f.name in ("sample_every", "sample_rate"):
            continue
        found, value = _from_env(f.name, env)
        if found:
            values[f.name] = value
    if values.get("sample_every") is not None and values.get("sample_rate") is not None:
        warnings.warn(
            "profkit: PROFKIT_SAMPLE_EVERY and PROFKIT_SAMPLE_RATE are both set; using the rate",
            ProfkitConfigWarning,
            stacklevel=3,
        )
        values["sample_every"] = None
    if isinstance(values.get("activities"), str):
        values["activities"] = values["activities"].replace(" ", "").lower()
    return Config(**values)
