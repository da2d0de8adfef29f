"""Samplers: pure decisions over a counter, a trace id, an injected RNG or an injected clock.

A sampler answers for each label's root calls in turn (``picks()``: one iterator per label,
see :class:`LabelPicks`) and, under a ratio, from the trace id (``decide(trace_id)``). They
hold no locks: a label's answers are C iterators (``next()`` is atomic under the GIL), the
rate cap a small token bucket whose rare races can only err towards fewer windows.
"""

from __future__ import annotations

import itertools
import operator
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeAlias

from ._compat import peek_count
from ._weak import at_fork_in_child_weakly

__all__ = [
    "ASK",
    "COLD",
    "CONTROL",
    "MAX_LABELS",
    "MAX_PENDING",
    "EveryN",
    "LabelPicks",
    "RateLimiter",
    "Sampler",
    "TraceIdRatio",
    "Triggered",
    "check_trigger",
    "trace_id_bound",
]

_TRACE_ID_LOW_64 = (1 << 64) - 1

#: the most triggers pending at once, for any label and per label together: a trigger
#: beyond it keeps the cap (50 requests of n=100 pushed overhead far past its budget)
MAX_PENDING = 1000


class Sampler(Protocol):
    """Decides whether one root call is profiled: per label (``picks``), then, for a
    label's :data:`ASK`, from the trace id (``decide``)."""

    description: str
    cold: int

    def picks(self) -> Picks:
        """A new label's answers, one per root call (see :class:`LabelPicks`)."""
        ...

    def decide(self, trace_id: int | None) -> bool:
        """True to profile this root call; ``trace_id`` is the active OTel trace id or None."""
        ...


#: labels whose root calls each sampler counts apart (and keeps cold apart); a label first
#: seen past them shares one counter with the others past them (``sampler_shared_calls``)
MAX_LABELS = 1024
#: largest N whose answers :class:`EveryN` keeps in a cycle (one pointer per call, per label)
_CYCLE_MAX = 256


class _Mark:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<profkit {self.name}>"


#: a label's answer for one of its first ``cold_calls`` root calls: never the sampler's pick
COLD: Any = _Mark("cold")
#: a label's answer once warm under a ratio: the trace id (or the RNG) decides
ASK: Any = _Mark("ask")
#: the answer right after each of a label's picks under ``sample_every``: not profiled, but
#: timed on its thread's CPU clock, the label's unprofiled cost that the sampled call's own
#: CPU time is charged against (:class:`profkit._overhead.Baselines`)
CONTROL: Any = _Mark("control")

Picks: TypeAlias = Iterator[Any]


class LabelPicks:
    """Each label's answers for its next root calls: ``True`` (the sampler picks it),
    ``False``, :data:`COLD` or :data:`ASK`, one iterator per label.

    The hot path is ``next(picks.by_label.get(label) or picks.first(label))``: one dict
    lookup and one ``next()`` (C calls, no Python frame) once a label is known. At most
    ``max_labels`` labels get their own iterator; a label first seen past them shares one
    (it costs ``first()``'s frame on each of its calls, counted in ``shared_calls``), so
    labels built from user input (ids in a path) cannot grow the table without bound.
    """

    def __init__(self, make: Callable[[], Picks], max_labels: int = MAX_LABELS) -> None:
        self.by_label: dict[str, Picks] = {}
        self._make = make
        self._max = max_labels
        self._shared = make()
        #: root calls of labels past ``max_labels``, lock-free
        self.shared_calls = itertools.count()

    def first(self, label: str) -> Picks:
        """The iterator of a label not in ``by_label``: its own, or past the cap the shared one."""
        by_label = self.by_label
        if len(by_label) >= self._max:
            next(self.shared_calls)
            return self._shared
        return by_label.setdefault(label, self._make())


#: :class:`EveryN`'s answers past ``_CYCLE_MAX``, by ``i % N`` (any other: ``False``)
_EVERY_N_ANSWERS: dict[int, Any] = {0: True, 1: CONTROL}


class EveryN:
    """Profile calls K, K+N, K+2N, ... of each label (K: ``cold``): exactly
    ``ceil((calls - K) / N)`` samples of a label's ``calls`` root calls.

    Counting per label keeps periodic traffic from aliasing with N (two labels in strict
    alternation at N=10 would otherwise give one label every sample and the other none).
    A label's iterator yields :data:`COLD` ``cold`` times, then ``True`` once in N, the
    answer after it :data:`CONTROL` (a ``False`` all the same: not profiled, but timed as the
    label's baseline): a cycle of N answers for N up to 256, else a lookup of ``i % N``
    over a count (both C iterators). ``cold`` is ignored at N=1 (profile every call: no
    unprofiled call to compare with).
    """

    def __init__(self, n: int, cold: int = 0) -> None:
        if n < 1:
            raise ValueError(f"EveryN needs n >= 1, got {n}")
        self.n = n
        self.cold = cold if n > 1 else 0
        self.description = f"every:{n}"

    def picks(self) -> Picks:
        """A new label's answers, one per root call."""
        n = self.n
        if n == 1:
            warm: Picks = itertools.repeat(True)
        elif n <= _CYCLE_MAX:
            warm = itertools.cycle([True, CONTROL] + [False] * (n - 2))
        else:  # answers.get(i % n, False), in C
            counts = map(operator.mod, itertools.count(), itertools.repeat(n))
            warm = map(_EVERY_N_ANSWERS.get, counts, itertools.repeat(False))
        return itertools.chain(itertools.repeat(COLD, self.cold), warm) if self.cold else warm

    def decide(self, trace_id: int | None) -> bool:
        """Unused by :class:`EveryN` (its answers are in :meth:`picks`): never picks."""
        return False


def trace_id_bound(rate: float) -> int:
    """The threshold on the low 64 bits of a trace id, as OTel's ``TraceIdRatioBased`` uses."""
    return round(rate * (1 << 64))


class TraceIdRatio:
    """Profile a fraction of calls; the same trace id gets the same answer in every process.

    With an active trace the decision is ``low64(trace_id) < rate * 2**64`` (OTel's
    ``TraceIdRatioBased`` rule), so a request sampled in one service is sampled in all the
    services it crosses. Without one, an injectable RNG decides.
    """

    def __init__(self, rate: float, rng: Callable[[], float] | None = None, cold: int = 0) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"TraceIdRatio needs 0 <= rate <= 1, got {rate}")
        self.rate = rate
        self.cold = cold if rate < 1.0 else 0
        self.description = f"ratio:{rate:g}"
        self._bound = trace_id_bound(rate)
        self._rng = rng if rng is not None else random.Random().random

    def picks(self) -> Picks:
        """A new label's answers: :data:`COLD` for its first ``cold`` calls, then :data:`ASK`
        (``decide`` then answers from the trace id)."""
        return itertools.chain(itertools.repeat(COLD, self.cold), itertools.repeat(ASK))

    def decide(self, trace_id: int | None) -> bool:
        if trace_id:
            return (trace_id & _TRACE_ID_LOW_64) < self._bound
        return self._rng() < self.rate


class RateLimiter:
    """Token bucket: at most ``per_minute`` windows a minute, bursting to the same amount.

    Per process: a forked child starts with a full one (it has opened no window yet)."""

    def __init__(self, per_minute: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = max(1.0, per_minute)
        self.per_second = per_minute / 60.0
        self._clock = clock
        self.refill()
        at_fork_in_child_weakly(self, "refill")

    def refill(self) -> None:
        """A full bucket."""
        self._tokens = self.capacity
        self._last = self._clock()

    def allow(self) -> bool:
        """Take one token if there is one."""
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.per_second)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def check_trigger(n: object, label: object) -> None:
    """``profkit.trigger``'s arguments, checked with a session or without one.

    Raises:
        ValueError: ``n`` is not an int >= 1, or ``label`` is not a str.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"profkit.trigger(n): n must be an int >= 1, got {n!r}")
    if label is not None and not isinstance(label, str):
        raise ValueError(f"profkit.trigger(label=): a label is a str, got {label!r}")


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
        self._lock = threading.RLock()  # re-entrant: a handler may call trigger() mid-take
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
        check_trigger(n, label)
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
