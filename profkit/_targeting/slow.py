"""Slow-call capture (``capture_slow``): time root calls per label, profile some speculatively.

Pure bookkeeping, no torch. :class:`LatencyBook` keeps the durations of each label's recent
unprofiled root calls (a ring of the last 256, per label, for the 256 labels seen most
recently) and says what "slow" means for a label, in unprofiled time: ``slow_ms`` when
given, else the label's recent p95, kept between 2x and 4x its recent median. The clamp is
what makes the rule work on real traffic: when the slow calls are more than 5% of a label's
calls the p95 is one of them (4x the median still catches them), and when they are fewer
the p95 is the top of the fast calls (2x the median keeps a fast call out). A speculative
call is brought to the unprofiled scale before it is compared: what the profiler added to
it (the label's measured cost of a speculative window: start, stop, recording) is taken
off, not divided out. :class:`Speculation` decides when a speculative window may open:
never before the label has a baseline, and only after some unprofiled calls since the last
one (about one call in twelve, so the book keeps learning from calls the profiler did not
slow down), within its own rate cap and the overhead budget.

While this is on, the decision for an unprofiled root call is ``(TIMED, start)`` with its
``perf_counter_ns()`` start; the scope hands it back with the label when the call ends
(:class:`Timed` holds both for scopes entered through ``enter``).
"""

from __future__ import annotations

import collections
import os
import random
import threading
import time
from collections.abc import Callable

from .._text import escape

try:
    import resource

    _RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)
except ImportError:  # (Windows)
    _RUSAGE_THREAD = None

__all__ = ["LatencyBook", "Speculation", "Timed", "sched_ns"]

_RING = 256
#: labels the book keeps; the one seen least recently is forgotten for a new one
MAX_LABELS = 256
#: unprofiled durations a label needs before its calls are judged
_MIN_SAMPLES = 8
#: new durations after which a label's quantiles are computed again
_REFRESH = 16
#: a label with at most this many durations has its quantiles computed again at each new
#: one: a service's first calls after its cold ones are often slow for a moment (a FastAPI
#: route's next 9 took 13-28 ms, then 0.2-0.4 ms), and a threshold computed while they were
#: most of the book must not outlive them (computed again only at the 32nd call, it did for
#: ~300 calls, 1 in 12 of them unprofiled: every slow call released unseen). Sorting at most
#: 64 durations: about 2 µs, for a label's first 64 unprofiled calls
_YOUNG = 64
_LOW, _HIGH = 2.0, 4.0
#: a call less than this over its label's median is never slow by the p95 rule: a
#: scheduler's time slice (a busy machine holds up a fast call for about that long)
_JITTER_NS = 1_000_000
#: speculative calls known before what the profiler adds is taken as known
_RECENT = 8
#: the latest unprofiled calls whose median also bounds the threshold from below (not
#: fewer: on an event loop the calls that end after a crowded window are its slow ones)
_LATEST = 16
#: speculative durations kept per label (what the profiler adds is their median's excess)
_PROFILED = 64
#: most root calls a speculative window records (fewer when its stops get expensive)
MAX_CALLS = 16
#: unprofiled root calls before speculation is asked again, after it could not open
_RETRY = 16
#: share of root calls that run unprofiled between speculative windows (the baseline's)
_UNPROFILED = 1 / 12
#: a speculative window's stop (on the request thread) above this halves the next one's calls
_STOP_HIGH_S, _STOP_LOW_S = 0.002, 0.0005


#: whether this system has per-thread scheduler statistics (Linux's schedstat); None: not
#: asked yet
_schedstat: list[bool] = []


def sched_ns(tid: int) -> tuple[int, int, int]:
    """Thread ``tid`` (its native id), ever: nanoseconds runnable but waiting for a CPU
    (Linux ``/proc/self/task/<tid>/schedstat``), and, when ``tid`` is the calling thread,
    its CPU time (``thread_time_ns``: the kernel's counter in that file lags by up to a
    tick for a running thread) and how often it gave up its CPU itself: slept, waited for a
    lock or for I/O (``getrusage(RUSAGE_THREAD)``); -1 each for another thread or where
    unknown. Returned as ``(cpu, waited, slept)``, ``(-1, 0, -1)`` where there is none.

    A speculative call's duration is judged without what the machine did to it: a
    profiler's start wakes its threads, and on a busy machine (or a virtual one, whose host
    takes the CPU away) the call's thread then stays off its CPU for a scheduler tick (4 ms),
    which its profile cannot explain."""
    if _schedstat and not _schedstat[0]:
        return (-1, 0, -1)
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
            wait = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        if not _schedstat:
            _schedstat.append(os.path.exists("/proc/self/schedstat"))
        return (-1, 0, -1)
    if not _schedstat:
        _schedstat.append(True)
    if tid != threading.get_native_id():
        return (-1, wait, -1)
    slept = resource.getrusage(_RUSAGE_THREAD).ru_nvcsw if _RUSAGE_THREAD is not None else -1
    return (time.thread_time_ns(), wait, slept)


class _Label:
    __slots__ = ("fresh", "kept", "limit", "missed", "n", "p50", "p95", "profiled", "ring")

    def __init__(self) -> None:
        self.ring: list[int] = []
        self.n = 0  # durations noted, ever
        self.fresh = 0  # noted since the quantiles were computed
        self.p50 = self.p95 = 0
        #: the slow threshold (unprofiled ns) as of the last refresh (0: none yet)
        self.limit = 0
        #: the latest speculative (profiled) durations, newest last
        self.profiled: list[int] = []
        #: slow calls timed unprofiled (missed), and kept under the profiler
        self.missed = self.kept = 0

    def last(self, k: int) -> int:
        """The median of the latest ``k`` unprofiled durations."""
        size = len(self.ring)
        return _median([self.ring[(self.n - i) % size] for i in range(1, min(k, size) + 1)])


def _median(values: list[int]) -> int:
    return sorted(values)[len(values) // 2]


def _stale(entry: _Label) -> bool:
    """Whether ``entry``'s quantiles are to be computed again: after :data:`_REFRESH` new
    durations, or as many as it had before, or any while it is young (:data:`_YOUNG`)."""
    fresh = entry.fresh
    return fresh >= _REFRESH or 2 * fresh >= entry.n or (fresh > 0 and entry.n <= _YOUNG)


class LatencyBook:
    """Recent unprofiled durations per label, and the slow threshold they give.

    A label is its escaped text (:func:`profkit._text.escape`), whoever asks: the scope's
    raw label and a call's recorded one are the same key. At most :data:`MAX_LABELS`
    labels are kept; a new one past them forgets the label seen least recently.
    """

    def __init__(self, slow_ms: float | None) -> None:
        self.slow_ns = int(slow_ms * 1e6) if slow_ms is not None else None
        self._labels: collections.OrderedDict[str, _Label] = collections.OrderedDict()

    def note_since(self, label: str, t0: int) -> None:
        """An unprofiled root call of ``label`` began at ``t0`` (``perf_counter_ns``)."""
        self.note(label, time.perf_counter_ns() - t0)

    def note(self, label: str, ns: int) -> int:
        """An unprofiled root call of ``label`` took ``ns`` (lock-free: races lose a sample).

        Returns the label's slow threshold (ns) when the call was over it, else 0."""
        label = escape(label)
        labels = self._labels
        entry = labels.get(label)
        if entry is None:
            entry = labels.setdefault(label, _Label())
            while len(labels) > MAX_LABELS:
                try:
                    labels.popitem(last=False)
                except KeyError:  # another thread emptied it meanwhile
                    break
        else:
            try:
                labels.move_to_end(label)
            except KeyError:  # forgotten by another thread meanwhile: this sample is lost
                return 0
        if len(entry.ring) < _RING:
            entry.ring.append(ns)
        else:
            entry.ring[entry.n % _RING] = ns
        entry.n += 1
        entry.fresh += 1
        if _stale(entry):
            self._quantiles(label)
        limit = entry.limit
        if limit and ns > limit:
            entry.missed += 1  # a slow call that ran unprofiled
            return limit
        return 0

    def ready(self, label: str) -> bool:
        """Whether speculative windows may record ``label``'s calls: once its unprofiled
        baseline is known (``slow_ms`` too: what the profiler adds is measured against it)."""
        entry = self._labels.get(escape(label))
        return entry is not None and entry.n >= _MIN_SAMPLES

    def _quantiles(self, label: str) -> _Label | None:
        entry = self._labels.get(label)
        if entry is None or not entry.ring:
            return None
        if _stale(entry) or not entry.p50:
            ring = sorted(entry.ring)
            entry.p50 = ring[len(ring) // 2]
            entry.p95 = ring[min(len(ring) - 1, (len(ring) * 95) // 100)]
            entry.fresh = 0
            if entry.n >= _MIN_SAMPLES:
                entry.limit = self._limit(entry)
        return entry

    def _limit(self, entry: _Label) -> int:
        """The label's slow threshold in unprofiled ns: ``slow_ms``, else its recent p95 kept
        between 2x and 4x its median, at least twice the median of its latest calls, and at
        least 1 ms over its median."""
        if self.slow_ns is not None:
            return self.slow_ns
        base = min(max(entry.p95, _LOW * entry.p50), _HIGH * entry.p50)
        return int(max(base, _LOW * entry.last(_LATEST), entry.p50 + _JITTER_NS))

    def p50_ms(self, label: str) -> float | None:
        """The label's recent unprofiled median, in ms (None: no calls noted yet)."""
        entry = self._quantiles(escape(label))
        return entry.p50 / 1e6 if entry is not None else None

    def overhead_ns(self, label: str) -> int | None:
        """What a speculative window adds to one call of ``label``, measured: the median
        speculative call less the median unprofiled one (a median: up to half of a label's
        calls may be slow); None until 8 are known."""
        entry = self._labels.get(escape(label))
        if entry is None or len(entry.profiled) < _RECENT or not entry.p50:
            return None
        return max(0, _median(entry.profiled) - entry.p50)

    def inflation_ns(self, label: str) -> int:
        """:meth:`overhead_ns`, 0 while unknown (the CPU a released call's recording cost)."""
        return self.overhead_ns(label) or 0

    def judge(self, label: str, ns: int) -> int | None:
        """A speculative call of ``label`` took ``ns`` under the profiler: the threshold
        (unprofiled ns) it beat when slow, else None.

        What the profiler added to this call is taken off first: the label's measured cost
        of a speculative window (:meth:`overhead_ns`: the window's start and stop, which a
        lone call pays in full, and its recording per op). Until that is known (8
        speculative calls), no call is kept: a profiled call is not compared with unprofiled
        ones before it can be brought to their scale. The rest is compared with ``slow_ms``
        as given, else with the label's threshold (:meth:`_limit`) and twice the median of
        its latest 64 speculative calls (on the same scale): when the whole process slows
        down (a burst of load, a garbage collection) every call slows down, and a call only
        as slow as its neighbours is not kept. (Not the latest 8: on an event loop the slow
        calls of a crowded window end last, one after another, and each would raise the bar
        for the next.)
        """
        label = escape(label)
        entry = self._labels.get(label)
        if entry is None:  # (slow_ms: judged before any call of the label was timed)
            entry = self._labels.setdefault(label, _Label())
        self._quantiles(label)
        added = self.overhead_ns(label)
        profiled = entry.profiled
        neighbours = _median(profiled) if len(profiled) >= _RECENT else 0
        profiled.append(ns)
        if len(profiled) > _PROFILED:
            del profiled[0]
        if added is None or entry.n < _MIN_SAMPLES:
            return None
        limit = entry.limit or self._limit(entry)
        if self.slow_ns is None:
            limit = max(limit, int(_LOW * max(0, neighbours - added)))
        if ns - added > limit:
            entry.kept += 1
            return limit
        return None

    def not_kept(self, label: str) -> None:
        """A call :meth:`judge` found slow was released after all (the rate cap had no
        token for its window): counted as seen, not kept."""
        entry = self._labels.get(escape(label))
        if entry is not None and entry.kept:
            entry.kept -= 1
            entry.missed += 1

    def slow_calls(self) -> dict[str, dict[str, int]]:
        """Per label: slow calls seen (timed unprofiled over the threshold, plus kept) and
        kept under the profiler, so that ``kept / seen`` reads as recall."""
        out: dict[str, dict[str, int]] = {}
        for label, entry in list(self._labels.items()):
            if entry.missed or entry.kept:
                out[label] = {"seen": entry.missed + entry.kept, "kept": entry.kept}
        return out


class Speculation:
    """When a speculative window may open, and how many calls it may take."""

    def __init__(self, book: LatencyBook) -> None:
        self.book = book
        self._rng = random.Random(0x5EC)
        #: calls the next speculative window may record (adapted to what stopping costs)
        self.calls = MAX_CALLS
        #: unprofiled root calls to let through before the next try (read on every one)
        self.rest = 0

    def want(self, label: str, refused: Callable[[], str | None]) -> bool:
        """For an unprofiled root call whose ``rest`` is over: open a speculative window?
        Not before the label has a baseline (the next call asks again: another label's may
        be ready), nor while ``refused()`` names a reason (the queue is full, profkit is
        over its budget: asked again after some calls)."""
        if not self.book.ready(label):
            return False
        if refused() is not None:
            self.rest = _RETRY
            return False
        return True

    def refused(self) -> None:
        """The window could not open (no slot, no token, someone else's profiler)."""
        self.rest = _RETRY

    def closed(self, calls: int, stop_s: float) -> None:
        """A speculative window of ``calls`` calls stopped in ``stop_s`` s (request thread)."""
        # unprofiled calls in between keep the book learning: about one call in 12 runs
        # unprofiled, drawn at random so that a pattern in the traffic (every 10th call slow)
        # never falls into the rests alone
        share = calls * _UNPROFILED / (1.0 - _UNPROFILED)
        whole = int(share)
        self.rest = whole + (self._rng.random() < share - whole)
        if stop_s > _STOP_HIGH_S:
            self.calls = max(2, self.calls // 2)  # (the first call carries the start)
        elif stop_s < _STOP_LOW_S:
            self.calls = min(MAX_CALLS, self.calls * 2)


class Timed:
    """A timed unprofiled root call entered through :func:`profkit._label.scope.enter`."""

    __slots__ = ("done", "label", "t0", "timed")

    def __init__(self, timed: Callable[[tuple[str, int]], None], label: str, t0: int) -> None:
        self.timed = timed
        self.label = label
        self.done = False
        self.t0 = t0

    def end(self) -> None:
        """The call returned (or raised): note ``(label, ns)``, once."""
        if not self.done:
            self.done = True
            self.timed((self.label, time.perf_counter_ns() - self.t0))

    def close_scopes(self) -> None:
        """Nothing to close (the scope protocol of an interrupted root call)."""
        return None
