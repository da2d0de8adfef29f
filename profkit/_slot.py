"""The process-wide window slot: at most one profkit window open at a time, in any session.

Two torch profilers running at once crash the process (pytorch#64795), so the slot is
module-global, not per session: an old session being replaced by ``configure()`` and the new
one share it. It holds the open window and the session that owns it (one place, read by the
hot path as ``SLOT.held``), and it frees a window whose owner can no longer close it: a
thread that ended with the window open, a forked child, the interpreter's exit.

Only the window's own thread can stop a thread-local profiler (a stop from another thread
loses the events and leaks torch's callbacks); that rule decides every path here.
"""

from __future__ import annotations

import os
import threading
import time
from typing import NamedTuple, Protocol

from ._deadline import Deadline
from ._errors import Stats, guard
from ._window import Window, foreign_profiler_active, on_foreign_start

__all__ = ["SLOT", "Held", "WindowOwner", "WindowSlot"]


class WindowOwner(Protocol):
    """What the slot needs from the session that opened a window."""

    stats: Stats

    def close_window(self, win: Window) -> None:
        """Stop the window on its own thread, hand it to export, then vacate the slot."""

    def discard_window(self, win: Window, reason: str) -> None:
        """Give the window up unread, count its calls as dropped, then vacate the slot."""

    def truncate(self, win: Window, reason: str) -> None:
        """Stop the window now, on its own thread, before its calls end; export what it has."""


class Held(NamedTuple):
    owner: WindowOwner
    window: Window


class _ThreadEndGuard:
    """Closes (and exports) the window still open on a thread when that thread ends.

    One lives in a ``threading.local`` of each thread that opened a window: CPython clears
    a thread's locals on that thread as it ends, before the C++ thread-locals holding
    torch's thread-local profiler state are destroyed. A profiler still enabled there makes
    torch warn ("Requested callback is not found", "Leaked callback handle") and the process
    crash at exit (measured, torch 2.13): a thread-per-request server with ``window`` > 1
    would otherwise end that way. It is made once per thread, never replaced, so that its
    finalizer runs only at the thread's end, never on a request.
    """

    __slots__ = ("slot",)

    def __init__(self, slot: WindowSlot) -> None:
        self.slot = slot

    def __del__(self) -> None:
        held = self.slot.held
        if held is None or held.window.in_flight:
            return  # closed already (the usual case), or a call still runs in it
        if held.window.owner != threading.get_ident():
            return  # not this thread's (or a forked child clearing the parent's threads)
        held.owner.close_window(held.window)  # guarded inside: a finalizer must not raise


class WindowSlot:
    """The lock that serialises windows process-wide, and the window that holds it."""

    def __init__(self) -> None:
        #: the claim on the slot: ``{0: (thread ident,)}`` while taken. ``dict.setdefault``
        #: takes it atomically, and unlike a lock a claim says whose it is, so a claim that an
        #: exception orphaned right after it was taken is recognised by its thread
        self._claims: dict[int, tuple[int]] = {}
        self._reclaim_lock = threading.Lock()
        self._thread_end = threading.local()
        #: the open window and its owner; None when the slot is free
        self.held: Held | None = None
        #: when a user's profiler began to start (0.0: none); no window opens meanwhile
        self.foreign_starting = 0.0
        #: since when the lock has been seen taken with no window in it (see acquire)
        self._empty_since = 0.0

    def acquire(self) -> bool:
        """Take the slot if it is free (or held by a thread that exited); never blocks."""
        if self._take():
            return True
        return self._reclaim_if_owner_exited() or self._reclaim_if_leaked()

    def _take(self) -> bool:
        me = threading.get_ident()
        mine = (me,)
        claim = self._claims.setdefault(0, mine)
        if claim is mine:
            self._empty_since = 0.0
            return True
        # a claim of this thread with no window in it: an exception (a signal handler's)
        # landed right after it was taken; this thread is not opening one now, so it is ours
        return claim[0] == me and self.held is None

    def _reclaim_if_leaked(self) -> bool:
        """Take back a claim left with no window for seconds by another thread.

        Opening a window takes milliseconds; a claim that has held no window for seconds was
        orphaned by an exception that landed right after it was taken.
        """
        if self.held is not None:
            self._empty_since = 0.0
            return False
        now = time.monotonic()
        if not self._empty_since:
            self._empty_since = now
            return False
        if now - self._empty_since < _LEAK_S or self.held is not None:
            return False
        self._empty_since = 0.0
        self._claims.pop(0, None)
        return self._take()

    def checkpoint(self) -> None:
        """A point profkit controls on this thread: cut a window past ``max_window_s`` short."""
        held = self.held
        if (
            held is not None
            and held.window.owner == threading.get_ident()
            and time.monotonic() > held.window.deadline
        ):
            held.owner.truncate(held.window, held.window.cut_reason)

    def may_open(self) -> bool:
        """No profiler of anyone else's is running or starting."""
        starting = self.foreign_starting
        if starting and time.monotonic() - starting < _FOREIGN_START_S:
            return False
        return not foreign_profiler_active()

    def occupy(self, owner: WindowOwner, win: Window) -> None:
        """Record the window that now holds the acquired slot, on the window's own thread."""
        self.held = Held(owner, win)
        if getattr(self._thread_end, "guard", None) is None:
            self._thread_end.guard = _ThreadEndGuard(self)

    def vacate(self, win: Window | None) -> None:
        """Free the slot (taken by ``acquire``) that ``win`` held, or that no window got."""
        held = self.held
        if held is not None and held.window is win:
            self.held = None
        self._claims.pop(0, None)

    def close_retired(self, current: WindowOwner) -> None:
        """An idle window of a replaced session closes on its thread's next root call."""
        held = self.held
        if held is None or held.owner is current:
            return
        win = held.window
        if win.owner_thread is threading.current_thread() and win.in_flight == 0:
            held.owner.close_window(win)

    def close_idle(self, owner: WindowOwner) -> None:
        """Let go of ``owner``'s window that waits for more calls (``window`` > 1), if any.

        On its own thread it closes now; if that thread has exited it is discarded now;
        otherwise that thread's next root call (under any session) closes it.
        """
        held = self.held
        if held is None or held.owner is not owner or held.window.in_flight:
            return  # none, or its running call closes it on exit (the session is inactive)
        win = held.window
        if win.owner_thread is threading.current_thread():
            owner.close_window(win)
        elif not win.owner_thread.is_alive() and self._reclaim_lock.acquire(blocking=False):
            try:
                if self.held is held:
                    owner.discard_window(win, "owner_exited")
            finally:
                self._reclaim_lock.release()

    def orphaned(self) -> None:
        """A root call on a thread when no session takes root calls (shut down, disabled):
        a window this thread still holds, idle, closes now (its calls, if any, are counted
        as dropped by the shut pipeline), instead of recording this thread for ever."""
        held = self.held
        if held is not None and held.window.owner == threading.get_ident():
            win = held.window
            if not win.in_flight:  # (one still running closes when it ends)
                with guard(held.owner.stats, "orphaned"):  # runs on the user's call: never raise
                    held.owner.close_window(win)

    def wait_for_other_thread(self, owner: WindowOwner, deadline: Deadline) -> None:
        """Wait while ``owner`` has calls in flight in a window on another thread.

        It polls: the request path that frees the slot takes no Python-level lock or
        condition (a signal's exception landing inside one would leave it taken).
        """
        while not deadline.passed:
            held = self.held
            if held is None or held.owner is not owner:
                return
            win = held.window
            if not win.in_flight or win.owner == threading.get_ident():
                return
            time.sleep(min(deadline.left(), _POLL_S))

    def _reclaim_if_owner_exited(self) -> bool:
        """Free a window whose thread exited with it open; True when the lock is then ours."""
        held = self.held
        if held is None or held.window.owner_thread.is_alive():
            return False
        if not self._reclaim_lock.acquire(blocking=False):
            return False
        try:
            if self.held is not held:
                return False
            held.owner.discard_window(held.window, "owner_exited")
        finally:
            self._reclaim_lock.release()
        return self._take()

    def stop_left_at_exit(self) -> None:
        """At interpreter exit, stop a profiler that profkit left running and would crash it.

        torch tears down a still-enabled profiler's state during exit, after its callbacks
        are gone, and the process dies with SIGSEGV (measured on torch 2.13: a thread-local
        profiler on the main thread, or an all-threads one started anywhere). Runs after the
        global session's shutdown; what remains is a window of a replaced session or one idle
        on another thread. A thread-local profiler on another live thread is left alone.
        """
        held = self.held
        if held is None:
            return
        win = held.window
        if not win.config.all_threads and win.owner_thread is not threading.current_thread():
            return
        if not self._reclaim_lock.acquire(blocking=False):
            return
        try:
            if self.held is held:
                held.owner.discard_window(win, "shutdown")
        finally:
            self._reclaim_lock.release()

    def after_fork_in_child(self) -> None:
        """Fresh locks; the parent's window, whose thread the child lacks, is given up."""
        held = self.held
        if held is not None and held.window.owner_thread is not threading.current_thread():
            # the window's thread does not exist in the child: nor does its profiler state,
            # but the process-wide "a profiler is running" flag was copied and would block us
            held.window.discard()
        self.__init__()  # type: ignore[misc]


#: longest a user's profiler start keeps windows shut before torch's own flag takes over
_FOREIGN_START_S = 5.0
#: how often a waiter looks whether the slot was freed
_POLL_S = 0.005
#: seconds a lock may stay taken with no window before it is taken back as leaked
_LEAK_S = 10.0

SLOT = WindowSlot()
os.register_at_fork(after_in_child=SLOT.after_fork_in_child)


def _before_foreign_start() -> None:
    """Someone else's torch profiler is about to start: make sure it overlaps no window.

    Two profilers at once crash the process. A window on another thread is asked to stop
    at its next checkpoint (its deadline is brought forward) and waited for; no new
    window opens meanwhile. A window on this very thread (the user's profiler inside a
    sampled call) cannot be waited for: torch empties it, so its calls are dropped
    (``foreign_profiler``).

    Raises:
        RuntimeError: the window did not close within ``max(5, 2 * max_window_s)`` s;
            starting the profiler anyway would crash the process.
    """
    SLOT.foreign_starting = time.monotonic()
    held = SLOT.held
    if held is None:
        return
    win = held.window
    if win.owner == threading.get_ident():
        win.clobbered = True
        return
    win.cut_reason = "foreign_profiler"
    win.deadline = 0.0  # stop at the next checkpoint
    limit = Deadline(max(5.0, 2 * win.config.max_window_s))
    while SLOT.held is not None and SLOT.held.window is win:
        if limit.passed:
            SLOT.foreign_starting = 0.0
            raise RuntimeError(
                "profkit: a sampled call on another thread still records a profiler "
                "window; starting a second torch profiler now would crash the process "
                "(see profkit's reliability docs, 'Your own profiler')"
            )
        time.sleep(_POLL_S)


def _after_foreign_start() -> None:
    """The foreign profiler is on (torch's flag now keeps new windows shut)."""
    SLOT.foreign_starting = 0.0


on_foreign_start(_before_foreign_start, _after_foreign_start)
