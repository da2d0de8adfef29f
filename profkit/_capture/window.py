"""One capture: torch.profiler started and stopped on the sampled call's thread, then read.

Only this module touches a window's ``torch.profiler.profile`` object (built by
:mod:`profkit._capture.profiler`): start, stop, discard, read its events (on the export worker),
write its Chrome trace, free it. It knows how to tell
whether a profiler someone else started is running (``torch.autograd.profiler.
_is_profiler_enabled``, a process global that both profiler front-ends set), and primes the
profiler once per process (its first start costs about a second). Which window may run
when is the slot's business (:mod:`profkit._capture.slot`), and what happens to a window the
owner's (:mod:`profkit._capture.keeper`), not this module's.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Any

import torch
from torch.profiler import profile

from .._compat import (
    clear_profiler_flag,
    finish_interrupted_start,
    hold_signals,
    kineto_quiet,
    profiler_enabled_here,
    profiler_flag,
)
from .._config import Config
from .._errors import retry_once
from .._records import CallRecord
from .._summary.events import Unreadable, WindowEvents
from .._summary.raw import read_cpu_events
from . import hooks as _hooks
from .profiler import (
    make_profiler,
    measure_recording,
    not_ours,
    ours,
    recording,
    start_profile,
    stop_profile,
    toggle,
)
from .reading import read_events

__all__ = [
    "Unreadable",
    "Window",
    "WindowEvents",
    "foreign_profiler_active",
    "make_profiler",
    "prime",
    "recording_cost",
    "started_before_fork",
    "stop_leaked",
    "stop_resident",
]

_primed: set[tuple[str, bool]] = set()
#: CPU seconds the profiler adds per recorded op, per primed setting (see recording_cost)
_per_event: dict[tuple[str, bool], float] = {}
#: re-entrant: a signal handler's configure() may land while its thread primes (its own
#: priming then finds the profiler on and returns, or primes its settings in between)
_prime_lock = threading.RLock()
#: the process in which profkit last started a torch profiler (0: none yet)
_started_in_pid = 0
#: set in a process forked after profkit had started a profiler (in its parent or earlier)
_forked_after_start = False
#: each profile profkit started and has not stopped: id -> (profile, all threads, its thread,
#: its window); leaked once its window no longer holds it
_unstopped: dict[int, tuple[profile, bool, threading.Thread, Any]] = {}


def started_before_fork() -> bool:
    """True in a process forked after profkit started a torch profiler in an ancestor.

    The first profiler start creates kineto's config-polling thread, which waits on a
    condition variable; a forked child inherits that wait without the thread, and a normal
    interpreter exit of the child then blocks for ever in kineto's ConfigLoader destructor
    (torch 2.13, upstream; children that end with ``os._exit``, like multiprocessing's, do not).
    """
    return _forked_after_start


def _note_fork_in_child() -> None:
    global _forked_after_start, _prime_lock
    _forked_after_start = _forked_after_start or _started_in_pid != 0
    _prime_lock = threading.RLock()  # (another thread's priming held it at fork: not here)
    if _forked_after_start:  # kineto's thread is not here: its teardown would hang the exit
        _hooks.exit_past_native_teardown()


def foreign_profiler_active() -> bool:
    """True when a torch profiler is running in this process (ours or anyone's)."""
    return profiler_flag()


def prime(config: Config) -> float:
    """Start and stop a profiler once per process and setting, so no request pays ~1 s.

    While it runs, it also measures what the profiler adds per recorded op on this thread
    (:func:`recording_cost`). Returns the seconds it took (0.0 when already primed).
    """
    key = (config.activities, config.all_threads)
    _hooks.at_fork_in_child("window", _note_fork_in_child)
    with _prime_lock:
        if key in _primed or foreign_profiler_active():
            return 0.0
        global _started_in_pid
        t0 = time.perf_counter()
        _started_in_pid = os.getpid()
        # first (it pays the first start): the tiny profile below then leaves torch's
        # profiler state as small as before, for the first sampled call
        with kineto_quiet():  # the process's first start, where kineto reads its log level
            _per_event[key] = measure_recording(config)
        prof = make_profiler(config)
        with recording(prof), torch.autograd.profiler.record_function("profkit.prime"):
            torch.ones(2, 2).add_(1)
        # import and run torch's parser once; a parse failure of this throwaway profile (the
        # first with_stack profile of a process can hold a mangled, non-UTF-8 event name) is
        # of no consequence: the expensive first start/stop is done
        with contextlib.suppress(Exception):
            prof.events()  # type: ignore[no-untyped-call]
        _primed.add(key)
        return time.perf_counter() - t0


def recording_cost(config: Config) -> float:
    """CPU seconds the profiler adds per recorded event to the thread it records (measured
    once per process by :func:`prime`; 0.0 before)."""
    return _per_event.get((config.activities, config.all_threads), 0.0)


class Window:
    """One capture: the profiler object and the root calls recorded under it."""

    __slots__ = (
        "__weakref__",
        "calls",
        "clobbered",
        "close_running",
        "closing",
        "config",
        "cut_reason",
        "deadline",
        "handed",
        "id",
        "keep",
        "keeper",
        "needed",
        "others",
        "owner",
        "owner_thread",
        "prof",
        "resident",
        "resumed_ns",
        "speculative",
        "started_ns",
        "stopped_refs",
    )

    def __init__(self, window_id: int, config: Config, speculative: int = 0) -> None:
        self.id = window_id
        self.config = config
        self.owner = threading.get_ident()
        self.owner_thread = threading.current_thread()
        #: a speculative window (``capture_slow``) records this many calls, with no warm-up,
        #: and exports only those that turn out slow
        self.speculative = speculative
        self.needed = speculative or config.warmup + config.window
        #: the calls that joined, in order; joining is one ``append`` (atomic), and the counts
        #: below are derived from it, so an exception landing anywhere leaves them consistent
        self.calls: list[CallRecord] = []
        self.prof: profile | None = None
        self.started_ns = 0
        self.stopped_refs = 0
        #: ``time.monotonic()`` past which the window is cut short at the next checkpoint
        self.deadline = time.monotonic() + config.max_window_s
        #: set when another profiler started on this window's thread (it empties ours)
        self.clobbered = False
        #: why the window is cut short when its deadline passes
        self.cut_reason = "max_window_s"
        #: root calls of other requests seen on this window's thread while it recorded
        self.others = 0
        #: set as the keeper begins to close it (once), and while that close runs
        self.closing = self.close_running = False
        #: queued for the export worker (set by the pipeline together with the queueing)
        self.handed = False
        #: the session's window owner that opened it (:class:`profkit._capture.keeper.WindowKeeper`)
        self.keeper: Any = None
        #: its resident session (``_capture/resident.py``), when it went on, what keeps it on
        self.resident: Any = None
        self.resumed_ns = 0
        self.keep: Any = None

    @property
    def in_flight(self) -> int:
        """Root calls of this window still running."""
        return sum(1 for c in self.calls if not c.done)

    @property
    def full(self) -> bool:
        return len(self.calls) >= self.needed

    @property
    def recorded(self) -> int:
        """Calls recorded for export (the ``warmup`` calls and released speculative ones are
        not)."""
        return sum(1 for c in self.calls if not c.warmup and c.policy.exported)

    def start(self, prof: profile | None = None, resident: Any = None) -> None:
        """Start the profiler on this thread: ``prof`` if given (built ahead), else a new one;
        or turn the collection of this thread's ``resident`` session on (no start).

        The window owns ``prof`` before it starts, so that an exception landing anywhere
        from here on (a signal's, even on the statement after the start) finds it in
        :meth:`ensure_stopped`; a start that fails leaves no profiler and no kineto state.
        """
        if resident is not None:  # collection on (one C call; the window owns prof first)
            self.started_ns = self.resumed_ns = time.time_ns()
            self.prof, self.resident = resident.prof, resident
            _unstopped[id(resident.prof)] = (resident.prof, False, self.owner_thread, self)
            toggle(resident.prof, True)
            return
        if prof is None:
            prof = make_profiler(self.config)
        self.started_ns = time.time_ns()
        global _started_in_pid
        _started_in_pid = os.getpid()
        self.prof = prof
        _unstopped[id(prof)] = (prof, self.config.all_threads, self.owner_thread, self)
        try:
            with ours(), hold_signals():  # no signal's exception inside torch's start
                start_profile(prof)
        except BaseException:  # a failed start, or a signal's exception right after it
            not_ours()  # (an exception on ours()'s own last line leaves it set)
            try:  # (a signal noted in the stop is raised at its end; what escapes: stop_leaked)
                retry_once(_force_stop, prof, self.config.all_threads, True)
            finally:
                self.prof = None
            raise

    def pause(self) -> None:
        """Turn collection off and give the profiler up, left on: a resident session's now."""
        if self.prof is not None:
            toggle(self.prof, False)
        _unstopped.pop(id(self.prof), None)
        self.prof = None

    def stop(self) -> None:
        """Stop the profiler (or ``keep`` keeps it on); the events stay unparsed until read."""
        if self.keep is not None and self.keep(self):
            return
        prof = self.prof
        if prof is not None and self.clobbered:  # torch's profiler here is the user's now:
            self.stopped_refs = self.stopped_refs or -1  # stopping "ours" would stop theirs
            _unstopped.pop(id(prof), None)
        if prof is not None and not self.stopped_refs:  # (stopped once: no second disable)
            try:
                with hold_signals():  # no signal's exception inside torch's stop
                    stop_profile(prof)
                    self.stopped_refs = -1  # stopped; counted below (a noted frame holds prof)
                    _unstopped.pop(id(prof), None)
                # the profile's references to itself plus this frame's: see release() (a
                # signal's exception raised as the hold ends leaves -1: it is not freed early)
                self.stopped_refs = sys.getrefcount(prof)
            finally:
                # a failed stop must not leave the process-wide flag set: we would skip forever
                if foreign_profiler_active() and not _still_enabled_here():
                    clear_profiler_flag()

    def ensure_stopped(self) -> None:
        """Stop the profiler if it still runs (a start or stop an exception cut short), and
        leave kineto no session half-started; keep the rest."""
        if self.prof is not None and not self.stopped_refs:  # (once more if cut short)
            retry_once(_force_stop, self.prof, self.config.all_threads, True)

    def discard(self) -> None:
        """Give the window up unread: its thread is gone (it exited, or this is a forked child).

        A thread-local profiler's state went with its thread (stopping it from another thread
        only logs torch warnings). An all-threads profiler is process-wide: it is still
        recording every thread and must be stopped here, or it records forever and crashes
        the interpreter's exit (unless a user's replaced it: never taken for leaked then)."""
        prof, self.prof = self.prof, None
        self.calls.clear()
        _unstopped.pop(id(prof), None)
        if prof is not None and not self.clobbered:
            _force_stop(prof, all_threads=self.config.all_threads)

    def read(self) -> WindowEvents:
        """The stopped window's events (on the export worker: parsing costs µs per event).

        Past ``max_events`` raw events (``with_stack``'s Python frames left out: they are
        not ops) a CPU profile keeps its earliest ``max_events`` (the calls are then
        exported as truncated); a profile that needs torch's own parser (device or memory
        records) is not read at all past ``max_events`` raw events, frames included.

        Raises:
            Unreadable: no profile (``no_profile``), another profiler started inside it
                (``foreign_profiler``), or too many events for torch's parser
                (``too_many_events``).
        """
        return read_events(self, recording_cost(self.config), read_cpu_events)

    def write_chrome_trace(self, path: str) -> None:
        """Write the stopped window's Chrome/Perfetto trace to ``path`` (torch's own writer)."""
        if self.prof is None:
            raise Unreadable("no_profile")
        self.prof.export_chrome_trace(path)

    def release(self) -> None:
        """Free the profile and its parsed events now, not at the next full GC collection.

        torch's parsed events link parents and children both ways, and the profile object
        refers to itself (bound methods in its action table), so all of it would otherwise
        wait for the cyclic collector; a full collection with torch loaded takes hundreds of
        ms holding the GIL. Detaching the inner profile and unlinking the events leaves no
        cycle around them, so reference counting frees them here. A profile that someone
        else still holds (more references than right after ``stop()``) is left intact.
        """
        prof, self.prof = self.prof, None
        self.calls.clear()
        _unstopped.pop(id(prof), None)  # (done with: one whose stop failed is not ours to stop)
        inner = getattr(prof, "profiler", None)
        if inner is None or sys.getrefcount(prof) > self.stopped_refs - 1:
            return
        prof.profiler = None  # type: ignore[union-attr]
        if isinstance(getattr(prof, "action_map", None), dict):
            prof.action_map = {}  # type: ignore[union-attr]  # bound methods of prof: a cycle
        for ev in getattr(inner, "_function_events", None) or ():
            ev.cpu_children = []
            ev.cpu_parent = None


def _still_enabled_here() -> bool:
    return profiler_enabled_here()


def _force_stop(prof: profile, all_threads: bool, finish: bool = False) -> None:
    """Stop what is left of a profiler we give up on: a half-done start, a stranded window.

    ``torch._C._autograd._profiler_enabled()`` sees only this thread's profiler, never an
    all-threads one (measured on torch 2.13), so an all-threads profile is stopped blindly; a
    stop of one that never started raises and is ignored. ``finish`` (on the profile's own
    thread, after a start or stop an exception cut short): a profile prepared and never
    disabled gets kineto's start and stop run once more (:func:`finish_interrupted_start`),
    so no prepared session is left for the next window to trip on. Signals are held
    throughout (:func:`profkit._compat.hold_signals`): one's exception is raised at the end.
    """
    with hold_signals():  # a signal's exception waits: none is lost in the suppressions
        inner = getattr(prof, "profiler", None)
        # looked at before the stop (an all-threads "stop" of a profile never enabled passes)
        disabled = (
            inner is None
            or not getattr(inner, "entered", False)
            or getattr(inner, "kineto_results", None) is not None
        )
        enabled_here = _still_enabled_here()
        with contextlib.suppress(Exception):  # the failed start is the error that gets reported
            if all_threads or enabled_here:
                stop_profile(prof)
        if finish and not disabled and (all_threads or not enabled_here):
            with contextlib.suppress(Exception), ours():
                if not _still_enabled_here():
                    finish_interrupted_start(inner)
        if foreign_profiler_active() and not _still_enabled_here():
            clear_profiler_flag()
        _unstopped.pop(id(prof), None)


def stop_resident(prof: profile) -> None:
    """Stop a resident session's profiler on its thread (elsewhere: only torch's flag is
    cleared), its recorded events unread and freed."""
    _force_stop(prof, False)
    prof.profiler = None


def stop_leaked(stats: Any) -> bool:
    """Stop what profkit started and no window holds any more, on this thread (or recording
    all threads): a second signal's exception landing inside the recovery from a first one
    (storms of timeouts) can leave a profiler on with its window gone, which would then be
    taken for someone else's for good and crash the exit. Called where the slot is ours (so
    no window is open) and a profiler is on; counted ``error_reasons["leaked_profiler"]``.
    True when one was stopped."""
    here = threading.current_thread()
    stopped = False
    for prof, every, thread, win in list(_unstopped.values()):
        if win.prof is not prof and (every or thread is here):  # (a window's own: not leaked)
            _force_stop(prof, every, True)  # (it leaves the registry there)
            stopped = True
            if stats is not None:  # (None: at exit)
                stats.error("leaked_profiler", None)
    return stopped
