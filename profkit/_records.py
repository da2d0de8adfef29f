"""Plain records with no torch that the request path fills and the worker reads.

``ScopeRecord`` and ``CallRecord`` are written on the request path by the scope and the
window owner; ``Policy`` says why a call is profiled; ``StoppedWindow`` is what the export
stage reads of a window, and ``StageWindow`` one slow call's regions without a window
(``capture_slow``'s stage record). Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
import time
from typing import Any, Protocol

from ._model import BatchSummary, CodeInfo

__all__ = ["CallRecord", "Policy", "ScopeRecord", "StageWindow", "StoppedWindow"]


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
    SLOW_STAGES = "slow_stages"
    """A slow call that no window watched (``capture_slow``): its regions, timed by Python,
    and no op rows (a :class:`StageWindow`)."""
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
    rf: list[Any] | None = None
    """The scope's ``record_function`` range: ``[handle]`` while open (``[]`` while it
    opens: see :func:`profkit._label.scope._open`), None once closed or never opened."""
    intervals: list[tuple[int, int]] | None = None
    """A decorated coroutine of the call in a child task: when that task ran it (its ops,
    and its nested scopes', are those on its thread inside these). The root's, of a sampled
    coroutine or generator: its own steps alone, without its child tasks' (the scopes nested
    in the root's task take their ops from these; ``CallRecord.intervals`` has both)."""
    error: BaseException | None = None
    """The exception that left the scope (its span's status is ERROR), if one did."""

    def close(self) -> Exception | None:
        """Close the range and take the end time; returns what the range's exit raised.

        Called on the scope's exit, and for every open scope when its window is cut short.
        The range ends when its handle goes (torch's ``_RecordFunction`` ends its range as
        it is destroyed): the ``clear()`` of the list that holds it, one C call, so a
        signal's exception lands before or after the end, never inside, and a retry finds
        nothing left to end. A range let go of unended elsewhere (a traceback, a reference
        cycle) would end when collected, maybe under the next window's profiler, whose
        memory its end writes into (torch 2.13: SIGSEGV).
        """
        box = self.rf
        failure: Exception | None = None
        try:
            if box:
                box.clear()  # the range ends here
            self.rf = None
        except Exception as exc:  # (torch's end callbacks run in a destructor: none raise)
            self.rf = None
            failure = exc
        finally:
            if self.end_ns == 0:
                self.end_ns = time.time_ns()
        return failure


class StoppedWindow(Protocol):
    """What the export stage reads of a stopped window (the capture's ``Window``)."""

    id: int
    calls: list[CallRecord]
    handed: bool
    """Queued for the export worker, which counts its calls from then on."""

    @property
    def recorded(self) -> int: ...

    def read(self) -> Any: ...

    def write_chrome_trace(self, path: str) -> None: ...

    def release(self) -> None: ...


@dataclasses.dataclass(slots=True)
class CallRecord:
    """One root call run under a window; filled on the request path, read by the worker."""

    window: Any
    """The window it runs in (``profkit._capture.window.Window``; typed loosely: the
    records sit below the capture)."""
    index: int
    policy: Policy
    warmup: bool
    parent_span_context: object | None
    thread_name: str
    scopes: list[ScopeRecord] = dataclasses.field(default_factory=list)
    intervals: list[tuple[int, int]] | None = None
    tasks: Any = None
    """The asyncio tasks recording ``intervals`` now (the root's, and each child task running
    a decorated coroutine of the call): one task's steps are recorded once, never nested."""
    interleaved: bool = False
    """Its event loop ran other callbacks inside the root, whose steps are not known (a root
    ``region()`` across an ``await``): another task's ops may be in its range (``window``)."""
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
    entered_ns: int = 0
    """When the root's ``record_function`` range had started (``time_ns``; 0: none): the
    judge times a speculative call from here, after the stall a profiler start may cause."""
    worker_busy_ns: int = 0
    """A speculative call: the export worker's busy time when it began (see ``judge``)."""
    tid: int = 0
    """A speculative call: its thread's native id (0: not known)."""
    sched_ns: tuple[int, int, int] = (-1, 0, -1)
    """A speculative call: its thread's CPU time, time waiting for a CPU, and voluntary
    context switches, ever, when its root's range had started (see ``judge``; -1: unknown)."""
    sampler: str = ""
    """The sampler's description, for policy ``SAMPLER``."""
    cold: bool = False
    """Profiled (a trigger, baggage, a window's later call) while its label was still cold:
    one of its first ``cold_calls`` root calls, which the sampler never chooses."""
    counted: int = 0
    """Which steps of its accounting are done (``profkit._stats.JOINED``, ...): each is
    counted once, however often an interrupted step is retried."""
    batch: BatchSummary | None = None
    """A batch root call (``profkit.batch``): its members and their shares."""
    cpu_start_ns: int = 0
    """A plain synchronous sampled root: its thread's CPU time (``thread_time_ns``) when the
    decision returned; 0: not timed (see :mod:`profkit._overhead`)."""
    cpu_charged: bool = False
    """Its CPU time beyond its label's baseline was charged to profkit when it ended (then
    the window's per-event estimate is not charged for it)."""

    @classmethod
    def begin(cls, policy: Policy, parent: Any, sampler: str = "") -> CallRecord:
        """A record for a root call on this thread, before it joins a window."""
        valid = parent if parent is not None and parent.is_valid else None
        return cls(None, 0, policy, False, valid, threading.current_thread().name, sampler=sampler)

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


#: a stage: (label, attributes, code, start, end), times in ``perf_counter_ns``
Stage = tuple[str, dict[str, Any], "CodeInfo | None", int, int]


@dataclasses.dataclass(slots=True)
class StageWindow:
    """A slow root call that no window watched (``capture_slow``), as the export stage reads
    it: one call (policy ``SLOW_STAGES``), its root and its regions timed on
    ``perf_counter_ns`` (epoch ns = perf ns + ``offset``), no events to read. The worker
    builds its summary (:mod:`profkit._summary.stages`) instead of reading a profile."""

    call: CallRecord
    label: str
    attributes: dict[str, Any]
    code: CodeInfo | None
    start: int
    end: int
    offset: int
    stages: list[Stage] = dataclasses.field(default_factory=list)
    calls: list[CallRecord] = dataclasses.field(default_factory=list)
    id: int = 0
    """No window (``profkit.window.id`` 0)."""
    handed: bool = False

    @property
    def recorded(self) -> int:
        return len(self.calls)

    def read(self) -> Any:
        raise TypeError("a stage record has no events to read")

    def write_chrome_trace(self, path: str) -> None:
        raise TypeError("a stage record has no trace")

    def release(self) -> None:
        self.stages = []
