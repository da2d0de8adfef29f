"""Undoing a root or nested scope whose entry or exit a signal's exception cut short, and
ending a root call (:mod:`profkit._label.scope` and the batch call them; no hot path here).

The frame is restored by value, never from a token the exception may have kept from being
stored: each function here reads what the frame says happened and undoes that much.
"""

from __future__ import annotations

import threading
from typing import Any

from .. import _errors
from .._capture.slot import SLOT
from .._records import CallRecord
from .frames import FRAME, GLOBAL, Active

__all__ = ["_abandoned", "_abort_nested", "_abort_root", "_end_root", "undo_enter"]


def _end_root(session: Any, call: CallRecord, error: BaseException | None) -> None:
    call.done = True  # first: whatever happens below, the call no longer holds its window
    try:
        try:
            failure = call.close_scopes()  # scopes an interrupted exit left open
        finally:
            session.end_root(call, error)
        if failure is not None:
            raise failure
    except Exception as exc:
        _errors.internal(session.stats, "end_root", exc)


def _abort_root(call: CallRecord | None, session: Any, error: BaseException | None) -> None:
    """Undo a root call whose entry was interrupted, from what the frame says happened."""
    frame = FRAME.get()
    FRAME.set(None)
    if call is None:  # not profiled, or the decision was cut short: the frame may know
        call = frame.call if isinstance(frame, Active) else None
    if call is not None:
        _end_root(session, call, error)
    elif session is not None and SLOT.held is not None:
        _abandoned(session, error)


def _abandoned(session: Any, error: BaseException | None) -> None:
    """End the calls a cut-short decision left behind: a signal's exception landed after a
    call joined a window on this thread, before the scope got its record (none of its scopes
    was entered). Without this, the window would wait for them until ``max_window_s``."""
    win = SLOT.held
    if win is None or win.owner != threading.get_ident() or win.keeper is not session.keeper:
        return
    for call in list(win.calls):
        if not call.done and not call.scopes:
            _end_root(session, call, error)


def _abort_nested(frame: Active) -> None:
    """Undo a nested scope whose entry was interrupted: close what it recorded, if anything."""
    now = FRAME.get()
    FRAME.set(frame)
    if isinstance(now, Active) and now is not frame and now.call is frame.call:
        frame.call.scopes[now.scope].close()


def undo_enter(outer: Any, error: BaseException) -> None:
    """An exception (a signal's) landed after :func:`enter` set the frame, before its caller
    could keep what it returned: undo that scope, from what the frame says it was. Without
    this, the frame would stay ``OFF`` in this context and no later call would be a root."""
    if FRAME.get() is outer:
        return  # enter() changed nothing, or undid its own part
    if isinstance(outer, Active) and not outer.call.done:
        _abort_nested(outer)
    else:
        _abort_root(None, GLOBAL.session, error)
