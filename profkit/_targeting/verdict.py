"""The verdict on a speculative call (``capture_slow``): kept as slow, or released unread.

Run when such a call ends, and for the calls still running when their window is cut short.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._records import CallRecord, Policy
from .._stats import Stats
from .slow import LatencyBook, sched_ns

__all__ = ["SlowToken", "judge"]


class SlowToken:
    """Whether a speculative window with a call found slow may be exported: a window kept
    is one profile, so it spends one rate-cap token (``max_per_minute``), at its first slow
    call (asked again, the answer stands; a call that joined it on the sampler's pick, or a
    trigger, already made it one). Windows hold the slot one at a time: the last window's
    answer is all there is to keep."""

    def __init__(self, limiter: Any) -> None:
        self._limiter = limiter
        self._paid: tuple[int, bool] = (0, False)  # (window id, its answer)

    def allow(self, win: Any) -> bool:
        paid = self._paid
        if paid[0] == win.id:
            return paid[1]
        limiter = self._limiter
        allowed = limiter is None or any(c.policy.exported for c in win.calls) or limiter.allow()
        self._paid = (win.id, allowed)
        return allowed


def judge(
    book: LatencyBook,
    stats: Stats,
    call: CallRecord,
    busy_ns: Any,
    allow: Callable[[Any], bool] = lambda _win: True,
) -> None:
    """A profiled call ended under capture_slow: the label's unprofiled median beside it
    (the observer effect); a speculative call is kept when slower than the threshold.

    What the export worker took of the call's time (its busy time while the call ran: it
    holds the GIL while it summarises) does not count, nor does the time its thread waited
    for a CPU (:func:`profkit._targeting.slow.waited_ns`: a profiler's start stalls the call
    a scheduler tick on a busy machine); what the profiler added to the call
    is taken off by the book (:meth:`LatencyBook.judge`). A call still running when its
    window is cut short is judged on its time until the cut (the slowest calls outlast a
    window). A slow call is kept only if ``allow(call.window)`` (its window's rate-cap token:
    the rate cap counts profiles exported); else it is released and counted ``skipped_rate_limit``.
    """
    label = call.scopes[0].label if call.scopes else ""
    call.unsampled_p50_ms = book.p50_ms(label)
    if call.policy is not Policy.SPECULATIVE:
        return
    root = call.scopes[0] if call.scopes else None
    limit = None
    if root is not None:  # (end_ns: the end, or the cut)
        start = max(root.start_ns, call.entered_ns)  # after the range's start (it stalls)
        took = _own_ns(call, root.end_ns - start, busy_ns() - call.worker_busy_ns)
        limit = book.judge(label, took)
    if limit is not None and allow(call.window):
        call.slow_threshold_ms = limit / 1e6
        stats.judge(call, Policy.SLOW, "sampled")  # (one step: policy and count, once)
    elif limit is not None:  # slow, but the rate cap has no token for its window
        stats.judge(call, Policy.RELEASED, "speculative_released")
        next(stats.refused["skipped_rate_limit"])
        book.not_kept(label)
    else:
        stats.judge(call, Policy.RELEASED, "speculative_released")
        # its per-op recording is profkit's cost too: the worker, which charges a read
        # window's, never sees a released call (the profiled-less-unprofiled median); a
        # plain sync root's is charged on its thread's CPU clock as it ends instead
        if not call.cpu_start_ns:
            stats.cpu.charge(book.inflation_ns(label) / 1e9)


def _own_ns(call: CallRecord, wall: int, busy: int) -> int:
    """The call's wall time less what the machine and profkit's worker took of it.

    Its thread's waits for a CPU are taken off. A call whose thread never gave up its CPU
    itself meanwhile (no sleep, no lock or I/O wait: no voluntary context switch) is its CPU
    time: the rest was taken from it (a preemption, a virtual machine's host). Else the
    export worker's busy time meanwhile is taken off too, all of it (while the worker holds
    the GIL the call's thread sleeps; bounding it by the call's time off a CPU kept a fast
    call that the worker had slowed down, CPU time included).
    """
    if not call.tid:
        return wall - busy
    cpu0, wait0, slept0 = call.sched_ns
    cpu, wait, slept = sched_ns(call.tid)
    waited = max(0, wait - wait0)
    if cpu0 >= 0 and cpu >= 0 and slept0 >= 0 and slept == slept0:
        return min(wall - waited, max(0, cpu - cpu0))
    return wall - waited - busy
