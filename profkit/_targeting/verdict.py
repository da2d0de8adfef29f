"""The verdict on a speculative call (``capture_slow``): kept as slow, or released unread.

Run when such a call ends, and for the calls still running when their window is cut short.
"""

from __future__ import annotations

from typing import Any

from .._records import CallRecord, Policy
from .._stats import Stats
from .slow import LatencyBook

__all__ = ["judge"]


def judge(book: LatencyBook, stats: Stats, call: CallRecord, busy_ns: Any) -> None:
    """A profiled call ended under capture_slow: the label's unprofiled median beside it
    (the observer effect); a speculative call is kept when slower than the threshold.

    What the export worker took of the call's time (its busy time while the call ran: it
    holds the GIL while it summarises) does not count; what the profiler added to the call
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
        took = root.end_ns - start - (busy_ns() - call.worker_busy_ns)
        limit = book.judge(label, took)
    if limit is not None:
        call.slow_threshold_ms = limit / 1e6
        stats.judge(call, Policy.SLOW, "sampled")  # (one step: policy and count, once)
    else:
        stats.judge(call, Policy.RELEASED, "speculative_released")
        # its per-op recording is profkit's cost too: the worker, which charges a read
        # window's, never sees a released call (the profiled-less-unprofiled median)
        stats.cpu.charge(book.inflation_ns(label) / 1e9)
