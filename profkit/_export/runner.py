"""An exporter's own thread for its flush and shutdown: they queue there, so one that hangs
can be timed out (exports are called by the export worker itself: :mod:`.fanout`).

See :class:`Runner`. A job whose every waiter gave up before it started is cancelled, so a
window counted dropped is never delivered after all; an ``async def`` exporter method (whose
coroutine no one would run) is an error, not a call that succeeded. Every change to the
runner's state is made with signals held (:func:`profkit._compat.hold_signals`): a signal
handler's exception cannot leave a job half-queued, and a handler that flushes cannot find
one; the waits themselves are not held.
"""

from __future__ import annotations

import inspect
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from .._compat import hold_signals
from .._deadline import MAX_GIVEN_S, Deadline
from .._stats import Stats
from .._text import clean
from ..exporters import Exporter

__all__ = ["Runner", "name_of", "not_awaitable"]


#: longest exporter name profkit writes (thread names, ``stats()`` reason keys)
_NAME_LIMIT = 64


def name_of(exporter: Any) -> str:
    """An exporter's ``name`` as one bounded line: its class's name when it has none, or
    when reading it raises (an exporter's property is not allowed to fail ``configure()``)."""
    try:
        name = getattr(exporter, "name", None)
        text = name if isinstance(name, str) else ("" if name is None else str(name))
    except Exception:
        text = ""
    return clean(text or type(exporter).__name__, _NAME_LIMIT)


class _Job:
    """One call on a runner: queued, running, then done; or cancelled before it ran (every
    caller waiting for it gave up), so a window counted dropped is never delivered later.

    A flush's or a shutdown's ``fn`` takes the seconds to give the exporter, worked out as
    it starts from the latest deadline of its waiters (callers flushing at once share it).
    """

    __slots__ = ("cancelled", "deadlines", "done", "flush", "fn", "result", "started", "waiters")

    def __init__(self, fn: Callable[..., Any], flush: bool, deadline: Deadline | None) -> None:
        self.fn = fn
        self.flush = flush
        self.deadlines = [deadline] if deadline is not None else None
        self.done = threading.Event()
        self.result: Any = None
        self.started = self.cancelled = False
        self.waiters = 1

    def run(self) -> Any:
        if self.deadlines is None:
            return self.fn()
        return self.fn(min(max(d.left() for d in self.deadlines), MAX_GIVEN_S))


class Runner:
    """A daemon thread that runs one exporter's calls, so a hang can be timed out.

    An export queues behind a flush (a flush is no hang) and a flush behind anything, sharing
    one queued and not started. Once an export's wait timed out (a hang: ``export_timeout``)
    the runner is *stuck* and refuses the next export at once until it is idle again; a
    flush whose caller gave up early (a health check's short timeout) marks nothing. The
    thread starts on the first call: a forked child that never exports never starts one.
    After :meth:`close` it exits as soon as the call it is running (if any) returns.
    """

    def __init__(self, exporter: Exporter, stats: Stats, thread: str = "") -> None:
        self.exporter = exporter
        self.stats = stats  # its CPU time per call is profkit's: charged to stats.cpu
        self.name = name_of(exporter)
        self._thread_name = f"profkit-{thread or self.name}"
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.RLock()
        self._live: list[_Job] = []  # queued or running, in order
        self._stuck = False
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def busy(self) -> bool:
        return bool(self._live)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                if job.cancelled:
                    continue
                job.started = True
            cpu0 = time.thread_time()
            try:
                job.result = not_awaitable(job.run())
            except BaseException as exc:
                job.result = exc
            finally:
                try:
                    self.stats.cpu.charge(time.thread_time() - cpu0)  # before the caller goes on
                finally:
                    with self._lock:
                        if job in self._live:
                            self._live.remove(job)
                        if not self._live:
                            self._stuck = False
                    job.done.set()

    def call(self, fn: Callable[[], Any], timeout: float | None) -> tuple[bool, Any]:
        """Run ``fn`` (an export) on the runner: (finished in time, result or exception)."""
        if timeout is not None and timeout <= 0:
            return False, TimeoutError(f"no time left for exporter {self.name!r}")
        return self.wait(self.submit(fn), timeout)

    def submit(
        self, fn: Callable[..., Any], flush: bool = False, deadline: Deadline | None = None
    ) -> Any:
        """Start ``fn`` on the runner (or join the flush queued); :meth:`wait` for what
        this returns. A stuck runner, or one busy with anything but flushes, refuses an
        export (or a shutdown) at once; a flush always queues, for as long as its caller
        waits. With ``deadline``, ``fn`` takes the seconds left (see :class:`_Job`)."""
        with hold_signals(), self._lock:
            if self._closed:  # e.g. force_flush() on a session that was shut down
                return True, RuntimeError(f"exporter {self.name!r} was shut down")
            live = self._live
            if live and not flush and (self._stuck or not all(j.flush for j in live)):
                return False, TimeoutError(
                    f"exporter {self.name!r} still busy with an earlier call"
                )
            last = live[-1] if live else None
            if flush and last is not None and last.flush and not last.started:
                last.waiters += 1  # its answer is this caller's too, given its time
                if deadline is not None and last.deadlines is not None:
                    last.deadlines.append(deadline)
                return last
            job = _Job(fn, flush, deadline)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name=self._thread_name, daemon=True
                )
                self._thread.start()
            self._jobs.put(job)
            live.append(job)
        return job

    def wait(self, job: Any, timeout: float | None) -> tuple[bool, Any]:
        """(finished in time, result or exception) of a :meth:`submit`."""
        if not isinstance(job, _Job):  # refused: (finished, why)
            return job  # type: ignore[no-any-return]
        if job.done.wait(timeout):
            return True, job.result
        with hold_signals(), self._lock:
            if job.done.is_set():
                return True, job.result
            job.waiters -= 1
            if not job.waiters and not job.started:
                job.cancelled = True  # never runs: it was counted as not done
                if job in self._live:
                    self._live.remove(job)
            if not job.flush and self._live:
                self._stuck = True  # an export past export_timeout: a hang, until idle
        return False, TimeoutError(f"exporter {self.name!r} took longer than {timeout}s")

    def close(self) -> None:
        with hold_signals(), self._lock:
            self._closed = True
            if self._thread is not None:
                self._jobs.put(None)  # after every job queued: they run, then the thread ends


def not_awaitable(result: Any) -> Any:
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # (no "never awaited" warning on top of the error)
        raise TypeError(
            "an exporter method returned an awaitable: profkit calls exporters from threads of "
            "its own, so export, force_flush and shutdown must be plain (not async def)"
        )
    return result
