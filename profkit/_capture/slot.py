"""The process-wide window slot: at most one profkit window at a time, in any session.

Two torch profilers running at once crash the process (pytorch#64795), so the slot is
module-global, not per session: an old session being replaced by ``configure()`` and the new
one share it. It only serialises. What happens to a window (open, join, cut short, close,
discard) is the window owner's (:mod:`profkit._capture.keeper`), the one module that does it.

The slot is visible from the instant a window starts starting: a claim (``claimed``) is
taken before the profiler is built and started, and the hook that runs before anyone else's
profiler starts waits on the claim, not only on the window it later holds.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .window import Window

__all__ = ["SLOT", "WindowSlot"]

#: seconds a claim may stay taken with no window before it is taken back as leaked
_LEAK_S = 10.0


class WindowSlot:
    """The claim that serialises windows process-wide, and the window that holds it."""

    def __init__(self) -> None:
        #: the claim on the slot: ``{0: (thread ident,)}`` while taken. ``dict.setdefault``
        #: takes it atomically, and unlike a lock a claim says whose it is, so a claim that an
        #: exception orphaned right after it was taken is recognised by its thread
        self._claims: dict[int, tuple[int]] = {}
        #: the open window; None when the slot is free or a window is still starting
        self.held: Window | None = None
        #: when a user's profiler began to start (0.0: none); no window opens meanwhile
        self.foreign_starting = 0.0
        #: since when the claim has been seen taken with no window in it (see acquire)
        self._empty_since = 0.0
        #: taken by whoever frees a window on behalf of a thread that cannot (it exited)
        self.reclaim_lock = threading.Lock()
        #: the resident session (:mod:`profkit._capture.resident`) keeping its thread's claim
        #: between windows; None when there is none
        self.resident: Any = None

    @property
    def claimed(self) -> bool:
        """Whether a window holds the slot or is starting (claimed, not yet held)."""
        return bool(self._claims) or self.held is not None

    def busy(self) -> bool:
        """Whether a window holds the slot or is starting (a resident session between windows
        is not: asked, it steps aside)."""
        return self.held is not None or (bool(self._claims) and self.resident is None)

    def acquire(self) -> bool:
        """Take the slot if it is free; never blocks. A claim orphaned with no window for
        seconds (an exception landed right after it was taken) is taken back."""
        if self._take():
            return True
        return self._reclaim_if_leaked()

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
        if self.resident is not None:  # kept by a resident session: asked to step aside
            return bool(self.resident.ask()) and self._take()
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

    def occupy(self, win: Window) -> None:
        """Record the window that now holds the claimed slot (on a resident session, if any)."""
        self.held = win
        self.resident = None

    def vacate(self, win: Window | None) -> None:
        """Free the slot that ``win`` held, or this thread's claim that no window got. A slot
        another window holds now (a signal handler's call, nested in ``win``'s close, opened
        it), or another thread's claim, is left alone."""
        if win is not None and self.held is win:
            self.held = None
            if self.resident is None:  # (else kept: the window's profiler stays resident)
                self._claims.pop(0, None)
        elif (
            self.held is None
            and self.resident is None
            and self._claims.get(0, (0,))[0] == threading.get_ident()
        ):
            self._claims.pop(0, None)

    def drop_claim(self) -> None:
        """Free the claim of a resident session whose thread is gone (nothing to stop)."""
        self._claims.pop(0, None)

    def reset(self) -> None:
        """Fresh state (a forked child: the parent's claim and window are not its own)."""
        self.__init__()  # type: ignore[misc]


SLOT = WindowSlot()
