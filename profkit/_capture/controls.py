"""The control calls of :class:`profkit._capture.decide.Decider`: each label's unprofiled
baseline, timed on its thread's CPU clock, that its sampled calls' CPU time is charged
against (:mod:`profkit._overhead`)."""

from __future__ import annotations

import contextlib
from asyncio import _get_running_loop
from typing import Any

from .._overhead import MAX_BASELINES, Baselines, Control
from .._sampling import EveryN, Sampler
from .._text import escape
from .kinds import CONTROLLED, Decision

__all__ = ["Controls"]


class Controls:
    """The control calls (rule 5, 4c in docs/reliability.md): each label's baseline, and the
    labels whose next unprofiled call is one, marked as a sampled call of theirs ends where
    the sampler gives no :data:`CONTROL` answers of its own (``sample_every=1``, a ratio)."""

    def __init__(self, sampler: Sampler) -> None:
        self.baselines = Baselines()
        #: labels as summaries name them, oldest first (an ordered set), bounded
        self.due: dict[str, None] = {}
        self._marks = not (isinstance(sampler, EveryN) and sampler.n > 1)
        #: each label's CONTROL answers so far (a label with a full baseline takes 1 in 4)
        self._answers: dict[str, int] = {}

    def make(self, label: str, timed: Any, key: str | None = None) -> Decision | None:
        """A control call of ``label``, unless an asyncio loop runs on this thread; once its
        baseline holds five, one answer in four (one costs ~1.5 µs: two system calls)."""
        if _get_running_loop() is not None:
            return None
        key = key or escape(label)
        if self.baselines.count(key) >= 5:
            answers = self._answers
            n = answers.get(key, 0) + 1
            if len(answers) < MAX_BASELINES or key in answers:
                answers[key] = n
            if n % 4:
                return None
        return (CONTROLLED, Control(self.baselines, timed, label, key))

    def take_due(self, label: str, timed: Any) -> Decision | None:
        """A control call if ``label`` is due one (then no longer), else None."""
        key = escape(label)
        if self.due.pop(key, 0) is not None or _get_running_loop() is not None:
            return None  # (a due label's value is None: a missing one gives 0)
        return (CONTROLLED, Control(self.baselines, timed, label, key))

    def sampled_ended(self, key: str) -> None:
        """A sampled plain root of ``key`` ended: its label's next unprofiled call is due."""
        if self._marks:
            due = self.due
            due.pop(key, None)
            if len(due) >= MAX_BASELINES:
                with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                    del due[next(iter(due))]  # (raced by another thread's mark)
            due[key] = None
