"""Samplers: pure decisions over a counter, a trace id, an injected RNG or an injected clock.

Each sampler answers one question for one root call, ``decide(trace_id) -> bool``. They hold
no locks: the counter is an ``itertools.count`` (atomic under the GIL), the rate cap a small
token bucket whose rare races can only err towards fewer windows.
"""

from __future__ import annotations

import functools
import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import Protocol

from ._compat import peek_count

__all__ = [
    "MAX_PENDING",
    "EveryN",
    "RateLimiter",
    "Sampler",
    "TraceIdRatio",
    "Triggered",
    "trace_id_bound",
]

_TRACE_ID_LOW_64 = (1 << 64) - 1

#: the most triggers pending at once, for any label and per label together: a trigger
#: beyond it keeps the cap (50 requests of n=100 pushed overhead far past its budget)
MAX_PENDING = 1000


class Sampler(Protocol):
    """Decides whether one root call is profiled."""

    description: str

    def decide(self, trace_id: int | None) -> bool:
        """True to profile this root call; ``trace_id`` is the active OTel trace id or None."""
        ...


#: largest N whose decisions :class:`EveryN` precomputes (one pointer per call of the cycle)
_CYCLE_MAX = 4096


class EveryN:
    """Profile calls 0, N, 2N, ... of this sampler: exactly ``ceil(calls / N)`` samples.

    ``decide`` runs on every off-sample call. For N up to 4096 it is ``next()`` on a cycle of
    N precomputed answers, a C call with no Python frame (``next(it, default)`` ignores the
    trace id); a larger N counts in Python.
    """

    decide: Callable[[int | None], bool]

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"EveryN needs n >= 1, got {n}")
        self.n = n
        self.description = f"every:{n}"
        self._counter = itertools.count()
        if n <= _CYCLE_MAX:
            answers = itertools.cycle([True] + [False] * (n - 1))
            self.decide = functools.partial(next, answers)
        else:
            self.decide = self._decide_counted

    def _decide_counted(self, trace_id: int | None) -> bool:
        return next(self._counter) % self.n == 0


def trace_id_bound(rate: float) -> int:
    """The threshold on the low 64 bits of a trace id, as OTel's ``TraceIdRatioBased`` uses."""
    return round(rate * (1 << 64))


class TraceIdRatio:
    """Profile a fraction of calls; the same trace id gets the same answer in every process.

    With an active trace the decision is ``low64(trace_id) < rate * 2**64`` (OTel's
    ``TraceIdRatioBased`` rule), so a request sampled in one service is sampled in all the
    services it crosses. Without one, an injectable RNG decides.
    """

    def __init__(self, rate: float, rng: Callable[[], float] | None = None) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"TraceIdRatio needs 0 <= rate <= 1, got {rate}")
        self.rate = rate
        self.description = f"ratio:{rate:g}"
        self._bound = trace_id_bound(rate)
        self._rng = rng if rng is not None else random.Random().random

    def decide(self, trace_id: int | None) -> bool:
        if trace_id:
            return (trace_id & _TRACE_ID_LOW_64) < self._bound
        return self._rng() < self.rate


class RateLimiter:
    """Token bucket: at most ``per_minute`` windows a minute, bursting to the same amount."""

    def __init__(self, per_minute: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = max(1.0, per_minute)
        self.per_second = per_minute / 60.0
        self._clock = clock
        self._tokens = self.capacity
        self._last = clock()

    def allow(self) -> bool:
        """Take one token if there is one."""
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.per_second)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


class Triggered:
    """``trigger(n)``: the next n root calls are profiled whatever the sampler says.

    ``trigger(n, label="predict")``: the next n root calls of that label only.
    ``signalled()``: one more for any label, from a signal handler (``trigger_signal``).

    A Python signal handler runs on the main thread between two bytecodes of whatever runs
    there, possibly ``add()`` or ``take()`` holding ``_lock``: a handler that took the lock
    would wait for itself for ever. So ``signalled()`` takes no lock: ``next()`` on an
    ``itertools.count`` (one C call, atomic under the GIL and between bytecodes) and one
    attribute store. ``add()`` and ``take()`` fold what was signalled in under the lock.
    """

    def __init__(self) -> None:
        #: whether a trigger may be pending, read without the lock by the hot path before it
        #: calls ``take``: the triggers left (under the lock), or 1 stored by ``signalled()``
        self.pending = 0
        self._any = 0
        self._by_label: dict[str, int] = {}
        self._labelled = 0  # the sum of _by_label
        self._lock = threading.Lock()
        #: bumped by signal handlers only; every number it hands out is a signal, except the
        #: ones ``_drain`` itself takes (``_mark``: the first number not yet accounted for)
        self._signals = itertools.count()
        self._mark = 0

    def signalled(self) -> None:
        """One more trigger for any label; lock-free, for a signal handler."""
        next(self._signals)
        self.pending = 1  # after the count: see _settle

    def add(self, n: int, label: str | None = None) -> int:
        """``n`` more triggers, for root calls of ``label`` (None: of any label).

        At most :data:`MAX_PENDING` are pending in all: beyond it, fewer (or none) are added,
        without an error. Returns how many were added.

        Raises:
            ValueError: ``n`` is not an int >= 1, or ``label`` is not a str.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"profkit.trigger(n): n must be an int >= 1, got {n!r}")
        if label is not None and not isinstance(label, str):
            raise ValueError(f"profkit.trigger(label=): a label is a str, got {label!r}")
        with self._lock:
            self._settle()  # signals folded in (and capped) first: they count too
            n = min(n, MAX_PENDING - self._any - self._labelled)
            if n <= 0:
                return 0
            if label is None:
                self._any += n
            else:
                self._by_label[label] = self._by_label.get(label, 0) + n
                self._labelled += n
            self._settle()
            return n

    def applies(self, label: str) -> bool:
        """Whether a pending trigger may be for ``label`` (no lock; nothing taken)."""
        if not self.pending:  # the common case
            return False
        # only other labels' triggers: no (one for a typo'd label would otherwise make
        # every later root call take the lock)
        return bool(self._any or label in self._by_label) or (
            self._mark != peek_count(self._signals)
        )

    def take(self, label: str = "") -> bool:
        """Consume one pending trigger for a root call of ``label``; False when none applies."""
        if not self.applies(label):  # unlocked fast path
            return False
        with self._lock:
            self._any += self._drain()
            taken = True
            if self._any:
                self._any -= 1
            elif self._by_label.get(label):
                left = self._by_label[label] - 1
                if left:
                    self._by_label[label] = left
                else:
                    del self._by_label[label]
                self._labelled -= 1
            else:
                taken = False
            self._settle()
            return taken

    def _drain(self) -> int:
        """How many signals came since the last drain (under the lock)."""
        now = next(self._signals)  # a number of our own: not a signal
        signals = now - self._mark
        self._mark = now + 1
        return signals

    def _settle(self) -> None:
        """Store what is left in ``pending`` (under the lock).

        A handler may run between our store and the end of this method, or (on the main
        thread) in the middle of it; its ``pending = 1`` must not be overwritten unseen. Its
        count comes before its store, so draining once more after ours finds it: we loop,
        and a handler whose count comes after our last drain stores its 1 after our store.
        """
        while True:
            # signals fold into _any: cap them there (add() never passes the cap itself)
            self._any = max(0, min(self._any, MAX_PENDING - self._labelled))
            self.pending = self._any + self._labelled
            signals = self._drain()
            if not signals:
                return
            self._any += signals
