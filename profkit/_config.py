"""Settings, declared once: the fields of one frozen dataclass, each with its rule.

Each field of :class:`Config` has a docstring (what the setting does) and, in its metadata, a
``Setting`` (``_settings.py``): the rule its values must meet (a check, and the words that
errors and the docs use for it), how its ``PROFKIT_*`` variable is parsed (object settings
have none), and what ``configure()`` accepts for it. Validation, ``ENV_VARS``, environment
parsing, the table on the Configuration page (:func:`markdown_table`) and the test of
``configure()``'s signature all read this one table.

Every number has an upper bound, far past any useful value, so that nothing profkit later
computes from a setting can overflow (``int(slow_ms * 1e6)``, a lock timeout past
``threading.TIMEOUT_MAX``, ``float()`` of a huge int); ``trigger_signal`` takes only signals
nobody else owns.

Explicit ``configure()`` arguments are validated strictly and raise ``ValueError`` naming the
setting. Environment variables only fill settings that were not passed; a malformed one warns
(``ProfkitConfigWarning``) and falls back to the default, so a bad deployment variable never
crashes an import or a request.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import os
import re
import textwrap
import warnings
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from ._settings import (
    ACTIVITY,
    DIRECTORY,
    EXPORTER_NAMES,
    EXPORTER_OBJECTS,
    FLAG,
    KEY,
    LOGGER,
    MAX_COUNT,
    METER_PROVIDER,
    PROVIDER,
    SIGNAL,
    Setting,
    int_in,
    number_in,
)

__all__ = [
    "ENV_VARS",
    "MAX_EXPORT_TIMEOUT",
    "Config",
    "ProfkitConfigWarning",
    "build_config",
    "markdown_table",
    "setting",
]

#: longest ``export_timeout`` (an hour): an exporter that may take longer per window than
#: this is hung, and timeouts near ``threading.TIMEOUT_MAX`` overflow the standard library
MAX_EXPORT_TIMEOUT = 3600.0
#: the longest ``slow_ms``, an hour: a call slower than that is not a latency question, and
#: the threshold becomes integer nanoseconds (``int(slow_ms * 1e6)``)
_HOUR_MS = 3_600_000


class ProfkitConfigWarning(UserWarning):
    """A ``PROFKIT_*`` environment variable could not be parsed and was ignored."""


# -- the table ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
    """Every profkit setting. Build it with :func:`profkit.configure`; fields are read-only."""

    enabled: bool = field(default=True, metadata=FLAG)
    """Master switch. When false, decorated code runs unprofiled and nothing is counted."""

    sample_every: int | None = field(default=None, metadata=int_in(1, MAX_COUNT, none=True))
    """Profile one root call in N of each label (counted per label, exact). Default 100 when no
    rate is given."""

    sample_rate: float | None = field(
        default=None, metadata=number_in(0, 1, closed=True, none=True)
    )
    """Profile this fraction of root calls, consistent with the active OTel trace id."""

    cold_calls: int = field(default=3, metadata=int_in(0, 1_000_000))
    """The first root calls of each label in a session that the sampler never chooses (cold:
    kernel selection, allocator, compile); 0 turns it off. Not applied when every call is
    profiled (``sample_every=1``, ``sample_rate=1.0``)."""

    max_per_minute: float | None = field(default=60.0, metadata=number_in(0, 1e6, none=True))
    """Cap on profiles exported per minute (token bucket, bursts up to the same number): the
    windows the sampler, the baggage or a signal opens, and the speculative windows that keep
    a slow call (``capture_slow``; those released unread are paid from ``max_overhead``);
    None means no cap. The default, one a second on average, bounds what profkit costs a
    busy service whatever the sampling rate."""

    max_overhead: float | None = field(default=None, metadata=number_in(0, 1, none=True))
    """Largest share of the process's CPU time profkit may use (0.01: 1%), over the last ~10 s;
    past it, sampled calls are skipped (``skipped_budget``) and no speculative window opens.
    None means no budget for sampled calls; ``capture_slow``'s speculative windows then stop
    at 1% (docs/targeted-capture.md)."""

    capture_slow: bool = field(default=False, metadata=FLAG)
    """Time root calls per label and profile some speculatively; export those slower than the
    label's recent p95 (policy "slow"), release the others unread."""

    slow_ms: float | None = field(default=None, metadata=number_in(0, _HOUR_MS, none=True))
    """With ``capture_slow``: a call slower than this many ms is slow (None: the label's p95)."""

    baggage_trigger: bool = field(default=False, metadata=FLAG)
    """Profile a root call whose OTel baggage holds ``profkit.profile=1`` (policy "baggage");
    still under ``max_per_minute`` and ``max_overhead``."""

    trigger_signal: str | None = field(default=None, metadata=SIGNAL)
    """Signal name ("SIGUSR1") on which the process profiles its next root call; None: none."""

    window: int = field(default=1, metadata=int_in(1, MAX_COUNT))
    """Root calls recorded per profiler window (on the thread that opened it)."""

    warmup: int = field(default=0, metadata=int_in(0, MAX_COUNT))
    """Root calls run under the profiler and discarded before the recorded ones."""

    activities: str = field(default="auto", metadata=ACTIVITY)
    """Profiler activities: "auto" (CPU, plus CUDA when available), "cpu", "cuda", "cpu,cuda"."""

    record_shapes: bool = field(default=False, metadata=FLAG)
    """Record operator input shapes (rows are then grouped by name and shapes)."""

    profile_memory: bool = field(default=False, metadata=FLAG)
    """Record tensor allocations (self CPU / device memory per op)."""

    with_flops: bool = field(default=False, metadata=FLAG)
    """Estimate FLOPs for matmul and convolution ops."""

    with_stack: bool = field(default=False, metadata=FLAG)
    """Record Python stacks (expensive; for the Chrome trace only)."""

    all_threads: bool = field(default=False, metadata=FLAG)
    """Record every thread, not only the sampled call's (for handlers that offload to pools)."""

    resident: bool = field(default=False, metadata=FLAG)
    """On an event loop's thread, keep the profiler on between speculative windows with its
    collection off: a window then costs a toggle, not a start and stop. Off by default: while
    it is on, code that checks torch's profiler flag (a compiled forward) pays for it."""

    top_k: int = field(default=10, metadata=int_in(1, MAX_COUNT))
    """Op rows kept per scope; the rest is folded into one "other" row."""

    max_window_s: float = field(default=1.0, metadata=number_in(0, 3600))
    """Seconds a window may record; past it, it stops at profkit's next checkpoint (truncated)."""

    max_events: int = field(default=20_000, metadata=int_in(1, MAX_COUNT))
    """Profiler events summarised per window; past it, the earliest are kept (truncated)."""

    queue_size: int = field(default=16, metadata=int_in(1, 1_000_000))
    """Stopped windows waiting for the export worker; a full queue drops and counts."""

    export_timeout: float = field(default=5.0, metadata=number_in(0, MAX_EXPORT_TIMEOUT))
    """Seconds one exporter may take for one window before it is cut off and counted."""

    exporters: tuple[str, ...] = field(default=("otel", "log"), metadata=EXPORTER_NAMES)
    """Built-in exporters by name: "otel" (spans), "log" (structlog events), "console", "json"."""

    trace_dir: str | None = field(default=None, metadata=DIRECTORY)
    """Directory for one Chrome/Perfetto trace file per window; None disables trace files."""

    trace_max_files: int = field(default=20, metadata=int_in(1, MAX_COUNT))
    """Trace files kept in ``trace_dir`` (oldest removed first)."""

    trace_max_bytes: int = field(default=200 * 1024 * 1024, metadata=int_in(1, 2**40))
    """Total bytes of trace files kept in ``trace_dir``."""

    trace_gzip: bool = field(default=True, metadata=FLAG)
    """Write trace files gzip-compressed (``.json.gz``)."""

    max_attribute_length: int = field(default=256, metadata=int_in(1, MAX_COUNT))
    """Longest string (label, op name, attribute value) written to a span or log event."""

    max_attributes: int = field(default=64, metadata=int_in(1, MAX_COUNT))
    """User attributes kept per scope."""

    launch_bound_op_us: float = field(default=20.0, metadata=number_in(0, 1e6))
    """Diagnosis: median op self time (µs) at or below which many ops can read as launch-bound.

    An op row whose mean per event is at most this is *tiny*: a call is launch-bound only when
    tiny ops and the glue between ops take most of its time in and between ops. Also the
    launch-glue allowance: this much host time per op event outside the ops (Python,
    dispatch, profiler bookkeeping between ops) counts as launching them, not as input.
    """

    launch_bound_min_ops: int = field(default=200, metadata=int_in(1, MAX_COUNT))
    """Diagnosis: ops per call at or above which a call can be launch-bound."""

    input_bound_share: float = field(default=0.5, metadata=number_in(0, 1))
    """Diagnosis: share of the call outside torch ops (less launch glue) making it input-bound."""

    compute_bound_top2_share: float = field(default=0.6, metadata=number_in(0, 1))
    """Diagnosis: share of op time taken by the top two ops at which a call is compute-bound."""

    tracer_provider: Any = field(default=None, metadata=PROVIDER)
    """OTel TracerProvider for spans, flushed by profkit's flushes; None uses the global one,
    which profkit never flushes."""

    metrics: bool = field(default=False, metadata=FLAG)
    """OpenTelemetry metrics: ``profkit.call.duration`` of every root call, ``profkit.op.self_time``
    of each exported call's op rows, the ``stats()`` counters (see Fleet view)."""

    meter_provider: Any = field(default=None, metadata=METER_PROVIDER)
    """OTel MeterProvider for ``metrics``; None uses the global one. No profkit instrument is
    made on any provider while ``metrics`` is off."""

    logger: Any = field(default=None, metadata=LOGGER)
    """structlog-style logger (``info``, ``warning``) for events; None uses
    ``structlog.get_logger("profkit")``."""

    extra_exporters: tuple[Any, ...] = field(default=(), metadata=EXPORTER_OBJECTS)
    """Exporter objects (see :class:`profkit.exporters.Exporter`) added to the named ones."""

    @property
    def every(self) -> int | None:
        """The effective 1-in-N setting (100 when neither sampling setting is given)."""
        if self.sample_rate is not None:
            return None
        return self.sample_every if self.sample_every is not None else 100


_SETTINGS: Mapping[str, Setting] = {f.name: f.metadata[KEY] for f in dataclasses.fields(Config)}

#: env var name for each setting that is a value (objects have none)
ENV_VARS: Mapping[str, str] = {
    name: f"PROFKIT_{name.upper()}" for name, spec in _SETTINGS.items() if spec.parse is not None
}


def setting(name: str) -> Setting:
    """The table's entry for ``name``; ``ValueError`` for a setting that does not exist."""
    spec = _SETTINGS.get(name)
    if spec is None:
        raise ValueError(f"unknown profkit setting {name!r}")
    return spec


# -- validation and the environment --------------------------------------------------------


def _repr(value: Any) -> str:
    """``repr(value)`` for an error message, short, and never raising."""
    try:
        text = repr(value)
    except Exception:  # an int past str()'s digit limit; an object whose __repr__ raises
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= 100 else text[:97] + "..."


def _validate_one(name: str, value: Any) -> None:
    spec = setting(name)
    if not spec.check(value):
        raise ValueError(f"profkit setting {name!r}: must be {spec.rule}, got {_repr(value)}")


def validate(values: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the first setting in ``values`` that is not acceptable."""
    for name, value in values.items():
        _validate_one(name, value)
    if values.get("sample_every") is not None and values.get("sample_rate") is not None:
        raise ValueError(
            "profkit settings 'sample_every' and 'sample_rate' are exclusive: give one of them"
        )


def _from_env(name: str, environ: Mapping[str, str]) -> tuple[bool, Any]:
    var = ENV_VARS[name]
    if var not in environ:
        return False, None
    raw = environ[var]
    spec = _SETTINGS[name]
    try:
        value = spec.coerce(spec.parse(raw)) if spec.parse is not None else None
        _validate_one(name, value)
    except ValueError as exc:
        warnings.warn(
            f"profkit: ignoring {var}={_repr(raw)} ({exc}); using the default",
            ProfkitConfigWarning,
            stacklevel=4,
        )
        return False, None
    return True, value


def _coerced(name: str, value: Any) -> Any:
    try:
        return setting(name).coerce(value)
    except ValueError as exc:  # (a PathLike whose __fspath__ raised): name the setting
        raise ValueError(f"profkit setting {name!r}: {exc}") from None


def build_config(overrides: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Config:
    """Validate ``overrides`` strictly, fill the rest from ``environ`` leniently, build a Config."""
    values = {name: _coerced(name, value) for name, value in overrides.items()}
    validate(values)
    env = os.environ if environ is None else environ
    sampling_given = "sample_every" in values or "sample_rate" in values
    for name in ENV_VARS:
        if name in values or (sampling_given and name in ("sample_every", "sample_rate")):
            continue
        found, value = _from_env(name, env)
        if found:
            values[name] = value
    if values.get("sample_every") is not None and values.get("sample_rate") is not None:
        warnings.warn(
            "profkit: PROFKIT_SAMPLE_EVERY and PROFKIT_SAMPLE_RATE are both set; using the rate",
            ProfkitConfigWarning,
            stacklevel=3,
        )
        values["sample_every"] = None
    return Config(**values)


# -- the docs' table ------------------------------------------------------------------------

_HEADER = ("Setting", "Environment variable", "Type", "Default", "Accepted values", "Description")


def field_docs() -> dict[str, str]:
    """The docstring under each ``Config`` field, read from the source (one line each)."""
    (tree,) = ast.parse(textwrap.dedent(inspect.getsource(Config))).body
    assert isinstance(tree, ast.ClassDef)
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(tree.body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _markdown(text: str) -> str:
    """Docstring text as a table cell: ``x`` and :class:`x` -> `x`, pipes escaped."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    parts = text.split("`")  # inside code spans Python-Markdown does not split cells
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def markdown_table() -> str:
    """The settings table of docs/configuration.md: one row per ``Config`` field, in order."""
    docs = field_docs()
    lines = ["| " + " | ".join(_HEADER) + " |", "|" + "---|" * len(_HEADER)]
    for f in dataclasses.fields(Config):
        env = ENV_VARS.get(f.name)
        cells = (
            f"`{f.name}`",
            f"`{env}`" if env else "—",
            f"`{f.type}`",
            f"`{f.default!r}`",
            _markdown(_SETTINGS[f.name].rule),
            _markdown(docs.get(f.name, "")),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
