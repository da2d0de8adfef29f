"""When a call's own code ran, for the attribution rule (:mod:`profkit._summary.builder`):
the intervals of a sampled coroutine's (or generator's) steps, and of each child task running
one of its decorated coroutines (``asyncio.gather``); ops on the call's thread outside them
were another task's."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from .._records import CallRecord
from .events import EventView

__all__ = ["in_intervals", "steps_of"]

#: tolerance placing an op in a task's running interval (the clocks agree to well under it)
_TASK_SLACK_NS = 1_000


def in_intervals(v: EventView, intervals: Sequence[tuple[int, int]]) -> bool:
    """Whether an op ran inside one of a task's running intervals (it starts and ends there)."""
    i = bisect.bisect_right(intervals, (v.start_ns + _TASK_SLACK_NS, 1 << 63)) - 1
    if i < 0:
        return False
    end = intervals[i][1]
    return bool(v.start_ns <= end and v.end_ns <= end + _TASK_SLACK_NS)


def steps_of(
    call: CallRecord, i: int, intervals: Sequence[tuple[int, int]] | None
) -> Sequence[tuple[int, int]] | None:
    """When scope ``i`` ran: its child task's intervals (its own, or an enclosing scope's in
    that task: a decorated coroutine run by ``asyncio.gather``), else the call's."""
    while i > 0:
        rec = call.scopes[i]
        if rec.intervals is not None:
            return sorted(rec.intervals)
        i = rec.parent
    return intervals
