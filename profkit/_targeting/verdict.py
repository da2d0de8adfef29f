"""The verdict on a speculative call (``capture_slow``): kept as slow, or released unread.

Run when such a call ends, and for the calls still running when their window is cut short.
"""

from __future__ import annotations

from typing import Any

from .._records import CallRecord, Policy
from .._stats import Stats
from .slow import LatencyBook, sched_ns

__all__ = ["judge"]


def judge(book: LatencyBook, stats: Stats, call: CallRecord, busy_ns: Any) -> None:
    """A profiled call ended under capture_slow: the label's unprofiled median beside it
    (the observer effect); a speculative call is kept when slower than the threshold.

    What the export worker took of the call's time (its busy time while the call ran: it
    holds the GIL while it summarises) does not count, nor does the time its thread waited
    for a CPU (:func:`profkit._targeting.slow.waited_ns`: a profiler's start stalls the call
    a scheduler tick on a busy machine); what the profiler added to the call
    is taken off by the book (:meth:`LatencyBook.judge`). A call still running when its
    window is cut short is judged on its time until the cut (the slowest calls outlast a
    window).
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
    if limit is not None:
        call.slow_threshold_ms = limit / 1e6
        stats.judge(call, Policy.SLOW, "sampled")  # (one step: policy and count, once)
    else:
        stats.judge(call, Policy.RELEASED, "speculative_released")
        # its per-op recording is profkit's cost too: the worker, which charges a read
        # window's, never sees a released call (the profiled-less-unprofiled median)
        stats.cpu.charge(book.inflation_ns(label) / 1e9)


def _own_ns(call: CallRecord, wall: int, busy: int) -> int:
    """The call's wall time less its thread's waits for a CPU and less what the export
    worker may have taken of it: its busy time, but no more than the call's thread spent
    off a CPU (while the worker holds the GIL the call's thread sleeps; where none is
    known, all of it)."""
    if not call.tid or not call.sched_ns[0]:
        return wall - busy
    cpu0, wait0 = call.sched_ns
    cpu, wait = sched_ns(call.tid)
    if not cpu:  # (its thread is gone)
        return wall - busy
    waited = max(0, wait - wait0)
    off_cpu = max(0, wall - (cpu - cpu0) - waited)
    return wall - waited - min(busy, off_cpu)
