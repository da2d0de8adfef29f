"""When a call's own code ran, for the attribution rule (:mod:`profkit._summary.builder`):
the intervals of a sampled coroutine's (or generator's) steps, and of each child task running
one of its decorated coroutines (``asyncio.gather``); ops on the call's thread outside them
were another task's."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from .._records import CallRecord
from .events import EventView

__all__ = ["in_intervals", "merged", "steps_of"]

#: tolerance placing an op in a task's running interval (the clocks agree to well under it)
_TASK_SLACK_NS = 1_000


def in_intervals(v: EventView, intervals: Sequence[tuple[int, int]]) -> bool:
    """Whether an op ran inside one of a task's running intervals (it starts and ends there)."""
    i = bisect.bisect_right(intervals, (v.start_ns + _TASK_SLACK_NS, 1 << 63)) - 1
    if i < 0:
        return False
    end = intervals[i][1]
    return bool(v.start_ns <= end and v.end_ns <= end + _TASK_SLACK_NS)


def merged(intervals: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``intervals`` sorted, those that overlap or nest joined (a coroutine run by
    ``asyncio.run`` inside a generator's step records steps inside the step's own): what
    :func:`in_intervals` needs, as it looks only at the last interval starting before an op."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def steps_of(
    call: CallRecord,
    i: int,
    intervals: Sequence[tuple[int, int]] | None,
    memo: dict[int, list[tuple[int, int]]],
) -> Sequence[tuple[int, int]] | None:
    """When scope ``i`` ran: the call's (merged) ``intervals`` for the root, which its child
    tasks' steps are part of; for a nested scope, its task's: its child task's (its own, or
    an enclosing scope's in that task: a decorated coroutine run by ``asyncio.gather``), else
    the root task's own steps, not its child tasks' (which ran beside the scope). ``memo``
    (one per call) keeps each scope's merged steps: scopes of one task share them."""
    if i == 0:
        return intervals
    while i > 0 and call.scopes[i].intervals is None:
        i = call.scopes[i].parent
    own = call.scopes[i].intervals
    if own is None:
        return intervals
    found = memo.get(i)
    if found is None:
        found = memo[i] = merged(own)
    return found
