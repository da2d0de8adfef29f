"""The summary model: what one sampled root call produced, as plain frozen data.

Built by :mod:`profkit._summary.builder` on the export worker, read by the exporters and the
diagnosis. Nothing here imports torch, so exporters and the diagnosis are testable on
synthetic summaries.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Mapping, Sequence
from typing import Literal, TypeAlias

from ._text import clean, clip

__all__ = [
    "AttrValue",
    "BatchMemberSummary",
    "BatchSummary",
    "CallSummary",
    "CodeInfo",
    "Diagnosis",
    "ErrorText",
    "OpRow",
    "ScopeSummary",
    "WindowSummary",
]

AttrValue: TypeAlias = "str | bool | int | float"
Attribution = Literal["thread", "task", "window"]


@dataclasses.dataclass(frozen=True)
class CodeInfo:
    """Where a decorated function lives (OTel ``code.*`` semantic conventions)."""

    function: str
    file_path: str
    line_number: int


@dataclasses.dataclass(frozen=True)
class OpRow:
    """One row of the ``key_averages`` view: an op name (and input shapes, when recorded).

    Times are microseconds, memory is bytes. ``name == "other"`` with ``is_other`` marks the
    remainder row that keeps the top-K table adding up to the totals.
    """

    name: str
    count: int
    self_cpu_us: float
    cpu_us: float
    self_device_us: float = 0.0
    device_us: float = 0.0
    self_cpu_memory: int = 0
    self_device_memory: int = 0
    flops: int = 0
    shapes: str | None = None
    is_other: bool = False
    is_kernel: bool = False


@dataclasses.dataclass(frozen=True)
class ScopeSummary:
    """A labelled profkit scope (the root call or a nested region) and the ops under it."""

    index: int
    parent: int
    """Index of the parent scope in ``CallSummary.scopes``; -1 for the root."""
    label: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, AttrValue]
    ops: tuple[OpRow, ...]
    """Top-K rows by self CPU time (device time first when device time was recorded) + other."""
    op_count: int
    """Op events under this scope (inclusive of nested scopes)."""
    self_cpu_us: float
    """Sum of the self CPU time of every op under this scope."""
    self_device_us: float
    code: CodeInfo | None = None
    timing: Literal["profiler", "python"] = "profiler"
    error: ErrorText | None = None
    """The exception that left this scope, as bounded text (the root's is the call's
    ``error_text``); None when the scope ended normally."""

    @property
    def duration_us(self) -> float:
        return (self.end_ns - self.start_ns) / 1000.0


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """What kind of slow a call is, the figures that decided it, and where speed-ups pay."""

    verdict: Literal["input-bound", "launch-bound", "compute-bound", "balanced", "no-ops"]
    reason: str
    figures: Mapping[str, float]
    amdahl: Sequence[tuple[str, float, float]]
    """(what, fraction f of the call, best overall speed-up 1 / (1 - f)), largest f first."""
    confidence: Literal["low", "medium", "high"] = "high"
    """How far the figures are from a threshold that would change the verdict ("low": a
    borderline call, which the same code sampled again may read otherwise)."""


@dataclasses.dataclass(frozen=True)
class ErrorText:
    """The exception a call raised, as the bounded, cleaned text that exporters write.

    Each field is at most ``max_attribute_length`` characters. The exception object itself is
    ``CallSummary.error``, untouched.
    """

    type: str
    """The exception's class name."""
    message: str
    """``str(exception)``."""
    description: str
    """``"<type>: <message>"``, the span status description."""
    stacktrace: str
    """The traceback's frames, innermost kept when cut (newlines between lines)."""

    @classmethod
    def of(cls, error: BaseException, limit: int) -> ErrorText:
        """The text of ``error``, each field cleaned and cut at ``limit`` characters.

        The message is read with ``str()`` once; one that cannot be read becomes a
        placeholder. The exception itself is not changed.
        """
        kind = clean(type(error).__name__, limit)
        try:
            message = str(error)
        except Exception:
            message = "<unprintable message>"
        frames = "".join(traceback.format_tb(error.__traceback__)).splitlines()
        return cls(
            type=kind,
            message=clean(message, limit),
            description=clean(f"{kind}: {message}", limit),
            stacktrace=clip("\n".join(clean(line) for line in frames), limit, keep_end=True),
        )


@dataclasses.dataclass(frozen=True)
class BatchMemberSummary:
    """One request served by a batch (``profkit.batch``): its span and its share."""

    span_context: object | None
    """The OTel ``SpanContext`` active at ``batch_member()`` (None: no active span)."""
    share: float
    """Its part of the batch: 1/size, or its weight over the sum of the weights."""
    sampled: bool = True
    """Its trace is sampled: it gets a member span in its trace. False for a member in an
    unsampled trace or with no span at all (no trace to put one in); both are counted in
    ``stats()["batch_members_unsampled"]``."""
    trace_id: str = ""
    """Hex trace id of its member span once the span step recorded it (else empty)."""
    span_id: str = ""
    """Hex span id of its member span once the span step recorded it (else empty)."""


@dataclasses.dataclass(frozen=True)
class BatchSummary:
    """A root call that served many requests at once (``with profkit.batch(...)``)."""

    members: tuple[BatchMemberSummary, ...]
    """Every valid member, in the order given (unsampled traces too: they share the batch)."""
    weighted: bool = False
    """Shares come from ``weights`` (else each member has 1/size)."""
    truncated: int = 0
    """Members past the first ``MAX_MEMBERS`` (never read: no member span, no link; 1 for an
    iterable of unknown length that had more)."""

    @property
    def size(self) -> int:
        return len(self.members) + self.truncated


@dataclasses.dataclass(frozen=True)
class CallSummary:
    """One sampled root call: its scope tree with op tables, and how it was sampled."""

    window_id: int
    call_index: int
    label: str
    scopes: tuple[ScopeSummary, ...]
    """``scopes[0]`` is the root call; the rest are nested scopes in entry order."""
    parent_span_context: object | None
    """The OTel ``SpanContext`` active when the call began (None: no active span)."""
    policy: str
    attribution: Attribution
    error: BaseException | None = None
    """The exception the call raised (the caller got the same object), else None."""
    error_text: ErrorText | None = None
    """``error`` as bounded text: what exporters write about it."""
    thread_name: str = ""
    trace_path: str | None = None
    events_total: int = 0
    truncated: str | None = None
    """Why the window stopped before the call ended: "max_window_s" (it ran too long),
    "busy_thread" (other requests on its thread filled it), "first_step" (a generator that
    may resume on another thread), "foreign_profiler" (stopped for the user's profiler),
    "max_events" (only the earliest events were summarised), or None (complete)."""
    device_active: bool = False
    compile_us: float = 0.0
    """Time the call spent in ``torch.compile`` (dynamo, inductor) compiling a graph. Those
    events are one ``torch.compile`` row in the op tables, never counted as the model's ops."""
    compiled_labels: tuple[str, ...] = ()
    """profkit labels inside the compiled graphs the call ran: traced away by the compiler,
    so they have no span of their own (their ops are in the enclosing scope)."""
    diagnosis: Diagnosis | None = None
    slow_threshold_ms: float | None = None
    """Policy "slow": the threshold in ms the call's duration beat (``capture_slow``)."""
    unsampled_p50_ms: float | None = None
    """With ``capture_slow``: the label's recent median in ms over calls that ran without the
    profiler, beside this call's own duration (how much the profiler inflated it)."""
    cold: bool = False
    """Profiled (trigger, baggage) while its label was cold: one of the label's first
    ``cold_calls`` root calls, slower than its warm calls (the report leaves it out)."""
    trace_id: str = ""
    """Hex trace id of the call's span once the span step recorded it (else empty)."""
    span_id: str = ""
    """Hex span id of the call's span once the span step recorded it.

    Empty when no span was recorded: spans off, a no-op TracerProvider, or a provider whose
    sampler dropped the span (then nothing refers to a span that does not exist).
    """
    batch: BatchSummary | None = None
    """A batch (``profkit.batch``): the requests it served and their shares, else None."""

    @property
    def root(self) -> ScopeSummary:
        return self.scopes[0]

    @property
    def duration_us(self) -> float:
        return self.root.duration_us


@dataclasses.dataclass(frozen=True)
class WindowSummary:
    """Everything one profiler window produced."""

    window_id: int
    calls: tuple[CallSummary, ...]
    events_total: int
    trace_path: str | None = None
