"""The one scope behind ``@profiled`` and ``region()``.

A context variable holds where the current context stands:

* ``None``: outside any profkit scope. The next scope is a *root call*: the only sampling point.
* ``_OFF``: inside an unsampled root call. Nested scopes cost one ``ContextVar.get``.
* an :class:`_Active`: inside a sampled call. Nested scopes are recorded and become
  ``record_function`` ranges, so they show up in the profile.

Off-sample, no torch function is called at all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from torch.autograd.profiler import record_function

from . import _errors
from ._model import CodeInfo
from ._window import CallRecord, ScopeRecord

__all__ = [
    "FRAME",
    "GLOBAL",
    "OFF",
    "Active",
    "ScopeHandle",
    "current_session",
    "enter",
    "exit_",
    "root_failed",
    "run_sync",
    "sampled_root",
]


class _Off:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<profkit unsampled>"


_OFF: Any = _Off()
OFF = _OFF  #: the frame value inside an unsampled root call


class Active:
    """Frame value inside a sampled call: the call and the index of the innermost scope."""

    __slots__ = ("call", "scope")

    def __init__(self, call: CallRecord, scope: int) -> None:
        self.call = call
        self.scope = scope


FRAME: ContextVar[Any] = ContextVar("profkit_frame", default=None)


class _Global:
    """Holder of the default session, so the hot path reads one attribute."""

    __slots__ = ("session",)

    def __init__(self) -> None:
        self.session: Any = None


GLOBAL = _Global()


def current_session() -> Any:
    return GLOBAL.session


class ScopeHandle:
    """What ``enter`` returns for a scope that did something and must be exited."""

    __slots__ = ("call", "record", "record_fn", "session", "token")

    def __init__(self) -> None:
        self.token: Any = None
        self.session: Any = None
        self.call: CallRecord | None = None
        self.record: ScopeRecord | None = None
        self.record_fn: Any = None


def root_failed(session: Any, exc: Exception) -> None:
    """``begin_root`` raised: count it; the call then runs as an unsampled root."""
    session.stats.error("begin_root", exc)
    if _errors.raise_internal:
        raise exc


def _begin_root(session: Any, label: str) -> CallRecord | None:
    try:
        call: CallRecord | None = session.begin_root(label)
    except Exception as exc:
        root_failed(session, exc)
        return None
    return call


def enter(label: str, attributes: dict[str, Any], code: CodeInfo | None) -> ScopeHandle | None:
    """Enter a scope in the current context. None means nothing to undo."""
    frame = FRAME.get()
    if frame is None:
        session = GLOBAL.session
        if session is None or not session.active:
            return None
        call = _begin_root(session, label)
        if call is None:
            handle = ScopeHandle()
            handle.token = FRAME.set(_OFF)
            return handle
        return sampled_root(session, call, label, attributes, code)
    if frame is _OFF or frame.call.done:
        return None
    handle = ScopeHandle()
    _start_scope(handle, frame.call, frame.scope, label, attributes, code)
    return handle


def sampled_root(
    session: Any, call: CallRecord, label: str, attributes: dict[str, Any], code: CodeInfo | None
) -> ScopeHandle:
    """The handle of a root call that ``session.begin_root`` put under the profiler."""
    handle = ScopeHandle()
    handle.session = session
    handle.call = call
    _start_scope(handle, call, -1, label, attributes, code)
    return handle


def _start_scope(
    handle: ScopeHandle,
    call: CallRecord,
    parent: int,
    label: str,
    attributes: dict[str, Any],
    code: CodeInfo | None,
) -> None:
    record = ScopeRecord(label, parent, attributes, code, threading.get_ident(), time.time_ns())
    index = len(call.scopes)
    call.scopes.append(record)
    handle.record = record
    handle.token = FRAME.set(Active(call, index))
    try:
        rf = record_function(label)
        rf.__enter__()  # type: ignore[no-untyped-call]
        handle.record_fn = rf
    except Exception as exc:  # a label that cannot be recorded still leaves a Python-timed scope
        _count_error(handle, "record_function", exc)


def _count_error(handle: ScopeHandle, reason: str, exc: Exception) -> None:
    session = handle.session or GLOBAL.session
    if session is not None:
        session.stats.error(reason, exc)
    if _errors.raise_internal:
        raise exc


def exit_(handle: ScopeHandle, error: BaseException | None) -> None:
    """Leave a scope entered by :func:`enter`: label closed, frame restored, window ended."""
    try:
        if handle.record_fn is not None:
            try:
                handle.record_fn.__exit__(None, None, None)
            except Exception as exc:
                _count_error(handle, "record_function", exc)
        if handle.record is not None:
            handle.record.end_ns = time.time_ns()
    finally:
        if handle.token is not None:
            # exited in another context (a generator resumed elsewhere): nothing to restore
            try:  # noqa: SIM105  # contextlib.suppress builds an object per scope exit
                FRAME.reset(handle.token)
            except ValueError:
                pass
        if handle.session is not None and handle.call is not None:
            _end_root(handle.session, handle.call, error)


def _end_root(session: Any, call: CallRecord, error: BaseException | None) -> None:
    try:
        session.end_root(call, error)
    except Exception as exc:
        session.stats.error("end_root", exc)
        if _errors.raise_internal:
            raise


def run_sync(
    label: str,
    attributes: dict[str, Any],
    code: CodeInfo | None,
    fn: Callable[..., Any],
    args: Any,
    kwargs: Any,
) -> Any:
    """Run ``fn`` inside a scope. The plain-function decorator inlines the off-sample part.

    An unsampled root call sets the frame to "unsampled" and allocates nothing: a sync call
    starts and ends in one context, so the token is reset without a guard.
    """
    frame = FRAME.get()
    if frame is None:
        session = GLOBAL.session
        if session is None or not session.active:
            return fn(*args, **kwargs)
        try:
            call = session.begin_root(label)
        except Exception as exc:
            root_failed(session, exc)
            call = None
        if call is None:
            token = FRAME.set(_OFF)
            try:
                return fn(*args, **kwargs)
            finally:
                FRAME.reset(token)
        handle = sampled_root(session, call, label, attributes, code)
    elif frame is _OFF or frame.call.done:
        return fn(*args, **kwargs)
    else:
        handle = ScopeHandle()
        _start_scope(handle, frame.call, frame.scope, label, attributes, code)
    error: BaseException | None = None
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:
        error = exc
        raise
    finally:
        exit_(handle, error)
