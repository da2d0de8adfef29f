"""The one scope behind ``@profiled`` and ``region()``.

A context variable holds where the current context stands:

* ``None``: outside any profkit scope. The next scope is a *root call*: the only sampling point.
* ``OFF``: inside an unsampled root call. Nested scopes cost one ``ContextVar.get``.
* an :class:`Active`: inside a sampled call. Nested scopes are recorded and become
  ``record_function`` ranges, so they show up in the profile.

:func:`enter` / :func:`exit_` are the scope, for every kind of caller (``region``, coroutines,
generators). :func:`sync_runner` is the same logic for a synchronous call, inlined once for
the hot path (an off-sample call then runs no other Python function but ``begin_root``).
:class:`Stepped` keeps a scope open across the steps of a generator or async generator.
Off-sample, no torch function is called at all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import Any

from torch.autograd.profiler import record_function

from . import _errors
from ._model import CodeInfo
from ._records import CallRecord, ScopeRecord
from ._text import escape

__all__ = [
    "FRAME",
    "GLOBAL",
    "OFF",
    "Active",
    "ScopeHandle",
    "Stepped",
    "enter",
    "exit_",
    "sync_runner",
]


class _Off:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<profkit unsampled>"


#: the frame value inside an unsampled root call
OFF: Any = _Off()


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


class ScopeHandle:
    """A scope inside a sampled call: what :func:`exit_` must close."""

    __slots__ = ("call", "record", "record_fn", "session", "token")

    def __init__(self, call: CallRecord, session: Any) -> None:
        self.token: Any = None
        self.session = session  # set for the root call only: its exit ends the root call
        self.call = call
        self.record: ScopeRecord | None = None
        self.record_fn: Any = None


#: what :func:`enter` returns: a sampled scope, the token of an unsampled root, or nothing
Entered = ScopeHandle | Token[Any] | None


def _begin_root(session: Any, label: str) -> CallRecord | None:
    """``session.begin_root`` with its failures counted: the call then runs unsampled."""
    try:
        call: CallRecord | None = session.begin_root(label)
    except Exception as exc:
        session.stats.error("begin_root", exc)
        if _errors.raise_internal:
            raise
        return None
    return call


def enter(label: str, attributes: dict[str, Any], code: CodeInfo | None) -> Entered:
    """Enter a scope in the current context; pass what it returns to :func:`exit_`."""
    frame = FRAME.get()
    if frame is None:
        session = GLOBAL.session
        if session is None or not session.active:
            return None
        call = _begin_root(session, label)
        if call is None:
            return FRAME.set(OFF)
        return _open(call, session, -1, label, attributes, code)
    if frame is OFF or frame.call.done:
        return None
    return _open(frame.call, None, frame.scope, label, attributes, code)


def _open(
    call: CallRecord,
    session: Any,
    parent: int,
    label: str,
    attributes: dict[str, Any],
    code: CodeInfo | None,
) -> ScopeHandle:
    """Record a scope of a sampled call and open its ``record_function`` range."""
    label = escape(label)  # torch cannot record a lone surrogate; the summary matches on it
    handle = ScopeHandle(call, session)
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
        _count_error(session, "record_function", exc)
    return handle


def _count_error(session: Any, reason: str, exc: Exception) -> None:
    session = session or GLOBAL.session
    if session is not None:
        session.stats.error(reason, exc)
    if _errors.raise_internal:
        raise exc


def exit_(entered: Entered, error: BaseException | None) -> None:
    """Leave a scope entered by :func:`enter`: label closed, frame restored, root call ended."""
    if entered is None:
        return
    if type(entered) is Token:
        _reset(entered)
        return
    assert isinstance(entered, ScopeHandle)
    handle = entered
    try:
        if handle.record_fn is not None:
            try:
                handle.record_fn.__exit__(None, None, None)
            except Exception as exc:
                _count_error(handle.session, "record_function", exc)
        if handle.record is not None:
            handle.record.end_ns = time.time_ns()
    finally:
        if handle.token is not None:
            _reset(handle.token)
        if handle.session is not None:
            _end_root(handle.session, handle.call, error)


def _reset(token: Token[Any]) -> None:
    # a scope exited in another context (a generator resumed elsewhere): nothing to restore
    try:  # noqa: SIM105  # contextlib.suppress builds an object per scope exit
        FRAME.reset(token)
    except ValueError:
        pass


def _end_root(session: Any, call: CallRecord, error: BaseException | None) -> None:
    try:
        session.end_root(call, error)
    except Exception as exc:
        session.stats.error("end_root", exc)
        if _errors.raise_internal:
            raise


def sync_runner(
    label: str, attributes: dict[str, Any], code: CodeInfo | None
) -> Callable[[Callable[..., Any], Any, Any], Any]:
    """``run(fn, args, kwargs)`` calls ``fn`` in a scope: :func:`enter` and :func:`exit_`, inlined.

    An unsampled root call sets the frame to ``OFF`` and allocates nothing: a synchronous
    call starts and ends in one context, so the token is reset without a guard.
    """

    def run(fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        frame = FRAME.get()
        if frame is None:
            session = GLOBAL.session
            if session is None or not session.active:
                return fn(*args, **kwargs)
            call = _begin_root(session, label)
            if call is None:
                token = FRAME.set(OFF)
                try:
                    return fn(*args, **kwargs)
                finally:
                    FRAME.reset(token)
            handle = _open(call, session, -1, label, attributes, code)
        elif frame is OFF or frame.call.done:
            return fn(*args, **kwargs)
        else:
            handle = _open(frame.call, None, frame.scope, label, attributes, code)
        error: BaseException | None = None
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            error = exc
            raise
        finally:
            exit_(handle, error)

    return run


class Stepped:
    """A scope held open across the steps of a generator: its frame is set only per step.

    The scope is entered at the first step; each step runs with the scope's frame set (so
    scopes inside the generator nest under it) and restores the caller's afterwards.
    """

    __slots__ = ("_entered", "_frame", "_started", "attributes", "code", "label")

    def __init__(self, label: str, attributes: dict[str, Any], code: CodeInfo | None) -> None:
        self.label = label
        self.attributes = attributes
        self.code = code
        self._started = False
        self._entered: Entered = None
        self._frame: Any = None

    def step_in(self) -> Token[Any] | None:
        """Before a step: enter the scope on the first one, then set its frame."""
        if not self._started:
            self._started = True
            entered = enter(self.label, self.attributes, self.code)
            if entered is None:
                return None
            self._frame = FRAME.get()  # OFF (an unsampled root) or the scope's Active
            if isinstance(entered, ScopeHandle):
                _reset(entered.token)
                entered.token = None
                self._entered = entered
            else:
                _reset(entered)
        return FRAME.set(self._frame) if self._frame is not None else None

    def step_out(self, token: Token[Any] | None) -> None:
        """After a step: the caller's frame again."""
        if token is not None:
            _reset(token)

    def finish(self, error: BaseException | None) -> None:
        """The generator is done (returned, raised or closed): end the scope."""
        entered, self._entered = self._entered, None  # once, however the generator ended
        self._frame = None
        if entered is not None:
            exit_(entered, error if not isinstance(error, GeneratorExit) else None)
