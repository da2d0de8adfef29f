"""profkit's own CPU time, and its share of the process's CPU time over a trailing interval.

What is charged (each piece measured with ``time.thread_time`` on the thread that does it):

* on the request thread, starting a window, and stopping it and handing it off;
* on the export worker, everything it does for a window (reading, summarising, diagnosing,
  building the next profiler), and on each exporter's thread, that exporter's call.

The share is that CPU time over the process's (``time.process_time``: every thread) over the
last 9-10 seconds: checkpoints are taken at most once a second and the oldest of the last
ten is the interval's start. What is not charged, because it cannot be told apart from the
host's own work: the off-sample cost of each root call (well under a microsecond; see
docs/performance.md), the root call's own ``record_function`` ranges, and the span
processor's own export thread. The profiler's per-op recording on the sampled thread is
charged as the window's event count times a per-event cost measured once per process.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

__all__ = ["CpuMeter"]

#: wall seconds between two checkpoints
_STEP_S = 1.0
#: checkpoints kept: the interval is the last 9-10 seconds
_MARKS = 10


class CpuMeter:
    """Counts profkit's CPU seconds; reports their share of the process's CPU time.

    ``charge`` takes a C lock in a ``with`` statement; ``share`` takes none (a checkpoint is
    one ``deque.append``, atomic under the GIL), so both are safe on the request path.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.process_time,
    ) -> None:
        self._clock = clock
        self._cpu = cpu
        self._lock = threading.Lock()
        #: profkit's CPU seconds so far
        self.spent = 0.0
        #: (wall time, process CPU time, profkit CPU time) checkpoints, oldest first
        self._marks: collections.deque[tuple[float, float, float]] = collections.deque(
            [(clock(), cpu(), 0.0)], maxlen=_MARKS
        )

    def charge(self, seconds: float) -> None:
        """Add ``seconds`` of CPU time that profkit spent (on any thread)."""
        with self._lock:
            self.spent += seconds

    def share(self) -> float:
        """profkit's CPU time / the process's over the trailing interval (0.0 before any)."""
        now, cpu, spent = self._clock(), self._cpu(), self.spent
        marks = self._marks
        if now - marks[-1][0] >= _STEP_S:
            marks.append((now, cpu, spent))
        _, cpu0, spent0 = marks[0]
        used = cpu - cpu0
        return (spent - spent0) / used if used > 0 else 0.0
