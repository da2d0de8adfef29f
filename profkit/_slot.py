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
import weakref
from typing import NamedTuple, Protocol

from ._deadline import Deadline
from ._window import Window

__all__ = ["SLOT", "Held", "WindowOwner", "WindowSlot"]


class WindowOwner(Protocol):
    """What the slot needs from the session that opened a window."""

    def close_window(self, win: Window) -> None:
        """Stop the window on its own thread, hand it to export, then vacate the slot."""

    def discard_window(self, win: Window, reason: str) -> None:
        """Give the window up unread, count its calls as dropped, then vacate the slot."""


class Held(NamedTuple):
    owner: WindowOwner
    window: Window


class _ThreadEndGuard:
    """Closes (and exports) the window still open on a thread when that thread ends.

    It lives in a ``threading.local``: CPython clears a thread's locals on that thread as it
    ends, before the C++ thread-locals holding torch's thread-local profiler state are
    destroyed. A profiler still enabled there makes torch warn ("Requested callback is not
    found", "Leaked callback handle") and the process crash at exit (measured, torch 2.13):
    a thread-per-request server with ``window`` > 1 would otherwise end that way.
    """

    __slots__ = ("slot", "window")

    def __init__(self, slot: WindowSlot, win: Window) -> None:
        self.slot = slot
        self.window = weakref.ref(win)

    def __del__(self) -> None:
        win = self.window()
        held = self.slot.held
        if win is None or held is None or held.window is not win or win.in_flight:
            return  # closed already (the usual case), or a call still runs in it
        if win.owner != threading.get_ident():
            return  # not its thread (a forked child clearing the parent's threads)
        held.owner.close_window(win)  # guarded inside: a finalizer must not raise


class WindowSlot:
    """The lock that serialises windows process-wide, and the window that holds it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reclaim_lock = threading.Lock()
        self._vacated = threading.Condition()
        self._thread_end = threading.local()
        #: the open window and its owner; None when the slot is free
        self.held: Held | None = None

    def acquire(self) -> bool:
        """Take the slot if it is free (or held by a thread that exited); never blocks."""
        return self._lock.acquire(blocking=False) or self._reclaim_if_owner_exited()

    def occupy(self, owner: WindowOwner, win: Window) -> None:
        """Record the window that now holds the acquired slot, on the window's own thread."""
        self.held = Held(owner, win)
        self._thread_end.guard = _ThreadEndGuard(self, win)

    def vacate(self, win: Window | None = None) -> None:
        """Free the slot (taken by ``acquire``) that ``win`` held, or that no window got."""
        held = self.held
        if held is not None and held.window is win:
            self.held = None
        self._lock.release()
        with self._vacated:
            self._vacated.notify_all()

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

    def wait_for_other_thread(self, owner: WindowOwner, deadline: Deadline) -> None:
        """Wait while ``owner`` has calls in flight in a window on another thread."""
        with self._vacated:
            while not deadline.passed:
                held = self.held
                if held is None or held.owner is not owner:
                    return
                win = held.window
                if not win.in_flight or win.owner == threading.get_ident():
                    return
                self._vacated.wait(min(deadline.left(), 0.05))

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
        return self._lock.acquire(blocking=False)

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


SLOT = WindowSlot()
os.register_at_fork(after_in_child=SLOT.after_fork_in_child)
