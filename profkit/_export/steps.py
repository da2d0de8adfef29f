"""The deadline guard of the export worker: the exporter it is calling, and until when.

The worker calls the span step and each exporter itself (:mod:`.fanout`); while it is inside
one call, :class:`DeadlineGuard` holds (the worker, the step, the call's deadline:
``export_timeout`` after it began). Whoever looks next (the next window offered on the
request path, a flush or shutdown waiting) asks :meth:`DeadlineGuard.overdue`: one attribute
read, and one clock read while a call is running. A call past its deadline abandons its
worker (it exits once the exporter returns, its result discarded), marks the exporter
*hung* (it refuses windows at once until that call returns) and hands the window's
:class:`Progress` to a fresh worker, which goes on with the next exporter. Each exporter is
called by one thread at a time (its *gate*): an export waits for its flush or shutdown (on
the exporter's runner) up to ``export_timeout``, and a flush for its export.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .._model import WindowSummary
from .._stats import Stats
from ..exporters import Exporter
from .runner import Runner, name_of, not_awaitable

__all__ = ["Abandoned", "DeadlineGuard", "Progress", "Step", "Worker", "gated"]


class Worker:
    """One export worker's identity: the window it is exporting, and whether it was
    abandoned (it overran a deadline; another worker has the queue)."""

    __slots__ = ("abandoned", "progress", "win")

    def __init__(self) -> None:
        self.abandoned = False
        self.win: Any = None
        self.progress: Progress | None = None


class Progress:
    """How far one summary got through the span step and the exporters: a fresh worker
    goes on from there when the one exporting it was abandoned."""

    __slots__ = ("failure", "next", "spans_ok", "summary", "why_not")

    def __init__(self, summary: WindowSummary) -> None:
        self.summary = summary
        #: the index (in ``Fanout._all()``) of the step called now or next
        self.next = 0
        self.failure: str | None = None
        self.spans_ok = True
        self.why_not = "span_not_recording"


class Abandoned(BaseException):
    """Raised on an abandoned worker when the exporter it was stuck in returns (a
    BaseException: the internal-error guard lets it through to the worker's loop)."""


class Step:
    """The span step or one exporter as the worker calls it, with its runner for flush and
    shutdown and its gate (one caller at a time)."""

    __slots__ = ("busy", "exporter", "gate", "hung", "name", "runner", "waited_out")

    def __init__(self, exporter: Exporter, stats: Stats) -> None:
        self.exporter = exporter
        self.name = name_of(exporter)
        self.runner = Runner(exporter, stats)
        #: held by whoever calls the exporter: the worker exporting, its runner flushing
        self.gate = threading.Lock()
        #: an abandoned worker is still inside its export: later windows are refused at once
        self.hung = False
        #: an export waited out a flush: refused at once until the gate is free
        self.waited_out = False
        #: the worker is inside it now
        self.busy = False


def gated(gate: threading.Lock, fn: Callable[[float], Any], timeout: float) -> Any:
    """``fn(timeout)`` once the exporter is free (its export done), within ``timeout``."""
    if not gate.acquire(timeout=timeout):
        raise TimeoutError("the exporter is still busy with an export")
    try:
        return fn(timeout)
    finally:
        gate.release()


class DeadlineGuard:
    """The worker's current exporter call and its deadline; see the module's docstring."""

    def __init__(self, stats: Stats, timeout: float) -> None:
        self.stats = stats
        self.timeout = timeout
        #: (worker, step, monotonic deadline) of the call the worker is in; None between
        #: calls. Read without the lock by :meth:`overdue` (one attribute), changed under it
        self.current: tuple[Worker, Step, float] | None = None
        self._lock = threading.Lock()

    def call(self, worker: Worker, step: Step, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """Call ``fn`` (``step``'s export) on this worker under the guard: (finished, its
        result or exception); (False, why) when the exporter is busy. Raises
        :class:`Abandoned` on a worker abandoned meanwhile, once the call returns."""
        timeout = self.timeout
        if step.hung or (step.waited_out and step.gate.locked()):
            busy = TimeoutError(f"exporter {step.name!r} still busy with an earlier call")
            return False, busy
        if not step.gate.acquire(timeout=timeout):  # its flush or shutdown runs: wait
            step.waited_out = True
            late = TimeoutError(f"exporter {step.name!r} took longer than {timeout}s")
            return False, late
        step.waited_out = False
        with self._lock:
            if not worker.abandoned:  # (written off before its call began: no call)
                self.current = (worker, step, time.monotonic() + timeout)
                step.busy = True
        if not step.busy:
            step.gate.release()
            raise Abandoned
        try:
            try:
                outcome: tuple[bool, Any] = (True, not_awaitable(fn()))
            except BaseException as exc:  # an exporter's, whatever it is: contained
                outcome = (True, exc)
        finally:
            with self._lock:
                step.busy = False
                if worker.abandoned:
                    step.hung = False  # it returned: the exporter takes windows again
                else:
                    self.current = None
            step.gate.release()
        if worker.abandoned:
            raise Abandoned
        return outcome

    def abandon(self, worker: Worker) -> None:
        """Abandon ``worker`` whatever it is doing (its window was written off): it calls
        no exporter from now on, and the exporter it is in, if any, is hung until it
        returns."""
        with self._lock:
            worker.abandoned = True
            current = self.current
            if current is not None and current[0] is worker:
                current[1].hung = True
                self.current = None

    def overdue(self) -> tuple[Any, Progress | None] | None:
        """The window and its progress, when the worker's current call ran past its
        deadline: that worker is abandoned now (once), its exporter is hung, and the
        progress goes on after it."""
        current = self.current
        if current is None or time.monotonic() < current[2]:
            return None
        with self._lock:
            if self.current is not current:
                return None  # (it returned meanwhile)
            worker, step, _ = current
            worker.abandoned = True
            step.hung = True
            self.current = None
            reason = f"export_timeout:{step.name}"
            win, progress = worker.win, worker.progress
            if progress is not None:  # the fresh worker goes on with the next exporter
                progress.next += 1
                progress.failure = reason
        late = TimeoutError(f"exporter {step.name!r} took longer than {self.timeout}s")
        self.stats.error(reason, late)
        return win, progress
