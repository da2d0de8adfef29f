"""The export pipeline: a bounded queue of stopped windows, one worker thread, flush, shutdown.

Shaped like OpenTelemetry's ``BatchProcessor``: one object owns the queue, the thread, the
count of calls not yet exported, and its own re-initialisation in a forked child. Unlike it,
flush and shutdown share ONE deadline across every step (waiting for the queue, the worker,
each exporter), and a hung exporter is still cut off (see :mod:`profkit._export.fanout`).

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

import gc
import queue
import threading
import time
from collections.abc import Callable

from .._deadline import Deadline
from .._errors import guard
from .._records import StoppedWindow
from .._stats import Stats
from .._weak import at_fork_in_child_weakly
from .fanout import Fanout
from .processing import Processor

__all__ = ["ExportPipeline"]

_STOP = object()
#: collect garbage on the worker every this many windows (torch's repeated sessions leak cycles)
_GC_EVERY = 25
#: seconds the worker waits after taking a window before it summarises it
_HANDOFF_GRACE_S = 0.001


class ExportPipeline:
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
        # re-entrant, as every lock the request path takes: a signal handler calling profkit
        self._lock = threading.RLock()  # inside the block goes on; orders offer vs shutdown
        self._closed = False
        self._ledger = _Ledger(self.stats)
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

    def _ensure_worker(self) -> None:
        """Start the worker unless it runs (call with ``_lock`` held)."""
        if self._worker is None and not self._closed:
            self._worker = threading.Thread(target=self._run, name="profkit-export", daemon=True)
            self._worker.start()

    # -- worker -----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            # let the thread that handed the window off return from its call first: woken
            # at once, the worker takes the GIL at the call's next release (freeing a tensor
            # can release it) and the sampled request waits out a whole switch interval
            time.sleep(_HANDOFF_GRACE_S)
            self._busy = (self._busy[0], time.perf_counter_ns())
            try:
                self._handle(item)  # type: ignore[arg-type]  # (not _STOP: a window)
            finally:
                total, since = self._busy
                self._busy = (total + time.perf_counter_ns() - since, 0)

    def _handle(self, win: StoppedWindow) -> None:
        cpu0 = time.thread_time()  # profkit's CPU time: what max_overhead bounds
        recorded = win.recorded
        try:
            exported, reason, complete = 0, "worker_error", False
            with guard(self.stats, "worker"):
                exported, why, complete = self._export(win)
                reason = why or "no_summary"  # recorded calls that left no summary
            self._ledger.count(recorded, exported, reason, complete)
        finally:
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

    def _export(self, win: StoppedWindow) -> tuple[int, str | None, bool]:
        """Summarise and export one window: (calls delivered, why the others were not,
        whether every exporter and the span step took every call)."""
        summary = self.processor.summarise(win)
        if isinstance(summary, str):
            return 0, summary, False
        if not summary.calls:
            return 0, _empty_reason(win), win.recorded == 0
        return self.fanout.export(summary)

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
                self._idle.wait(deadline.wait_arg())
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
            self._queue.put(_STOP)  # closed: nothing is queued after it
            worker.join(deadline.wait_arg())
            if worker.is_alive() and self._ledger.abandon():
                flushed = False
                self._settle(0)  # a flush waiting on another thread for that window: wake it
        return self.fanout.shutdown(deadline) and flushed

    def _drain(self) -> int:
        """Count what the worker has not taken yet as dropped; returns how many calls."""
        total = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return total
            if item is not _STOP:
                n = item.recorded  # type: ignore[attr-defined]
                self.lose(item, "shutdown")  # type: ignore[arg-type]
                total += n
                self._settle(n)


def _empty_reason(win: StoppedWindow) -> str | None:
    """Why a window's calls left no summary: ``interrupted`` when each ended by an exception
    before its first scope was recorded (a signal's, landing between the decision and the
    scope), else None (``no_summary``)."""
    calls = [c for c in win.calls if not c.warmup and c.policy.exported]
    if calls and all(c.error is not None and not c.scopes for c in calls):
        return "interrupted"
    return None


class _Ledger:
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

    def count(self, recorded: int, exported: int, reason: str, complete: bool) -> None:
        """Count a window's calls, unless shutdown already counted them (abandoned)."""
        with self.lock:
            if self.abandoned:
                return
            if recorded and (recorded > exported or not complete):
                self.losses += 1
            if exported:
                self.stats.add("exported", exported)
            if recorded > exported:
                self.stats.drop(reason, recorded - exported)

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
