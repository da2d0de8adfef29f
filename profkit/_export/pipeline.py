"""The export pipeline: a bounded queue of stopped windows, one worker thread, flush, shutdown.

Shaped like OpenTelemetry's ``BatchProcessor``: one object owns the queue, the thread, the
count of calls not yet exported, and its own re-initialisation in a forked child. Unlike it,
flush and shutdown share ONE deadline across every step (waiting for the queue, the worker,
each exporter), and a hung exporter is still cut off: the worker calls the exporters itself
(:mod:`profkit._export.fanout`), and one stuck past ``export_timeout`` is noticed by the
next window offered or by a flush or shutdown waiting; its worker is then abandoned (its
window counted ``export_timeout:<name>``) and a fresh worker takes the queue.

Every recorded call handed to :meth:`offer` ends counted exactly once: ``exported`` (it
reached a recording span or an exporter took it), or ``dropped`` with a reason
(``queue_full``, ``shutdown``, ``span_not_recording``, ``provider_shut_down``,
``no_exporter``, or what processing and the exporters reported). A window still being
exported when shutdown gives up on the worker is counted ``shutdown`` there, and not again
when the worker finishes it.

:meth:`force_flush` and :meth:`shutdown` are True only when every window handed off since
the previous call was exported by every exporter and the span step (docs/reliability.md).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from .._compat import hold_signals
from .._deadline import Deadline
from .._records import StoppedWindow
from .._stats import Stats
from .._weak import at_fork_in_child_weakly
from .fanout import Fanout, Worker
from .processing import Processor
from .worker import STOP, Ledger, WorkerLoop

__all__ = ["ExportPipeline"]

#: longest wait of a flush between looks at the worker's deadline (a hung exporter)
_GUARD_S = 0.05


class ExportPipeline(WorkerLoop):
    """Queue, worker and flush/shutdown for the stopped windows of one session."""

    def __init__(
        self,
        stats: Stats,
        processor: Processor,
        fanout: Fanout,
        queue_size: int,
        after_each: Callable[[], None] = lambda: None,
    ) -> None:
        self.stats = stats
        self.processor = processor
        self.fanout = fanout
        self._queue_size = queue_size
        #: runs on the worker after each window (the session builds its next profiler there)
        self._after_each = after_each
        self._init_state()
        at_fork_in_child_weakly(self, "_at_fork_reinit")  # (no WeakMethod: see profkit._weak)

    def _init_state(self) -> None:
        # the request path (offer) takes only C-level locks in ``with`` statements and puts
        # into a C queue: an exception a signal handler raises cannot land between taking a
        # lock and the block that releases it (a Python-level Condition or queue.Queue can)
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._worker_id: Worker | None = None
        # re-entrant, as every lock the request path takes: a signal handler calling profkit
        self._lock = threading.RLock()  # inside the block goes on; orders offer vs shutdown
        self._closed = False
        self._ledger = Ledger(self.stats)
        self._idle = threading.Condition()  # the worker notifies, flush waits: no request
        self._windows_done = 0
        #: (the worker's busy wall ns over all windows so far, when the current window's work
        #: began: 0 idle), one tuple set at once, so a reader never sees half of a change
        self._busy = (0, 0)

    def _at_fork_reinit(self) -> None:
        """In a forked child: the worker did not survive the fork; start clean (lazily)."""
        self._init_state()
        self.fanout.at_fork_reinit()

    # -- request path -----------------------------------------------------------------------

    def full(self) -> bool:
        """Whether a window recorded now would find the queue full (no lock: one C call).

        The session asks before it opens a window: a window that would be dropped as
        ``queue_full`` is not recorded at all (``skipped_backlog``).
        """
        return self._queue.qsize() >= self._queue_size

    def busy_ns(self) -> int:
        """The worker's busy wall time so far, in ns, the window in progress included.

        The difference across a call bounds how much of it the worker may have taken (it
        holds the GIL while it summarises): capture_slow subtracts it before judging a call.
        """
        total, since = self._busy
        return total + (time.perf_counter_ns() - since if since else 0)

    def offer(self, win: StoppedWindow) -> None:
        """Queue a stopped window for export, or count its calls as dropped."""
        recorded = win.recorded
        current = self.fanout.guard.current  # the worker is in an exporter: overdue?
        if current is not None and time.monotonic() >= current[2]:
            self.check_worker()
        with self._lock:
            if self._closed or self._queue.qsize() >= self._queue_size:
                self.lose(win, "shutdown" if self._closed else "queue_full")
                return
            with self._ledger.lock:  # counted and queued together: no check falls in between
                self._ledger.pending += recorded
                win.handed = True  # (no call between these two: a signal lands before or after)
                self._queue.put(win)
            self._ensure_worker()

    def lose(self, win: StoppedWindow, reason: str, *, release: bool = True) -> None:
        """Count each recorded call of a window not for export as dropped, once; free it."""
        for call in win.calls:
            if not call.warmup and call.policy.exported:
                self._ledger.note_loss()
                self.stats.settle(call, reason)
        if release:
            win.release()

    def start(self) -> None:
        """Start the worker now (``configure()``), so the first sampled call does not."""
        with self._lock:
            self._ensure_worker()

    # -- control ----------------------------------------------------------------------------

    def force_flush(self, deadline: Deadline, answering: bool = True) -> bool:
        """Wait until every handed-off window is counted, then flush the exporters; True
        when all flushed and every window handed off since the last call was exported
        (``answering=False``: the next call still answers for the same losses)."""
        mark = self._ledger.mark  # the losses the previous call answered for
        counted = True
        with self._idle:
            while self._ledger.pending > 0:
                if deadline.passed:
                    counted = False
                    break
                wait = deadline.wait_arg()
                self._idle.wait(_GUARD_S if wait is None else min(wait, _GUARD_S))
                if self.fanout.guard.current is not None:
                    self.check_worker()
        flushed = counted and self.fanout.flush(deadline)
        return (self._ledger.answer(mark) if answering else self._ledger.losses <= mark) and flushed

    def shutdown(self, deadline: Deadline) -> bool:
        """Flush, then stop the worker and the exporters; True when everything was exported.

        Whatever is still queued at the deadline is counted as dropped ("shutdown"). The
        worker exits once its current window is done, even one held up by a hung exporter.
        """
        flushed = self.force_flush(deadline)
        with self._lock:
            self._closed = True
            worker = self._worker
        if self._drain():  # calls left behind
            flushed = False
        if worker is not None:
            self._queue.put(STOP)  # closed: nothing is queued after it
            self._join(deadline)
            worker = self._worker  # (a fresh one, when the first was abandoned meanwhile)
            if worker is not None and worker.is_alive() and self._ledger.abandon():
                flushed = False
                self._settle(0)  # a flush waiting on another thread for that window: wake it
        return self.fanout.shutdown(deadline) and flushed

    def _join(self, deadline: Deadline) -> None:
        """Wait for the worker to exit, within ``deadline``, cutting one hung in an exporter
        past ``export_timeout`` (its window counted then, as any other's)."""
        while True:
            worker = self._worker
            if worker is None:
                return
            wait = deadline.wait_arg()
            worker.join(_GUARD_S if wait is None else min(wait, _GUARD_S))
            if not worker.is_alive() or deadline.passed:
                return
            if self.fanout.guard.current is not None:
                self.check_worker()

    def write_off(self, reason: str, grace: Deadline) -> int:
        """Count every call handed off and not exported yet as dropped for ``reason``, and
        go on with a fresh worker: the process is about to end without exit hooks (uvicorn
        re-raises SIGTERM after the application's shutdown). The queue is drained first;
        the window the worker holds gets until ``grace`` to finish, then its worker is
        abandoned (its late result discarded). Returns how many calls were written off."""
        with self._lock:
            if self._closed:
                return 0  # (shutdown counted everything)
        lost = self._drain(reason)
        with self._idle:  # the window in flight: counted as it ends, if it ends in time
            while self._ledger.pending > 0 and not grace.passed:
                self._idle.wait(grace.wait_arg())
        with hold_signals(), self._lock, self._ledger.lock:
            left = self._ledger.pending
            if left <= 0 or self._ledger.abandoned or self._worker_id is None:
                return lost
            self.fanout.guard.abandon(self._worker_id)
            self._ledger.pending = 0
            self._ledger.losses += 1
            self.stats.drop(reason, left)
            self._worker = self._worker_id = None
            self._busy = (self._busy[0], 0)
            self._ensure_worker()
        return lost + left

    def _drain(self, reason: str = "shutdown") -> int:
        """Count what the worker has not taken yet as dropped; returns how many calls."""
        total = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return total
            if item is STOP:  # (closed meanwhile: the worker's, put back)
                self._queue.put(STOP)
                return total
            n = item.recorded  # type: ignore[attr-defined]
            self.lose(item, reason)  # type: ignore[arg-type]
            total += n
            self._settle(n)
