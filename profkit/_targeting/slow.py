"""Slow-call capture (``capture_slow``): time root calls per label, profile some speculatively.

Pure bookkeeping, no torch. :class:`LatencyBook` keeps the durations of each label's recent
unprofiled root calls (a ring of the last 256, per label, for at most 256 labels) and says
what "slow" means for a label: ``slow_ms`` when given, else the label's recent p95, kept
between 2x and 4x its recent median. The clamp is what makes the rule work on real
traffic: when the slow calls are more than 5% of a label's calls the p95 is one of them (4x
the median still catches them), and when they are fewer the p95 is the top of the fast calls,
which the profiler's own per-op recording pushes a profiled fast call past (2x the median
does not). :class:`Speculation` decides when a speculative window may open: never before the
label has a baseline, and only after some unprofiled calls since the last one (so the book
keeps learning from calls the profiler did not slow down), within its own rate cap and the
overhead budget.

While this is on, the decision for an unprofiled root call is ``(TIMED, start)`` with its
``perf_counter_ns()`` start; the scope hands it back with the label when the call ends
(:class:`Timed` holds both for scopes entered through ``enter``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

__all__ = ["LatencyBook", "Speculation", "Timed"]

_RING = 256
_MAX_LABELS = 256
#: unprofiled durations a label needs before its calls are judged
_MIN_SAMPLES = 8
#: new durations after which a label's quantiles are computed again
_REFRESH = 16
_LOW, _HIGH = 2.0, 4.0
#: the latest calls whose median also bounds the threshold from below
_RECENT = 8
#: speculative durations kept per label (the profiler's inflation is their median's)
_PROFILED = 64
#: most root calls a speculative window records (fewer when its stops get expensive)
MAX_CALLS = 16
#: unprofiled root calls before speculation is asked again, after it could not open
_RETRY = 16
#: multiples of the rest between speculative windows, in turn
_RESTS = (1, 0, 2)
#: a speculative window's stop (on the request thread) above this halves the next one's calls
_STOP_HIGH_S, _STOP_LOW_S = 0.002, 0.0005


class _Label:
    __slots__ = ("fresh", "n", "p50", "p95", "profiled", "ring")

    def __init__(self) -> None:
        self.ring: list[int] = []
        self.n = 0  # durations noted, ever
        self.fresh = 0  # noted since the quantiles were computed
        self.p50 = self.p95 = 0
        #: the latest speculative (profiled) durations, newest last
        self.profiled: list[int] = []

    def last(self, k: int) -> int:
        """The median of the latest ``k`` unprofiled durations."""
        size = len(self.ring)
        return _median([self.ring[(self.n - i) % size] for i in range(1, min(k, size) + 1)])


def _median(values: list[int]) -> int:
    return sorted(values)[len(values) // 2]


class LatencyBook:
    """Recent unprofiled durations per label, and the slow threshold they give."""

    def __init__(self, slow_ms: float | None) -> None:
        self.slow_ns = int(slow_ms * 1e6) if slow_ms is not None else None
        self._labels: dict[str, _Label] = {}

    def note_since(self, label: str, t0: int) -> None:
        """An unprofiled root call of ``label`` began at ``t0`` (``perf_counter_ns``)."""
        self.note(label, time.perf_counter_ns() - t0)

    def note(self, label: str, ns: int) -> None:
        """An unprofiled root call of ``label`` took ``ns`` (lock-free: races lose a sample)."""
        entry = self._labels.get(label)
        if entry is None:
            if len(self._labels) >= _MAX_LABELS:
                return
            entry = self._labels.setdefault(label, _Label())
        if len(entry.ring) < _RING:
            entry.ring.append(ns)
        else:
            entry.ring[entry.n % _RING] = ns
        entry.n += 1
        entry.fresh += 1

    def ready(self, label: str) -> bool:
        """Whether calls of ``label`` can be judged yet."""
        if self.slow_ns is not None:
            return True
        entry = self._labels.get(label)
        return entry is not None and entry.n >= _MIN_SAMPLES

    def _quantiles(self, label: str) -> _Label | None:
        entry = self._labels.get(label)
        if entry is None or not entry.ring:
            return None
        if entry.fresh >= _REFRESH or not entry.p50:
            ring = sorted(entry.ring)
            entry.p50 = ring[len(ring) // 2]
            entry.p95 = ring[min(len(ring) - 1, (len(ring) * 95) // 100)]
            entry.fresh = 0
        return entry

    def p50_ms(self, label: str) -> float | None:
        """The label's recent unprofiled median, in ms (None: no calls noted yet)."""
        entry = self._quantiles(label)
        return entry.p50 / 1e6 if entry is not None else None

    def inflation_ns(self, label: str) -> int:
        """What the profiler adds to one call of ``label``: the median speculative (profiled)
        call less the median unprofiled one (0 until 8 speculative calls are known)."""
        entry = self._labels.get(label)
        if entry is None or len(entry.profiled) < _RECENT or not entry.p50:
            return 0
        return max(0, _median(entry.profiled) - entry.p50)

    def judge(self, label: str, ns: int) -> int | None:
        """A speculative call of ``label`` took ``ns`` under the profiler: the threshold (ns,
        on the profiled scale) it beat when it is slow, else None.

        With ``slow_ms`` that is the threshold. Otherwise it is the label's recent p95 of
        unprofiled calls, kept between 2x and 4x their median, then

        * times the profiler's own inflation of this label's calls (the median profiled
          speculative call over the median unprofiled one, at least 1): a profiled call is
          compared with what it would have taken unprofiled;
        * and at least twice the median of the label's latest speculative calls and of its
          latest unprofiled ones (inflated likewise): when the whole process slows down (a
          burst of load, another process on its cores, a garbage collection) every call
          slows down, and a call only as slow as its neighbours is not kept.
        """
        if self.slow_ns is not None:
            return self.slow_ns if ns > self.slow_ns else None
        entry = self._quantiles(label)
        if entry is None or entry.n < _MIN_SAMPLES:
            return None
        profiled = entry.profiled
        neighbours = _median(profiled[-_RECENT:]) if len(profiled) >= _RECENT else 0
        median = _median(profiled) if len(profiled) >= _RECENT else 0
        inflation = max(1.0, median / max(1, entry.p50))
        profiled.append(ns)
        if len(profiled) > _PROFILED:
            del profiled[0]
        base = min(max(entry.p95, _LOW * entry.p50), _HIGH * entry.p50)
        limit = int(max(base, _LOW * entry.last(_RECENT)) * inflation)
        limit = max(limit, int(_LOW * neighbours))
        return limit if ns > limit else None


class Speculation:
    """When a speculative window may open, and how many calls it may take."""

    def __init__(self, book: LatencyBook) -> None:
        self.book = book
        self._rests = itertools.cycle(_RESTS)
        #: calls the next speculative window may record (adapted to what stopping costs)
        self.calls = MAX_CALLS
        #: unprofiled root calls to let through before the next try (read on every one)
        self.rest = 0

    def want(self, label: str, allowed: bool) -> bool:
        """For an unprofiled root call whose ``rest`` is over: open a speculative window?
        (``allowed``: the queue has room and profkit is within its budget.)"""
        if not self.book.ready(label) or not allowed:
            self.rest = _RETRY
            return False
        return True

    def refused(self) -> None:
        """The window could not open (no slot, no token, someone else's profiler)."""
        self.rest = _RETRY

    def closed(self, calls: int, stop_s: float) -> None:
        """A speculative window of ``calls`` calls stopped in ``stop_s`` s (request thread)."""
        # unprofiled calls in between keep the book learning: a quarter of the window on
        # average, varied so that a pattern in the traffic (every 10th call slow) never falls
        # into the rests alone (a window may hold one call: rests of 1 would be a period of 2)
        self.rest = max(1, calls // 4) * next(self._rests)
        if stop_s > _STOP_HIGH_S:
            self.calls = max(2, self.calls // 2)  # the first call is never judged
        elif stop_s < _STOP_LOW_S:
            self.calls = min(MAX_CALLS, self.calls * 2)


class Timed:
    """A timed unprofiled root call entered through :func:`profkit._label.scope.enter`."""

    __slots__ = ("done", "label", "t0", "timed")

    def __init__(self, timed: Callable[[str, int], None], label: str, t0: int) -> None:
        self.timed = timed
        self.label = label
        self.done = False
        self.t0 = t0

    def end(self) -> None:
        """The call returned (or raised): note its duration, once."""
        if not self.done:
            self.done = True
            self.timed(self.label, self.t0)

    def close_scopes(self) -> None:
        """Nothing to close (the scope protocol of an interrupted root call)."""
        return None
