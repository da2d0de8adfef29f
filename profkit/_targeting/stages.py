"""Stage records (``capture_slow``): a slow call that no window watched, exported by its regions.

With ``capture_slow`` on, a root call left unprofiled is decided ``(STAGED, Stages)``
instead of ``(TIMED, start)``: its :class:`Stages` is the scope's frame while it runs, and
each nested ``region()`` (or decorated function) it enters appends ``(label, attributes,
code, start, end)`` on ``perf_counter_ns``: a clock pair and an append, no torch, no
``record_function``, no allocation of its own for a decorated function. When the root call
ends, :meth:`StageRecorder.ended` notes its duration in the latency book, as a timed call's;
over its label's slow threshold, the call becomes a :class:`profkit._records.StageWindow`
(policy ``"slow_stages"``: no op rows) on the export queue, within a rate cap of its own
(``max_per_minute`` records a minute; the others are counted as dropped,
``stage_rate_limit``). Everything else (clock conversion, nesting, bounding) is done on the
export worker (:mod:`profkit._summary.stages`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from .. import _errors
from .._model import CodeInfo
from .._records import CallRecord, Policy, StageWindow
from .._sampling import RateLimiter
from .._stats import Stats
from .slow import LatencyBook

__all__ = ["STAGE_BAR", "STALLS", "StageRecorder", "Stages"]

_now = time.perf_counter_ns
#: without ``slow_ms``, a stage record's call took at least this many times its label's
#: recent unprofiled median (and its threshold)
STAGE_BAR = 4.0


class _Stalls:
    """The time profkit has held the process, ever (ns): its windows' starts and stops (the
    window owner times them, :meth:`timed`). A start or stop holds every Python thread (an
    event loop and all its tasks) still, which makes the calls in flight slow for a reason
    that is not theirs: a stage record's call is judged without it. (Not the garbage
    collector's pauses: a ``gc.callbacks`` hook is Python code in which a signal handler's
    exception, a request's timeout, would be swallowed.)"""

    def __init__(self) -> None:
        self.ns = 0

    def timed(self) -> _Timed:
        """``with STALLS.timed():`` around a window's start or stop (the window owner's)."""
        return _Timed(self)


class _Timed:
    """A stretch of time in which profkit held the process (lock-free: a race loses a few
    µs, never a call)."""

    __slots__ = ("_stalls", "_t0")

    def __init__(self, stalls: _Stalls) -> None:
        self._stalls = stalls
        self._t0 = 0

    def __enter__(self) -> None:
        self._t0 = _now()

    def __exit__(self, *exc: object) -> None:
        self._stalls.ns += _now() - self._t0


#: the time profkit held the process (all sessions)
STALLS = _Stalls()


class Stages(list):  # type: ignore[type-arg]  # (a list: its regions are appended in C)
    """The frame of an unprofiled root call under ``capture_slow``: the regions it entered,
    each ``(label, attributes, code, start, end)`` in ``perf_counter_ns``, in the order they
    ended. The tasks and threads that copy its context append to it too, until it is
    ``done`` (then their scopes are root calls again, as after any call)."""

    __slots__ = ("attributes", "code", "done", "label", "parent", "recorder", "stalls0", "t0")
    stopped: ClassVar[bool] = False  # (what a nested scope reads of ``frame.call``)
    policy: ClassVar[None] = None  # nothing asked for it to be profiled (batch_member)

    def __init__(self, recorder: StageRecorder, label: str, parent: Any, t0: int) -> None:
        self.recorder = recorder
        self.label = label
        self.parent = parent
        self.t0 = t0
        self.stalls0 = STALLS.ns
        self.done = False
        #: the root's own (a ``region()``'s, set where it is entered; a decorated
        #: function's are handed to :meth:`end`)
        self.attributes: dict[str, Any] | None = None
        self.code: CodeInfo | None = None

    @property
    def call(self) -> Stages:
        return self

    def end(
        self,
        error: BaseException | None = None,
        attributes: dict[str, Any] | None = None,
        code: CodeInfo | None = None,
    ) -> None:
        """The root call returned (or raised): hand it to the recorder, once."""
        if not self.done:
            self.done = True
            recorder = self.recorder
            try:
                took = _now() - self.t0
                if attributes is None:
                    attributes, code = self.attributes, self.code
                recorder.ended(self, took, error, attributes, code)
            except Exception as exc:  # counted, never raised into the host
                _errors.internal(recorder.stats, "stage_record", exc)

    def leave(self, set_frame: Callable[[Any], Any] | None, error: BaseException | None) -> None:
        """The scope's exit (``profkit._label.scope.exit_``): the frame set back (given its
        ``set``), then :meth:`end`."""
        if set_frame is not None:
            set_frame(None)
        self.end(error)

    def close_scopes(self) -> None:
        """Nothing to close (the scope protocol of an interrupted root call)."""
        return None

    def __repr__(self) -> str:
        return f"<profkit stages of {self.label!r} done={self.done}>"


class StageRecorder:
    """A session's stage records: the end of every :class:`Stages`, the slow ones exported.

    A call is slow by its label's threshold in the latency book (``slow_ms``, else its
    recent p95 kept between 2x and 4x its median), on its wall time less the time profkit
    held the process meanwhile (:data:`STALLS`). Unlike a speculative call's verdict, its
    thread's waits for a CPU are not known (reading them costs ~2 µs a call, on every
    call): without ``slow_ms`` the bar is the top of the rule's clamp, :data:`STAGE_BAR`
    times the median (on 8 pool threads of a busy 2-core machine, fast calls held up a few
    ms by the scheduler were a third of the records at 2x).
    """

    def __init__(
        self,
        book: LatencyBook,
        stats: Stats,
        offer: Callable[[Any], None],
        max_per_minute: float | None,
    ) -> None:
        self._book = book
        self.stats = stats
        #: the pipeline's ``offer`` (queued for the worker, or counted as dropped)
        self._offer = offer
        self._limiter = RateLimiter(max_per_minute) if max_per_minute else None
        self._lock = threading.RLock()  # the bucket, slow calls only (re-entrant: a signal)
        #: ``metrics``: the instruments' ``timed((label, ns))`` (every root call's duration)
        self.also: Callable[[tuple[str, int]], None] | None = None

    def ended(
        self,
        stages: Stages,
        ns: int,
        error: BaseException | None,
        attributes: dict[str, Any] | None,
        code: CodeInfo | None,
    ) -> None:
        """A root call ended after ``ns``: noted in the book; over its label's threshold,
        a stage record for the export queue (or counted as dropped past the rate cap)."""
        also = self.also
        if also is not None:
            also((stages.label, ns))
        book = self._book
        limit = book.note(stages.label, ns)
        if not limit:
            return
        p50_ms = book.p50_ms(stages.label)
        if book.slow_ns is None and p50_ms:  # the top of the rule's clamp (see the class)
            limit = max(limit, int(STAGE_BAR * p50_ms * 1e6))
        own = ns - (STALLS.ns - stages.stalls0)
        if own <= limit:
            return  # (a call slow only by profkit's own stalls meanwhile is not)
        offset = time.time_ns() - _now()  # epoch = perf + offset (only for a slow call)
        call = CallRecord.begin(Policy.SLOW_STAGES, stages.parent)
        call.error = error
        call.done = call.stopped = True
        call.slow_threshold_ms = limit / 1e6
        call.unsampled_p50_ms = p50_ms
        record = StageWindow(
            call, stages.label, attributes or {}, code, stages.t0, stages.t0 + ns, offset
        )
        record.stages = list(stages)  # what ended so far (a task it started may go on)
        try:  # counted sampled, then queued or counted as dropped: one outcome, always
            self.stats.join(record.calls, call, "sampled")
            self.stats.add("stage_records")
            if self._limiter is not None:
                with self._lock:
                    allowed = self._limiter.allow()
                if not allowed:
                    self.stats.settle(call, "stage_rate_limit")
                    return
            self._offer(record)
        except BaseException:  # a signal's exception (a request timeout) landed in here
            if not record.handed:
                self.stats.settle(call, "interrupted")
            raise
