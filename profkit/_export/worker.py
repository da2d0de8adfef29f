"""The export worker's side of the pipeline: take a window, summarise it, export it, count
it; and the ledger of calls handed off and not yet counted.

:class:`WorkerLoop` is the half of :class:`~profkit._export.pipeline.ExportPipeline` that
runs on the worker thread (the pipeline holds the queue and its control): one window at a
time, in order. A worker abandoned by the deadline guard (:mod:`.steps`) returns from its
loop once the exporter it was stuck in returns; the fresh worker goes on with its window.
"""

from __future__ import annotations

import gc
import queue
import threading
import time
from collections.abc import Callable

from .._compat import hold_signals
from .._errors import guard
from .._records import StoppedWindow
from .._stats import Stats
from .fanout import Fanout
from .processing import Processor
from .steps import Abandoned, Progress, Worker

__all__ = ["STOP", "Ledger", "WorkerLoop"]

STOP = object()
#: collect garbage on the worker every this many windows (torch's repeated sessions leak cycles)
_GC_EVERY = 25
#: seconds the worker waits after taking a window before it summarises it
_HANDOFF_GRACE_S = 0.001


class WorkerLoop:
    """What the export worker runs (a base of the pipeline, which sets these attributes)."""

    stats: Stats
    processor: Processor
    fanout: Fanout
    _queue: queue.SimpleQueue[object]
    _ledger: Ledger
    _idle: threading.Condition
    _after_each: Callable[[], None]
    _windows_done: int
    _busy: tuple[int, int]
    _lock: threading.RLock
    _closed: bool
    _worker: threading.Thread | None
    _worker_id: Worker | None

    def _ensure_worker(self) -> None:
        """Start the worker unless it runs (call with ``_lock`` held)."""
        if self._worker is None and not self._closed:
            self._start_worker(None)

    def _start_worker(self, resume: tuple[StoppedWindow, Progress] | None) -> None:
        """Start a worker that first goes on with ``resume`` (call with ``_lock`` held)."""
        worker = Worker()
        self._worker_id = worker
        self._worker = threading.Thread(
            target=self._run, args=(worker, resume), name="profkit-export", daemon=True
        )
        self._worker.start()

    def check_worker(self) -> None:
        """If the worker is in an exporter call past its deadline: leave that worker to
        exit when the call returns, and start a fresh one, which goes on with the window
        from the next exporter (the window counted ``export_timeout:<name>``) and then takes
        the queue. One clock read when the call is within its time."""
        with hold_signals():  # (the request path: all of it, or none of it)
            found = self.fanout.guard.overdue()
            if found is None:
                return
            win, progress = found
            with self._lock:
                total, since = self._busy
                self._busy = (total + (time.perf_counter_ns() - since if since else 0), 0)
                # (even after shutdown closed the queue: the window is finished and counted,
                # then the fresh worker takes shutdown's stop)
                self._start_worker((win, progress) if win is not None and progress else None)

    def _run(self, worker: Worker, resume: tuple[StoppedWindow, Progress] | None) -> None:
        if resume is not None:
            self._busy = (self._busy[0], time.perf_counter_ns())
            try:
                self._handle(*resume, worker)
            except Abandoned:
                return
            finally:
                if not worker.abandoned:
                    total, since = self._busy
                    self._busy = (total + time.perf_counter_ns() - since, 0)
        while not worker.abandoned:
            item = self._queue.get()
            if item is STOP:
                return
            # let the thread that handed the window off return from its call first: woken
            # at once, the worker takes the GIL at the call's next release (freeing a tensor
            # can release it) and the sampled request waits out a whole switch interval
            time.sleep(_HANDOFF_GRACE_S)
            self._busy = (self._busy[0], time.perf_counter_ns())
            try:
                self._handle(item, None, worker)  # type: ignore[arg-type]  # (not STOP: a window)
            except Abandoned:
                return  # its window went on elsewhere or was counted; another has the queue
            finally:
                if not worker.abandoned:
                    total, since = self._busy
                    self._busy = (total + time.perf_counter_ns() - since, 0)
        # (abandoned: its window was written off after it was counted; another has the queue)

    def _handle(self, win: StoppedWindow, progress: Progress | None, worker: Worker) -> None:
        cpu0 = time.thread_time()  # profkit's CPU time: what max_overhead bounds
        recorded = win.recorded
        worker.win = win
        try:
            exported, reason, complete = 0, "worker_error", False
            with guard(self.stats, "worker"):
                exported, why, complete = self._export(win, progress, worker)
                reason = why or "no_summary"  # recorded calls that left no summary
            if self._ledger.count(recorded, exported, reason, complete, worker):
                recorded = 0  # (settled with the count)
        finally:
            if not worker.abandoned:  # (else a fresh worker goes on with it, or it was
                worker.win = None  # written off)
                self._finish(win, recorded, cpu0)

    def _finish(self, win: StoppedWindow, recorded: int, cpu0: float) -> None:
        """After a window: free it, collect now and then, build the next profiler, charge
        the worker's CPU time, settle its calls."""
        try:
            win.release()  # events and kineto results freed now, by reference counting
            self._windows_done += 1
            if self._windows_done % _GC_EVERY == 0:
                # young generations only: what release() leaves in cycles is small, and a
                # full collection holds the GIL (every request thread) for hundreds of ms
                gc.collect(1)
            self._after_each()
        finally:
            # charged before a flush waiting for this window can return
            self.stats.cpu.charge(time.thread_time() - cpu0)
            self._settle(recorded)

    def _settle(self, recorded: int) -> None:
        """``recorded`` handed-off calls are counted now; wake whoever flushes."""
        self._ledger.settle(recorded)
        with self._idle:
            self._idle.notify_all()

    def _export(
        self, win: StoppedWindow, progress: Progress | None, worker: Worker
    ) -> tuple[int, str | None, bool]:
        """Summarise and export one window (or go on with one from ``progress``): (calls
        delivered, why the others were not, whether every exporter and the span step took
        every call)."""
        if progress is not None:
            return self.fanout.export(progress.summary, worker, progress)
        summary = self.processor.summarise(win)
        if isinstance(summary, str):
            return 0, summary, False
        if not summary.calls:
            return 0, _empty_reason(win), win.recorded == 0
        return self.fanout.export(summary, worker)


def _empty_reason(win: StoppedWindow) -> str | None:
    """Why a window's calls left no summary: ``interrupted`` when each ended by an exception
    before its first scope was recorded (a signal's, landing between the decision and the
    scope), else None (``no_summary``)."""
    calls = [c for c in win.calls if not c.warmup and c.policy.exported]
    if calls and all(c.error is not None and not c.scopes for c in calls):
        return "interrupted"
    return None


class Ledger:
    """The calls handed off and not counted yet, and how many times a window was lost (not
    exported by every exporter), so each flush can say whether one was lost since the
    previous flush returned; ``lock`` guards them."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self.lock = threading.RLock()  # (re-entrant: see ExportPipeline._init_state)
        self.pending = 0
        #: windows lost so far, and how many of them the last flush to return answered for
        self.losses = self.mark = 0
        #: shutdown gave up on the window in flight and counted its calls ("shutdown")
        self.abandoned = False

    def count(
        self, recorded: int, exported: int, reason: str, complete: bool, worker: Worker
    ) -> bool:
        """Count a window's calls and settle them, as one step, unless shutdown counted
        them already (abandoned) or ``worker`` was abandoned (its window written off)."""
        with self.lock:
            if self.abandoned or worker.abandoned:
                return False
            if recorded and (recorded > exported or not complete):
                self.losses += 1
            if exported:
                self.stats.add("exported", exported)
            if recorded > exported:
                self.stats.drop(reason, recorded - exported)
            self.pending -= recorded
            return True

    def settle(self, recorded: int) -> None:
        with self.lock:
            if not self.abandoned:
                self.pending -= recorded

    def note_loss(self) -> None:
        with self.lock:
            self.losses += 1

    def answer(self, mark: int) -> bool:
        """A flush that began after the flush that answered for ``mark`` losses returns:
        True when none was lost since (flushes that overlap a loss all say so)."""
        with self.lock:
            lost = self.losses > mark
            self.mark = max(self.mark, self.losses)
        return not lost

    def abandon(self) -> int:
        """Count the calls of the window the worker is still exporting as dropped
        ("shutdown"); the worker then leaves them uncounted. Returns how many."""
        with self.lock:
            left, self.pending = self.pending, 0
            self.abandoned = True
            if left > 0:
                self.losses += 1
                self.stats.drop("shutdown", left)
        return max(left, 0)
