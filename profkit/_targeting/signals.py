"""``trigger_signal``: a signal on which the process profiles its next root call.

``configure(trigger_signal="SIGUSR1")`` installs a handler (on the main thread: Python allows
no other) that adds one trigger for any label, as ``profkit.trigger(1)`` does. At most one
such handler exists per process; this module keeps what it replaced.

- **Only signals nobody else owns**: SIGUSR1, SIGUSR2 and the real-time range (the settings
  refuse the others, :func:`profkit._settings.signal_number` names them). SIGTERM, SIGINT,
  SIGSEGV, SIGCHLD... mean something to the process, its manager or the runtime.
- **Chained, not replaced.** A handler the application installed from Python before is called
  after profkit's trigger, with the same arguments; what it raises is the application's and
  reaches it. A handler not installed from Python (``signal.getsignal`` says None: C code,
  ``faulthandler.register``) cannot be chained nor put back: profkit leaves it alone, installs
  nothing and counts an internal error (logged once). ``SIG_DFL`` and ``SIG_IGN`` are
  replaced (for ``SIGUSR1`` the default would end the process).
- **Put back** on ``shutdown()``, or on a ``configure()`` with another signal or none, only
  while profkit's handler is still the installed one. A ``configure()`` with the same signal
  keeps the handler and points it at the new session, so it never chains to itself.
- **Off the main thread** ``signal.signal`` raises: the configure or shutdown goes on, an
  internal error is counted, and a handler that could not be removed does nothing.
- **The handler does almost nothing** and never raises itself: it runs between two bytecodes
  of whatever the main thread was running, possibly profkit holding a lock, so it only bumps
  :meth:`profkit._sampling.Triggered.signalled`, a lock-free counter.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

from .._errors import foreign
from .._settings import signal_number
from .._stats import Stats

__all__ = ["apply"]


class _Signalled(Protocol):
    def signalled(self) -> None: ...


class _Target(Protocol):
    """The session a signal triggers (read at each signal: a fork replaces its triggers)."""

    @property
    def triggered(self) -> _Signalled: ...


class _Installed:
    """profkit's handler for one signal, and the handler it replaced."""

    def __init__(self, signum: int, previous: Any, target: _Target) -> None:
        self.signum = signum
        self.previous = previous
        self.target: _Target | None = target
        self.handler = _handler_for(self)

    def in_place(self) -> bool:
        return signal.getsignal(self.signum) is self.handler


class _State:
    installed: _Installed | None = None


_state = _State()


def _handler_for(box: _Installed) -> Callable[[int, FrameType | None], None]:
    def profkit_trigger_signal(signum: int, frame: FrameType | None) -> None:
        # a plain function: profkit._errors.foreign() knows its code, so an exception the
        # chained handler raises while profkit's own code runs is passed to the application
        target = box.target
        if target is not None:
            # nothing of profkit's may leave its handler; a try costs nothing (no
            # contextlib.suppress: no object to build between two bytecodes of the app)
            try:
                target.triggered.signalled()
            except Exception as exc:
                if foreign(exc, below=True):  # another handler's, run inside this one: theirs
                    raise
        previous = box.previous
        if callable(previous):
            previous(signum, frame)

    return profkit_trigger_signal


def apply(name: str | None, target: _Target | None, stats: Stats) -> None:
    """Make ``name`` (or no signal) trigger ``target``; from configure() and shutdown()."""
    # a name the settings accepted: SIGUSR1, SIGUSR2 or a real-time signal ("SIGRTMIN+3")
    signum = signal_number(name) if target is not None else None
    old = _state.installed
    if old is not None:
        old.target = None  # first: whatever happens next, the old session gets no trigger
        if old.in_place():
            if old.signum == signum:
                old.target = target  # the same signal: same handler, new session
                return
            if not _set(old.signum, old.previous, stats):
                return  # still there, inert; a later call on the main thread removes it
        _state.installed = None
    if signum is None or target is None:
        return
    previous = signal.getsignal(signum)
    if previous is None:
        stats.error(
            "trigger_signal",
            RuntimeError(
                f"{name} has a handler that was not installed from Python; profkit leaves it "
                "alone and installs no trigger on it"
            ),
        )
        return
    installed = _Installed(signum, previous, target)
    if _set(signum, installed.handler, stats):
        _state.installed = installed


def _set(signum: int, handler: Any, stats: Stats) -> bool:
    try:
        signal.signal(signum, handler)
    except (ValueError, OSError) as exc:  # not the main thread; a signal nobody may catch
        stats.error("trigger_signal", exc)
        return False
    return True
