"""The session: the composition root of one ``configure()`` (or ``testing.capture()``).

It builds the decision (:mod:`profkit._capture.decide`), the window owner
(:mod:`profkit._capture.keeper`) and the export pipeline (:mod:`profkit._export.pipeline`)
from one ``Config``, starts them (and the process hooks, :mod:`profkit._capture.hooks`) off
the request path, ends root calls, and flushes and shuts down. ``begin_root``
is the decision itself; ``end_root`` hands a call back to the owner of its window.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ._capture.decide import Decider, Decision
from ._capture.foreign import may_open, wait_for_other_thread
from ._capture.keeper import WindowKeeper, close_idle, install_hooks
from ._capture.slot import SLOT
from ._capture.window import Window, make_profiler, prime
from ._config import Config
from ._deadline import Deadline
from ._errors import guard
from ._export.fanout import Fanout, build_exporters
from ._export.metrics import Metrics
from ._export.pipeline import ExportPipeline
from ._export.processing import Processor
from ._overhead import Control
from ._records import CallRecord, Policy
from ._sampling import Triggered
from ._stats import Stats
from ._targeting.slow import LatencyBook, Speculation, Timed
from ._targeting.stages import StageRecorder
from ._targeting.verdict import judge

__all__ = ["Decision", "Session"]


def _holds_ended_calls(win: Window) -> bool:
    """Whether an open window still holds calls that ended, which no flush can export now.

    Idle and open (``window`` > 1 waiting on a live thread: another thread cannot close a
    thread-local profiler), or running a later call while an earlier one it recorded has
    ended (on any thread: the window records on until that call ends). Not a full one
    with no call running: that one is on its way to the pipeline.
    """
    if not win.in_flight:
        return not win.full
    return any(c.done and not c.warmup and c.policy.exported for c in list(win.calls))


class Session(Decider):
    """One profkit session: settings, counters, the decision, windows, export pipeline.

    It hosts the decision: ``begin_root`` is :meth:`Decider.decide` itself, a class attribute
    (no frame of its own, no bound method built on every root call; its state: ``__init__``).
    """

    #: ``begin_root(label, speculate=True) -> Decision``
    begin_root = Decider.decide

    def __init__(self, config: Config) -> None:
        self.config = config
        self.stats = Stats()
        self.active = config.enabled
        self.triggered = Triggered()
        spans, exporters = build_exporters(config)
        #: ``metrics``: the instruments (None when off: then none exists anywhere)
        self.metrics = (
            Metrics(config.meter_provider, self.stats, config.max_attribute_length)
            if config.metrics
            else None
        )
        delivered = self.metrics.delivered if self.metrics is not None else None
        fanout = Fanout(self.stats, spans, exporters, config.export_timeout, delivered)
        processor = Processor(config, self.stats)
        self.pipeline = ExportPipeline(
            self.stats, processor, fanout, config.queue_size, after_each=self._build_spare
        )
        #: capture_slow: the latency book (None when off: then no root call is timed)
        self._book = LatencyBook(config.slow_ms) if config.capture_slow else None
        speculation = Speculation(self._book) if self._book is not None else None
        self.keeper = WindowKeeper(config, self.stats, self.pipeline, speculation)
        Decider.__init__(
            self,
            config,
            self.stats,
            self.pipeline,
            self.keeper,
            self.triggered,
            self._book,
            speculation,
            time_all=self.metrics is not None,
        )
        #: ``timed((label, ns))``: an unprofiled root call that was timed has ended
        self.timed: Any = _noting(self._book.note) if self._book is not None else None
        self.stats.slow_calls = self._book.slow_calls if self._book is not None else None
        self.staging = _staging(self)  # capture_slow: a slow call left unprofiled, recorded
        if self.metrics is not None:
            self._time_every_call(self.metrics)
        #: seconds the once-per-process profiler start took in ``start()`` (0.0: primed)
        self.prime_seconds = 0.0
        self._shut = _Once()
        #: its shutdown's answer was returned to a caller (or is True): nothing left to tell
        self.answered = False

    def _time_every_call(self, metrics: Metrics) -> None:
        """``metrics``: every root call that is not profiled is timed (the decision returns
        ``TIMED``), and its duration goes to the metrics (and to the latency book with
        ``capture_slow``)."""
        book = self._book
        self.timed = metrics.timed if book is None else _both(book.note, metrics.timed)

    # -- request path -----------------------------------------------------------------------

    def end_root(self, call: CallRecord | Timed | Control, error: BaseException | None) -> None:
        """Close a sampled call; the last call of a done window stops it and hands it off.

        A timed unprofiled call (``capture_slow``) goes into the latency book; a speculative
        call is judged: slow, it is sampled (policy "slow"), else released unread.
        """
        if isinstance(call, (Timed, Control)):
            call.end()
            return
        call.error = error
        call.stopped = True
        call.done = True
        if call.tasks:  # its tasks hold their loop: a waiting window must not keep it alive
            call.tasks = set()
        if self._book is not None:
            judge(self._book, self.stats, call, self.pipeline.busy_ns, self.keeper.slow_token)
        if call.cpu_start_ns:  # (after the verdict: a speculative one's reads /proc)
            self._charge_own_cpu(call)
        if self.metrics is not None:
            self.metrics.ended(call, call.scopes[0].label if call.scopes else "?")
        self.keeper.ended(call, self.active)

    def _charge_own_cpu(self, call: CallRecord) -> None:
        """A sampled or speculative plain root ended on its thread: charge its CPU time beyond
        its label's baseline (none: the window's estimate, or a released call's inflation)."""
        win = call.window
        if win is None or win.owner != threading.get_ident() or not call.scopes:
            return
        if (win.needed != 1 and not win.speculative) or self.config.all_threads:
            return  # more calls, or others' ops: the window's estimate covers them, once
        key = call.scopes[0].label
        base = self.controls.baselines.get(key)
        self.controls.sampled_ended(key)
        if base is not None:  # less than nothing too: on average, what the profiler added
            self.stats.cpu.charge((time.thread_time_ns() - call.cpu_start_ns - base) / 1e9)
        elif call.policy is Policy.RELEASED and self._book is not None:
            self.stats.cpu.charge(self._book.inflation_ns(key) / 1e9)
        call.cpu_charged = base is not None or call.policy is Policy.RELEASED

    def start(self) -> None:
        """Install the process hooks, prime the profiler (once per process) and start the
        export worker, off the request path: otherwise the first sampled call pays the
        profiler's first start (about a second) and a thread start."""
        if self.active:
            install_hooks()
            if may_open():  # (never over a user's profiler, prepared and not started yet)
                with guard(self.stats, "prime"):
                    self.prime_seconds = prime(self.config)
            self._build_spare()
            self.pipeline.start()
            if self.metrics is not None:
                self.metrics.start()

    def _build_spare(self) -> None:
        """Build the next window's profiler ahead (here, and on the worker after a window)."""
        if self.active and self.keeper.spare is None:
            with guard(self.stats, "profiler_build"):
                self.keeper.spare = make_profiler(self.config)

    def trigger(self, n: int = 1, label: str | None = None) -> int:
        """How many of the ``n`` were added (``MAX_PENDING`` caps those pending)."""
        return self.triggered.add(n, label)  # checks its arguments (ValueError)

    def force_flush(self, timeout: float = 5.0, answering: bool = True) -> bool:
        """Wait until every handed-off window is exported or dropped, then flush exporters.

        A window that waits for more calls (``window`` > 1) is closed first when it is this
        thread's, and exported with the rest; another thread's cannot be (a thread-local
        profiler stops on its own thread), so its calls stay pending and the result is False.
        False also when profkit spans failed OTLP export since the last flush or shutdown
        (counted by :func:`profkit.exporters.otlp.otlp_span_processor`). ``answering=False``:
        the next flush or shutdown answers for the same losses (a flush ahead of the app's).
        """
        self.close_idle_window()
        win = SLOT.held
        waiting = win is not None and win.keeper is self.keeper and _holds_ended_calls(win)
        deadline = Deadline(timeout)
        flushed = self.pipeline.force_flush(deadline, answering)
        if self.metrics is not None:
            with guard(self.stats, "metrics"):  # (measurements still waiting: not all out)
                flushed = self.metrics.flush(deadline) and flushed
        return self._no_new_span_failures(answering) and flushed and not waiting

    def shutdown(self, timeout: float = 5.0, *, answering: bool = True) -> bool:
        """Stop sampling, let an open window finish, flush, stop the worker and exporters.

        A window still open at the deadline (or on the calling thread itself) is counted as
        dropped with reason "shutdown" when its call ends, and the result is then False; it
        is False as for :meth:`force_flush` otherwise. Run once (:class:`_Once`): a call
        while another thread's runs waits for it (within ``timeout``), a later one gets its
        answer; ``answering=False`` (the retire thread's) leaves the answer to be told.
        """
        return self._told(self._shut.run(self._shutdown, Deadline(timeout)), answering)

    def shutdown_answer(self, timeout: float, answering: bool = True) -> bool:
        """What its shutdown (run by another caller: the retire thread's, another thread's)
        answered, waiting for it up to ``timeout``; never runs it (False while unknown)."""
        return self._told(self._shut.wait(Deadline(timeout)), answering)

    def _told(self, answer: bool | None, answering: bool) -> bool:
        if answer is not None and (answering or answer):
            self.answered = True
        return bool(answer)

    def _shutdown(self, deadline: Deadline) -> bool:
        self.active = False
        wait_for_other_thread(self.keeper, deadline)
        close_idle(self.keeper, stopping=True)  # (one recording all threads: from here too)
        win = SLOT.held  # still held: a call in flight, or idle on its live thread (its next
        left_open = win is not None and win.keeper is self.keeper  # root call counts it)
        flushed = self.pipeline.shutdown(deadline)
        _count_idle_left(self)
        if self.metrics is not None:
            with guard(self.stats, "metrics"):  # (measurements shed: False)
                flushed = self.metrics.shutdown(deadline) and flushed
        return self._no_new_span_failures() and flushed and not left_open

    def _no_new_span_failures(self, asking: bool = True) -> bool:
        """Whether no profkit span failed OTLP export since this was last asked."""
        return not self.stats.grown_since_asked("otlp_spans_failed", asking)

    def close_idle_window(self) -> None:
        """Close this session's window that waits for more calls (``window`` > 1), if any."""
        close_idle(self.keeper)

    @property
    def shut_down(self) -> bool:
        """Its shutdown ran to the end (one cut short by an exception runs again)."""
        return self._shut.value is not None

    def at_fork_reinit(self) -> None:
        """In a forked child: fresh counters and triggers (the pipeline re-inits itself)."""
        self._shut = _Once()
        self.stats.at_fork_reinit()
        self.refresh_after_fork()
        self.triggered = Triggered()


def _count_idle_left(session: Session) -> None:
    """At shutdown: a window of ``session`` left idle on its live thread (it stops only
    there) has its calls counted dropped ("shutdown") now, once (its close counts no more)."""
    win = SLOT.held
    if (
        win is not None
        and win.keeper is session.keeper
        and not (win.in_flight or win.handed or win.closing)
    ):
        session.pipeline.lose(win, "shutdown", release=False)


class _Once:
    """A session's shutdown, run once: the first caller runs it; a caller meanwhile waits for
    it (within its own deadline: else None); a later one gets its answer; one cut short by an
    exception (a signal's) is run again by the next caller. A call nested in it on its own
    thread (a signal handler's) cannot wait for it: None (the lock is re-entrant, so one
    landing before the owner is noted does not wait on its own thread either)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._by: int | None = None
        self.value: bool | None = None
        self.done = threading.Event()

    def run(self, work: Callable[[Deadline], bool], deadline: Deadline) -> bool | None:
        me = threading.get_ident()
        if self._by == me:
            return None
        wait = deadline.wait_arg()
        if not self._lock.acquire(timeout=-1 if wait is None else wait):
            return None
        try:
            if self._by == me:  # (nested, the lock taken again on this thread)
                return None
            if self.value is None:
                self._by = me
                try:
                    self.value = work(deadline)
                    self.done.set()
                finally:
                    self._by = None
            return self.value
        finally:
            self._lock.release()

    def wait(self, deadline: Deadline) -> bool | None:
        """Its answer once it has run, waiting for it until ``deadline``; never runs it."""
        self.done.wait(deadline.wait_arg())
        return self.value


def _staging(session: Session) -> StageRecorder | None:
    """capture_slow: the session's stage records, else None."""
    book = session._book
    if book is None:
        return None
    config, metrics = session.config, session.metrics
    recorder = StageRecorder(book, session.stats, session.pipeline.offer, config.max_per_minute)
    recorder.also = metrics.timed if metrics is not None else None
    return recorder


def _noting(note: Callable[[str, int], object]) -> Callable[[tuple[str, int]], None]:
    """``timed`` with ``capture_slow``: ``(label, ns)`` into the latency book's ``note``."""

    def timed(item: tuple[str, int], _note: Any = note) -> None:
        _note(item[0], item[1])

    return timed


def _both(
    note: Callable[[str, int], object], metrics: Callable[[tuple[str, int]], None]
) -> Callable[[tuple[str, int]], None]:
    """``timed`` with ``capture_slow`` and ``metrics`` both on: the book, then the metrics."""

    def timed(item: tuple[str, int], _note: Any = note, _metrics: Any = metrics) -> None:
        _note(item[0], item[1])
        _metrics(item)

    return timed
