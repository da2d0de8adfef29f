"""The one scope behind ``@profiled`` and ``region()``.

A context variable holds where the current context stands:

* ``None``: outside any profkit scope. The next scope is a *root call*: the only sampling point.
* ``OFF``: inside an unsampled root call. Nested scopes cost one ``ContextVar.get``.
* an :class:`Active`: inside a sampled call. Nested scopes are recorded and become
  ``record_function`` ranges, so they show up in the profile.

:func:`enter` / :func:`exit_` are the scope, for every kind of caller (``region``, coroutines,
generators). :func:`sync_call` is the same logic for a synchronous call, inlined once for
the hot path (an off-sample call then runs no other Python function than ``begin_root``
and the compiler check that makes it nothing under ``torch.compile``; no torch function).
:class:`profkit._label.drivers.Stepped` keeps a scope open across a generator's steps.

A signal handler's exception (a SIGALRM timeout) can land on any bytecode, here too: the
frame is restored by value, never from a token the exception may have kept from being
stored; every step that changes state runs inside the ``try`` that undoes it; an exception
that is not profkit's always propagates (:func:`profkit._errors.foreign`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .. import _errors
from .._capture.decide import CONTROLLED, PROFILED, STAGED, TIMED
from .._capture.decide import OFF as NOT_PROFILED
from .._capture.keeper import checkpoint, orphaned
from .._capture.loops import arm as arm_loop
from .._capture.slot import SLOT
from .._compat import range_enter
from .._model import CodeInfo
from .._overhead import Control
from .._records import CallRecord, Policy, ScopeRecord
from .._targeting.slow import Timed, sched_ns
from .._targeting.stages import Stages
from .._text import escape
from . import frames
from .compiler import compiled_away, compiling
from .frames import GLOBAL, OFF, Active
from .offcall import OffCall
from .owner import left_behind
from .undo import _abandoned, _abort_nested, _abort_root, _end_root, undo_enter

#: bound here by assignment, not by ``from .frames import``: CPython 3.11 compiles a method
#: call on an imported name as an attribute load (``FRAME.get()`` built a bound method on
#: every root call, ~60 ns: region() roots 1.09x slower in bench/compare.py)
FRAME = frames.FRAME
_now = time.perf_counter_ns

__all__ = [
    "FRAME", "GLOBAL", "OFF", "Active", "OffCall", "enter", "exit_", "sync_call", "undo_enter",
]  # fmt: skip


#: the arguments of a range: none (``range_enter(label, None)``)
_NO_ARGS = (None,)


def _open(
    call: CallRecord,
    parent: Active | None,
    session: Any,
    label: str,
    attributes: dict[str, Any],
    code: CodeInfo | None,
) -> Active:
    """Record a scope of a sampled call, make it the frame, open its ``record_function``."""
    label = escape(label)  # torch cannot record a lone surrogate; the summary matches on it
    record = ScopeRecord(
        label,
        parent.scope if parent is not None else -1,
        attributes,
        code,
        threading.get_ident(),
        time.time_ns(),
    )
    active = Active(call, len(call.scopes), parent, session)
    call.scopes.append(record)
    FRAME.set(active)
    try:
        checkpoint()
    except RecursionError:  # no stack left here (from now on, none raises out of _open)
        return active
    if call.stopped:
        return active  # the checkpoint just cut the window short: nothing to record
    if parent is None:
        try:
            arm_loop(call)
        except Exception as exc:  # (a loop whose call_later fails: cut at the next call)
            _count(session, "loop_timer", exc)
    try:
        # the range is opened and kept in one C step (``extend`` over ``map``: no Python
        # code between torch's enter op and the list that holds its handle), so that no
        # signal's exception can drop an open range: see ScopeRecord.close
        box: list[Any] = []
        record.rf = box
        box.extend(map(range_enter, (label,), _NO_ARGS))
        if parent is None:  # the root's range has started (a profiler's start stalls there)
            call.entered_ns = time.time_ns()
            if call.policy is Policy.SPECULATIVE:  # its thread's CPU and waits from here on
                call.tid = threading.get_native_id()
                call.sched_ns = sched_ns(call.tid)
    except RecursionError:  # no stack left for the range here: the scope stays Python-timed
        pass
    except Exception as exc:  # a label that cannot be recorded still leaves a Python-timed scope
        _count(session, "record_function", exc)
    return active


def _count(session: Any, reason: str, exc: Exception) -> None:
    session = session or GLOBAL.session
    if session is not None:
        _errors.internal(session.stats, reason, exc)
    elif _errors.foreign(exc) or _errors.raise_internal:
        raise exc


def enter(
    label: str,
    attributes: dict[str, Any],
    code: CodeInfo | None,
    spec: bool = True,
    sync: bool = True,
    off: Any = OFF,
) -> Any:
    """Enter a scope in the current context; pass what it returns to :func:`exit_`
    (``sync=False``: a coroutine's or a generator's scope, see ``Decider.decide``).

    ``off`` is the frame of the call if it is an unsampled root, and what is returned then
    (``OFF``, or a coroutine root's own :class:`OffCall`).

    Returns None (nothing to undo), ``OFF``, a :class:`Timed`, a :class:`Control`, a
    :class:`Stages` or a stage's tuple (unsampled) or an :class:`Active`.
    """
    frame = FRAME.get()
    if frame is None or (frame is not OFF and frame.call.done):  # a stale frame: a root too
        session = GLOBAL.session
        if session is None or not session.active:
            if SLOT.held is not None:  # a window this thread still holds closes
                orphaned()
            return None
        call = None
        try:
            FRAME.set(off)
            decision = NOT_PROFILED
            try:  # a failing begin_root is counted; the call then runs unsampled
                decision = (
                    session.begin_root(label, spec)
                    if sync
                    else session.begin_root(label, spec, False)
                )
            except Exception as exc:
                _errors.internal(session.stats, "begin_root", exc)
            if decision is NOT_PROFILED:
                return off
            kind, what = decision
            if kind is STAGED:  # capture_slow: unprofiled, timed with its regions
                what.attributes, what.code = attributes, code
                FRAME.set(what)
                return what
            if kind is TIMED:  # metrics: unprofiled, timed; the frame is OFF
                return Timed(session.timed, label, what)
            if kind is CONTROLLED:  # unprofiled, timed for its label's baseline
                return what
            call = what
            return _open(call, None, session, label, attributes, code)
        except BaseException as exc:
            _abort_root(call, session, exc)
            raise
    if frame is OFF:
        return None
    if frame.__class__ is Stages:  # in an unprofiled root under capture_slow: a stage,
        return (frame, label, attributes, code, _now())  # a tuple (made in C), see exit_
    if frame.__class__ is Active and frame.owner is not None and left_behind(frame):
        return enter(label, attributes, code, spec, sync, off)  # (reset: now a root call)
    if frame.call.stopped:
        return None
    try:
        return _open(frame.call, frame, None, label, attributes, code)
    except BaseException:
        _abort_nested(frame)
        raise


def exit_(entered: Any, error: BaseException | None, *, restore: bool = True) -> None:
    """Leave a scope entered by :func:`enter`: range closed, frame restored, root call ended.

    ``restore=False`` leaves the frame alone (a generator's scope, whose frame is set only
    while it runs, ends in whatever context finishes it).
    """
    if entered is None:
        return
    if entered is OFF:
        if restore:
            FRAME.set(None)
        return
    if entered.__class__ is Timed or entered.__class__ is Control:  # an unprofiled root, timed
        FRAME.set(None) if restore else None
        entered.end()
        return
    if entered.__class__ is tuple:  # a stage of an unprofiled root (capture_slow): ended
        stages, label, attributes, code, t0 = entered
        stages.append((label, attributes, code, t0, _now()))
        return
    if entered.__class__ is Stages:  # an unprofiled root with its regions (capture_slow)
        return entered.leave(FRAME.set if restore else None, error)
    call = entered.call
    try:
        scope = call.scopes[entered.scope]
        if error is not None and not isinstance(error, GeneratorExit):  # (a closed stream)
            scope.error = error
        failure = scope.close()
        if failure is not None:
            _count(entered.session, "record_function", failure)
    finally:
        if restore:
            FRAME.set(entered.parent)
        if entered.session is not None:
            _end_root(entered.session, call, error)
        elif not call.stopped:
            checkpoint()


def _leave_root(
    entered: Active | None, call: CallRecord, session: Any, error: BaseException | None
) -> None:
    """End a sampled root call, however far its entry got (idempotent: may run twice)."""
    if entered is not None:
        exit_(entered, error)
    else:
        _abort_root(call, session, error)


def _leave_nested(entered: Active | None, frame: Active, error: BaseException | None) -> None:
    """Leave a nested scope, however far its entry got (idempotent: may run twice)."""
    if entered is not None:
        exit_(entered, error)
    else:
        _abort_nested(frame)


def sync_call(
    fn: Callable[..., Any], label: str, attributes: dict[str, Any], code: CodeInfo | None
) -> Callable[..., Any]:
    """``fn`` in a scope: :func:`enter` and :func:`exit_` inlined, in one Python frame.

    An unsampled root call sets the frame to ``OFF`` and allocates nothing; the frame is
    set back with its token, or to ``None`` by value when a signal's exception kept the
    token from being stored. Under ``torch.compile`` tracing the call is ``fn`` itself. A
    nested scope with no stack left to record itself (``RecursionError``) runs unlabelled.
    The returned function reads no module global (every name is a ``pk_`` cell), so
    :mod:`profkit._label.decorate` can rebuild it on ``fn``'s globals, where TorchScript
    looks names up.
    """
    pk_fn, pk_label, pk_attributes, pk_code = fn, label, attributes, code
    pk_compiling, pk_compiled_away = compiling, compiled_away
    pk_get, pk_set, pk_reset, pk_off, pk_global = FRAME.get, FRAME.set, FRAME.reset, OFF, GLOBAL
    pk_open, pk_internal = _open, _errors.internal
    pk_leave_nested, pk_leave_root, pk_slot = _leave_nested, _leave_root, SLOT
    pk_orphaned, pk_no, pk_timed, pk_profiled = orphaned, NOT_PROFILED, TIMED, PROFILED
    pk_controlled, pk_offcall = CONTROLLED, OffCall
    pk_abandoned, pk_now, pk_left_behind = _abandoned, time.perf_counter_ns, left_behind
    pk_staged, pk_stages, pk_active = STAGED, Stages, Active

    def profiled_call(*args: Any, **kwargs: Any) -> Any:
        if pk_compiling() and pk_compiled_away(pk_label):
            return pk_fn(*args, **kwargs)
        frame = pk_get()
        if (
            frame is not None
            and (frame is pk_off or not frame.call.done)
            and (
                frame.__class__ is not pk_active  # (unsampled, an unprofiled root's stage)
                or frame.owner is None
                or not pk_left_behind(frame)  # (left behind: this call is a root call)
            )
        ):
            if frame is pk_off or frame.__class__ is pk_offcall:
                return pk_fn(*args, **kwargs)
            if frame.__class__ is pk_stages:  # an unprofiled root's stage (capture_slow)
                t0 = pk_now()
                try:
                    return pk_fn(*args, **kwargs)
                finally:  # a clock pair and an append: no torch, no object of its own
                    frame.append((pk_label, pk_attributes, pk_code, t0, pk_now()))
            if frame.call.stopped:
                return pk_fn(*args, **kwargs)
            entered = error = None
            try:
                try:  # noqa: SIM105  # contextlib.suppress is a frame more and an object
                    entered = pk_open(frame.call, frame, None, pk_label, pk_attributes, pk_code)
                except RecursionError:  # no stack left to record the scope: run it unlabelled
                    pass  # (what _open left, if anything, is undone with the scope's exit)
                return pk_fn(*args, **kwargs)
            except BaseException as exc:
                error = exc
                raise
            finally:
                try:
                    pk_leave_nested(entered, frame, error)
                except BaseException:  # a signal's exception cut the first attempt short
                    pk_leave_nested(entered, frame, error)
                    raise
        # a root call (or a frame left behind by a call that ended, or by a scope that never
        # exited: stale, so a root too)
        session = pk_global.session
        if session is None or not session.active:
            if pk_slot.held is not None:  # a window this thread still holds closes
                pk_orphaned()
            return pk_fn(*args, **kwargs)
        decision = pk_no
        entered = error = token = None
        try:
            token = pk_set(pk_off)
            try:  # a failing begin_root is counted; the call then runs unsampled
                decision = session.begin_root(pk_label)
            except Exception as exc:
                pk_internal(session.stats, "begin_root", exc)
            if decision is pk_no:
                return pk_fn(*args, **kwargs)
            if decision[0] is not pk_profiled:  # timed (metrics), a control call, staged
                if decision[0] is pk_staged:  # capture_slow: its frame times its regions
                    pk_set(decision[1])
                return pk_fn(*args, **kwargs)
            entered = pk_open(decision[1], None, session, pk_label, pk_attributes, pk_code)
            return pk_fn(*args, **kwargs)
        except BaseException as exc:
            error = exc
            if decision is pk_no and pk_slot.held is not None:  # the decision cut short?
                pk_abandoned(session, exc)
            raise
        finally:
            if decision is pk_no:  # by token when it was stored (cheaper), else by value
                pk_reset(token) if token is not None else pk_set(None)
            elif decision[0] is pk_timed:
                pk_reset(token) if token is not None else pk_set(None)
                session.timed((pk_label, pk_now() - decision[1]))  # a C call (metrics)
            elif decision[0] is pk_staged:  # capture_slow: a stage record if it was slow
                pk_reset(token) if token is not None else pk_set(None)
                decision[1].end(error, pk_attributes, pk_code)
            elif decision[0] is pk_controlled:  # timed for the label's baseline
                pk_reset(token) if token is not None else pk_set(None)
                decision[1].end()
            else:
                try:
                    pk_leave_root(entered, decision[1], session, error)
                except BaseException:  # a signal's exception cut the first attempt short
                    pk_leave_root(entered, decision[1], session, error)
                    raise

    return profiled_call
