"""profkit's own CPU time, and its share of the process's CPU time over a trailing interval.

What is charged (each piece measured with ``time.thread_time`` on the thread that does it):

* on the request thread, starting a window, and stopping it and handing it off;
* on the export worker, everything it does for a window (reading, summarising, diagnosing,
  building the next profiler), and on each exporter's thread, that exporter's call.

The share is that CPU time over the process's (``time.process_time``: every thread) over the
last 9-10 seconds: checkpoints are taken at most once a second and the oldest of the last
ten is the interval's start. The decision of a root call left unprofiled is charged too,
sampled: one root call in 256 is timed, less its clock reads' own cost
(:func:`clock_cost_ns`), and charged 256 times the median of the last nine samples
(``profkit._capture.decide._timed``); it is *fixed* cost, counted toward the budget up to
half of it (:meth:`CpuMeter.budget_share`). What is not charged: the rest of a root call's
off-sample path (its frame, its context variable), nested regions, and the span processor's
own export thread.

A sampled call itself, while its window records (from the decision to its end: the
profiler's per-op recording, the root's ``record_function`` ranges, whatever the code does
more under a profiler), is charged what it cost on its own thread beyond what the same
label's calls cost unprofiled: its thread's CPU time less its label's *baseline*, the
trimmed mean CPU time of the label's last control calls (:class:`Baselines`; under
``sample_every`` the call right after a pick can be one, :data:`profkit._sampling.CONTROL`).
The difference is charged as it comes, less than nothing too (a call that ran below its
label's mean): on average it is what the profiler added. A call with no baseline to compare
with is charged the window's event count times a per-event cost measured once, at
``prime()``, on a quiet main thread: its label's first window, a ratio sampler's call
before a gate turned one away, a coroutine's or a generator's root, a window of more than
one call (``window`` > 1, ``warmup`` > 0), an ``all_threads`` window (other threads' ops
are recorded too), a call that ended on another thread.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
import time
from collections.abc import Callable

__all__ = ["MAX_BASELINES", "Baselines", "Control", "CpuMeter", "clock_cost_ns"]

#: wall seconds between two checkpoints
_STEP_S = 1.0
#: checkpoints kept: the interval is the last 9-10 seconds
_MARKS = 10
#: a label's control calls kept: its baseline is their median
_CONTROLS = 9
#: labels with a baseline at once; a new one past them pushes out the one noted longest ago
MAX_BASELINES = 256


@functools.cache
def clock_cost_ns() -> int:
    """What two back-to-back ``time.thread_time_ns()`` reads measure (a system call each on
    Linux, ~0.7-0.9 µs): subtracted from a timed decision, which it would inflate 256 times
    over. The median of 31 pairs, measured once per process."""
    read = time.thread_time_ns
    pairs = []
    for _ in range(31):
        t0 = read()
        pairs.append(read() - t0)
    return sorted(pairs)[15]


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
        self._lock = threading.RLock()  # re-entrant: a signal handler's call may charge too
        #: profkit's CPU seconds so far, and those of them spent on decisions (``fixed``)
        self.spent = self.fixed = 0.0
        #: (wall time, process CPU time, profkit's, its decisions') checkpoints, oldest first
        self._marks: collections.deque[tuple[float, float, float, float]] = collections.deque(
            [(clock(), cpu(), 0.0, 0.0)], maxlen=_MARKS
        )

    def charge(self, seconds: float) -> None:
        """Add ``seconds`` of CPU time that profkit spent (on any thread)."""
        with self._lock:
            self.spent += seconds

    def charge_fixed(self, seconds: float) -> None:
        """Add ``seconds`` spent deciding about calls left unprofiled: a cost that refusing
        picks cannot lower (see :meth:`budget_share`)."""
        with self._lock:
            self.spent += seconds
            self.fixed += seconds

    def share(self) -> float:
        """profkit's CPU time / the process's over the trailing interval (0.0 before any)."""
        return self._shares()[0]

    def budget_share(self, budget: float) -> float:
        """The share that the budget compares with ``budget``: the windows' share, plus the
        decisions' own share up to half the budget. Refusing picks lowers only the first; if
        the decisions alone (calls of a few µs each) were over the budget, refusing every pick
        would not bring the share under it, and profiling would be off for good."""
        total, fixed = self._shares()
        return total - fixed + min(fixed, budget / 2)

    def _shares(self) -> tuple[float, float]:
        """(profkit's share, its decisions' share) over the trailing interval."""
        now, cpu, spent, fixed = self._clock(), self._cpu(), self.spent, self.fixed
        marks = self._marks
        if now - marks[-1][0] >= _STEP_S:
            marks.append((now, cpu, spent, fixed))
        _, cpu0, spent0, fixed0 = marks[0]
        used = cpu - cpu0
        if used <= 0:
            return 0.0, 0.0
        # never below nothing: a sampled call is charged its CPU time less its label's
        # baseline, less than nothing when it ran below it (on average what the profiler
        # added), and an interval with a few such calls and little else read -6%
        return max(0.0, spent - spent0) / used, max(0.0, fixed - fixed0) / used


class Baselines:
    """Each label's unprofiled CPU time per root call on its own thread (ns): the trimmed
    mean of its last ``_CONTROLS`` control calls. Bounded: past ``MAX_BASELINES`` labels, the label
    noted longest ago goes (labels built from user input cannot grow it, nor lock it).

    No lock (a lock held by another thread at ``fork()`` would be held for ever in the
    child): each step is one C call, atomic under the GIL, and a race between two notes
    of one label can only lose one of them.
    """

    def __init__(self) -> None:
        self._by_label: dict[str, collections.deque[int]] = {}

    def note(self, label: str, cpu_ns: int) -> None:
        """A control call of ``label`` took ``cpu_ns`` of its thread's CPU time."""
        by_label = self._by_label
        kept = by_label.pop(label, None)  # re-inserted last: the order is the last note's
        if kept is None:
            if len(by_label) >= MAX_BASELINES:
                with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                    del by_label[next(iter(by_label))]  # (raced by another thread's note)
            kept = collections.deque(maxlen=_CONTROLS)
        kept.append(cpu_ns)
        by_label[label] = kept

    def get(self, label: str) -> int | None:
        """``label``'s baseline in ns, or None before its first control call: the mean of
        its kept control calls, the least and the greatest left out from five on (a mean,
        not a median: a sampled call is charged its CPU time less this, and for a label
        whose calls vary that difference is the profiler's cost on average only if this is
        the calls' mean)."""
        kept = self._by_label.get(label)
        values = sorted(kept) if kept else None  # (a copy in C: atomic under the GIL)
        if not values:
            return None
        if len(values) >= 5:
            values = values[1:-1]
        return sum(values) // len(values)

    def count(self, label: str) -> int:
        """How many control calls of ``label`` are kept (0 to ``_CONTROLS``)."""
        kept = self._by_label.get(label)
        return len(kept) if kept else 0


class Control:
    """An unprofiled root call timed on its thread's CPU clock, for its label's baseline
    (and on the wall clock for ``timed``, the sink of every unprofiled call that is timed:
    the latency book, the metrics; None when neither is on)."""

    __slots__ = ("baselines", "cpu0", "done", "key", "label", "t0", "thread", "timed")

    def __init__(
        self,
        baselines: Baselines,
        timed: Callable[[tuple[str, int]], None] | None,
        label: str,
        key: str,
    ) -> None:
        """``label`` as the scope was given it (``timed``'s key), ``key`` as its summary
        names it (the baseline's: what a sampled call's root scope records)."""
        self.baselines, self.timed, self.label, self.key = baselines, timed, label, key
        self.done = False
        self.thread = threading.get_ident()
        self.t0 = time.perf_counter_ns()
        self.cpu0 = time.thread_time_ns()

    def end(self) -> None:
        """The call returned (or raised): note its CPU time (on the thread that began it), once."""
        if self.done:
            return
        self.done = True
        cpu = time.thread_time_ns() - self.cpu0
        if threading.get_ident() == self.thread:
            self.baselines.note(self.key, cpu)
        if self.timed is not None:
            self.timed((self.label, time.perf_counter_ns() - self.t0))

    def close_scopes(self) -> None:
        """Nothing to close (the scope protocol of an interrupted root call)."""
        return None
