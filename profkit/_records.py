"""Plain records with no torch: what the request path fills and the worker reads.

``ScopeRecord`` and ``CallRecord`` are written on the request path by the scope and the
session; ``RawEvent`` is one profiler event as profkit's own reader gives it to the summary.
Nothing here imports torch, so the summary builder is testable on synthetic records.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ._model import CodeInfo

if TYPE_CHECKING:
    from ._window import Window

__all__ = [
    "COMPILED",
    "CallRecord",
    "CompiledLabels",
    "Policy",
    "RawEvent",
    "ScopeRecord",
    "Unreadable",
    "WindowEvents",
]


class Policy(enum.Enum):
    """Why a root call runs under the profiler (``CallSummary.policy`` says it as text).

    A speculative call (``capture_slow``) is judged when it ends: it becomes ``SLOW``
    (exported) or ``RELEASED`` (never read). Only the judge changes a call's policy.
    """

    SAMPLER = "sampler"
    """The sampler chose it (exported as the sampler's description: "every:100")."""
    TRIGGER = "trigger"
    BAGGAGE = "baggage"
    WINDOW = "window"
    """It joined a window opened for an earlier call (``window`` > 1)."""
    SPECULATIVE = "speculative"
    SLOW = "slow"
    RELEASED = "released"

    @property
    def exported(self) -> bool:
        """Whether a call with this policy is read and exported."""
        return self is not Policy.SPECULATIVE and self is not Policy.RELEASED


@dataclasses.dataclass(slots=True)
class ScopeRecord:
    """A scope entered under a sampled call, timed by Python (profiler times replace these)."""

    label: str
    parent: int
    attributes: dict[str, Any]
    code: CodeInfo | None
    thread: int
    start_ns: int
    end_ns: int = 0
    rf: Any = None
    """The scope's open ``record_function`` range (None once closed, or never opened)."""

    def close(self) -> Exception | None:
        """Close the range and take the end time, once; returns what the range's exit raised.

        Called on the scope's exit, and for every open scope when its window is cut short.
        A range that finds no stack left to close (deep in a recursion) stays open for the
        root call's :meth:`CallRecord.close_scopes`, which runs with stack to spare.
        """
        rf, self.rf = self.rf, None
        failure: Exception | None = None
        try:
            if rf is not None:
                rf.__exit__(None, None, None)
        except RecursionError:
            self.rf = rf
        except Exception as exc:
            failure = exc
        finally:
            if self.end_ns == 0:
                self.end_ns = time.time_ns()
        return failure


@dataclasses.dataclass(slots=True)
class CallRecord:
    """One root call run under a window; filled on the request path, read by the worker."""

    window: Window
    index: int
    policy: Policy
    warmup: bool
    parent_span_context: object | None
    thread_name: str
    scopes: list[ScopeRecord] = dataclasses.field(default_factory=list)
    intervals: list[tuple[int, int]] | None = None
    error: BaseException | None = None
    done: bool = False
    """The root call has ended."""
    stopped: bool = False
    """Nothing more is recorded for this call: it ended, or its window was cut short."""
    truncated: str | None = None
    """Why the window stopped before the call ended ("max_window_s", "first_step", ...)."""
    slow_threshold_ms: float | None = None
    """A speculative call found slow: the threshold its duration beat (``capture_slow``)."""
    unsampled_p50_ms: float | None = None
    """The label's recent unprofiled median when the call ended (``capture_slow``)."""
    worker_busy_ns: int = 0
    """A speculative call: the export worker's busy time when it began (see ``judge``)."""
    sampler: str = ""
    """The sampler's description, for policy ``SAMPLER``."""

    @property
    def policy_name(self) -> str:
        """The policy as exported: the sampler's description, or the policy's name."""
        return self.sampler if self.policy is Policy.SAMPLER else self.policy.value

    def close_scopes(self) -> Exception | None:
        """Close every scope still open, innermost first; returns a failure, if any."""
        failure: Exception | None = None
        for record in reversed(self.scopes):
            if record.end_ns == 0 or record.rf is not None:
                failure = record.close() or failure
        return failure


class CompiledLabels:
    """Which profkit labels ``torch.compile`` traced into which compiled frame, process-wide.

    Filled at trace time (:func:`profkit._compiler.compiled_away`), keyed by compile id
    (``"0/0"``: frame 0, first compile), read by the summary for the compiled regions a
    sampled call ran. Bounded: past ``limit`` compile ids, new ones are not noted.
    """

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._labels: dict[str, tuple[int, tuple[str, ...]]] = {}

    def note(self, compile_id: str, label: str, compile: int) -> None:
        """Note ``label`` under ``compile_id``; a new ``compile`` (token) of an id replaces it."""
        token, known = self._labels.get(compile_id, (compile, ()))
        if token != compile:
            known = ()  # the id was reused (after torch._dynamo.reset()): forget the old compile
        if label not in known and (compile_id in self._labels or len(self._labels) < self._limit):
            self._labels[compile_id] = (compile, (*known, label))  # one store: no lock needed

    def labels(self, compile_id: str) -> tuple[str, ...]:
        """The labels traced into ``compile_id``, in trace order (empty if none or unknown)."""
        return self._labels.get(compile_id, (0, ()))[1]


#: the process-wide registry of labels compiled away
COMPILED = CompiledLabels()


class RawEvent:
    """One CPU profiler event as profkit's reader gives it; the summary reads it as it is.

    It carries the fields of :class:`profkit._summary.EventView` (times in epoch ns on the
    ``time.time_ns()`` clock, as kineto reports them) and the ``FunctionEvent`` fields the
    op rows add up (µs), so the summary needs no wrapper object per event. ``self`` time is
    set by the reader once the events are nested.
    """

    __slots__ = (
        "cpu_time_total",
        "end_ns",
        "flops",
        "input_shapes",
        "is_async",
        "name",
        "self_cpu_time_total",
        "start_ns",
        "thread",
        "user",
    )

    # what a CPU event without memory profiling has (EventView and FunctionEvent names)
    device = False
    device_type = "DeviceType.CPU"
    id = -1
    linked = 0
    linked_correlation_id = 0
    self_device_time_total = 0.0
    device_time_total = 0.0
    self_cpu_memory_usage = 0
    self_device_memory_usage = 0

    def __init__(
        self,
        name: str,
        thread: int,
        start_ns: int,
        end_ns: int,
        is_async: bool,
        user: bool,
        flops: int = 0,
        input_shapes: Any = None,
    ) -> None:
        self.name = name
        self.thread = thread
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.is_async = is_async
        self.user = user
        self.flops = flops
        self.input_shapes = input_shapes
        self.cpu_time_total: float = (end_ns - start_ns) / 1000
        self.self_cpu_time_total: float = 0.0 if is_async else self.cpu_time_total

    @property
    def ev(self) -> RawEvent:
        """The event an ``EventView`` wraps: this one is its own view."""
        return self

    @property
    def is_user_annotation(self) -> bool:
        return self.user


class Unreadable(Exception):
    """A stopped window whose events cannot be summarised; ``reason`` is the drop reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class WindowEvents(NamedTuple):
    """A stopped window's events, ready for the summary builder."""

    raw_count: int
    """Raw profiler events in the window (before filtering)."""
    trace_start_ns: int
    """The trace start on the ``time.time_ns()`` clock: event times are µs after it."""
    events: Sequence[Any]
    """``RawEvent``s from profkit's reader, or torch's ``FunctionEvent``s."""
    cut: bool = False
    """More than ``max_events`` were recorded: only the earliest ``max_events`` are here."""
