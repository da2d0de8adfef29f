"""Batched inference: ``batch_member()`` in each request, ``with batch(label, members)`` in
the batcher.

A dynamic batcher runs one forward for many requests outside every request's context. Each
request takes a :class:`BatchMember` token before its input goes to the batcher (its active
OTel span, and whether anything asked for it to be profiled); the batcher wraps the forward
in :class:`batch`, a root call of its own. It is profiled when the sampler picks it (by its
label, as any root call) or when a member asked (baggage ``profkit.profile`` with
``baggage_trigger``, or the request itself profiled by a trigger or by baggage): then the
batch span links every member's span and each member's trace gets a span of its own with its
share (:mod:`profkit.exporters.otel`). Off-sample, :func:`batch_member` is a few context
reads and one small object; :class:`batch` one pass over at most :data:`MAX_MEMBERS`
members and the decision.

Bounds: a batch reads at most :data:`MAX_MEMBERS` (128, OpenTelemetry's default span link
limit) of its members, whatever their number (an iterable that never ends included), so the
request pays the same for a batch of 100k as for one of 128: those members get a member span
and a link each; the rest are never read, counted in ``batch_members_truncated`` when the
batch is profiled, and share the batch equally (``weights`` are then not read) so that
``profkit.batch.size`` (the length of ``members`` when it has one) stays the batch's size.

Inside another profkit scope a batch is a region (nested scopes only label): it has no
batch spans. profkit never raises into the batcher: a member that is not a token (None, a
request object) is counted (``batch_members_invalid``) and left out, bad ``weights``
(``batch_weights_invalid``) fall back to equal shares.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Iterable
from typing import Any

from opentelemetry.trace import TraceFlags

from .. import _errors
from .._capture.decide import OFF as NOT_PROFILED
from .._capture.decide import PROFILED, TIMED, asks_to_profile
from .._compat import SPAN_KEY, otel_current
from .._model import BatchMemberSummary, BatchSummary
from .._records import CallRecord, Policy
from .._targeting.slow import Timed
from .._text import as_label
from .compiler import compiled_away, compiling
from .drivers import watch_loop
from .owner import left_behind, own
from .scope import (
    FRAME,
    GLOBAL,
    OFF,
    Active,
    _open,
    enter,
    exit_,
    undo_enter,
)
from .undo import _abort_root

__all__ = ["MAX_MEMBERS", "BatchMember", "batch", "batch_member"]

#: members of a batch read at most (OpenTelemetry's default span link limit): see above
MAX_MEMBERS = 128

_SAMPLED = TraceFlags.SAMPLED
_TRIGGER = Policy.TRIGGER
_BAGGAGE = Policy.BAGGAGE


class BatchMember:
    """A request's part in a batch: what :func:`batch_member` returns, for :class:`batch`."""

    __slots__ = ("_span", "asked")

    _span: Any
    asked: bool
    """Something asked for this request to be profiled (baggage, a trigger)."""

    @property
    def span_context(self) -> Any:
        """The OTel ``SpanContext`` active when the token was taken (None: no span)."""
        return self._span.get_span_context() if self._span is not None else None

    def __repr__(self) -> str:
        return f"<profkit.BatchMember span={self.span_context!r} asked={self.asked}>"


_alloc = object.__new__


def _token(span: Any, asked: bool) -> BatchMember:
    """A token without ``__init__``'s frame (its two slots set in place)."""
    token: BatchMember = _alloc(BatchMember)
    token._span = span
    token.asked = asked
    return token


#: the token of a request with no active span that asked for nothing: shared, no allocation
_NOTHING = _token(None, False)


def batch_member() -> BatchMember:
    """A token for the current request, to hand to :class:`batch` with its input.

    Call it in the request's handler (in its span), before the input goes to the batcher.
    It reads the active OTel span and whether this request asked for a profile: baggage
    ``profkit.profile=1`` (when ``baggage_trigger`` is on), or the request's own root call
    profiled by a trigger or by baggage. It never raises.
    """
    try:
        otel = otel_current()
        frame = FRAME.get()
        asked = frame is not None and frame is not OFF and _asked_by_call(frame.call)
        if otel and not asked:
            session = GLOBAL.session  # the decision's own baggage flag: one read when off
            if session is not None and session._baggage:
                asked = asks_to_profile(otel)
        span = otel.get(SPAN_KEY) if otel else None
        if span is None and not asked:
            return _NOTHING
        # the span, not its context: its context is read only if the batch is profiled
        token: BatchMember = _alloc(BatchMember)
        token._span = span
        token.asked = asked
        return token
    except Exception as exc:
        session = GLOBAL.session
        if session is None:
            raise
        _errors.internal(session.stats, "batch_member", exc)
        return _NOTHING


def _asked_by_call(call: CallRecord) -> bool:
    """The request's own root call runs profiled because someone asked for it."""
    return call.policy is _TRIGGER or call.policy is _BAGGAGE


class batch:
    """``with profkit.batch(label, members, weights=None):`` around one forward for many
    requests (``async with`` too): a root call named ``label``.

    ``members``: the :func:`batch_member` tokens of the requests in the batch. ``weights``
    (optional, one per member, e.g. tokens): each member's share is its weight over the sum,
    else 1/size. One object serves one ``with``.
    """

    __slots__ = ("_entered", "_members", "_outer", "_weights", "label")

    def __init__(
        self, label: str, members: Iterable[Any], weights: Iterable[float] | None = None
    ) -> None:
        self.label = label if label.__class__ is str else as_label(label)
        self._members = members
        self._weights = weights
        self._entered: Any = None
        self._outer: list[Any] | None = None  # only when one object re-enters

    def __enter__(self) -> batch:
        if compiling() and compiled_away(self.label):
            return self
        frame = FRAME.get()
        session = GLOBAL.session
        nested = frame is not None and (frame is OFF or not frame.call.done)
        if nested and frame.__class__ is Active and frame.owner and left_behind(frame):
            frame, nested = None, False  # left behind by a scope that never exited: a root
        if self._entered is not None:  # re-entered while entered (``with b: with b:``)
            self._outer = self._outer or []
            self._outer.append(self._entered)  # its exit is the outer one's (nested: a region)
            self._entered = None
        try:
            if nested or session is None or not session.active:
                self._entered = enter(self.label, {}, None)  # a region (or nothing at all)
            else:
                self._entered = _enter_root(session, self.label, self._members, self._weights)
        except BaseException as exc:  # landed after the frame was set: __exit__ won't run
            undo_enter(frame, exc)
            self._entered = self._outer.pop() if self._outer else None  # the outer's, if any
            raise
        entered = self._entered
        if entered.__class__ is Active and entered.session is not None:  # a sampled root
            try:  # (as a region's: one across an await says "window")
                watch_loop(entered.call)
                own(entered, 1)  # one entered and never exited is found left behind
            except BaseException as exc:  # a signal's, at its first instruction: undone
                self._entered = None
                undo_enter(frame, exc)
                raise
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        entered = self._entered
        try:  # (the reset inside: a signal's exception after it still gets the exit retried)
            self._entered = self._outer.pop() if self._outer else None
            exit_(entered, exc)
        except BaseException:  # a signal's exception cut the first attempt short
            exit_(entered, exc)
            raise

    async def __aenter__(self) -> batch:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)


def _enter_root(session: Any, label: str, members: Any, weights: Any) -> Any:
    """The batch's root call: the decision (a member that asked decides it as baggage does,
    ``Decider.decide(asked=True)``), then its scope (what :func:`profkit._label.scope.enter`
    does for a root, with the batch's record)."""
    call = None
    try:
        FRAME.set(OFF)
        decision = NOT_PROFILED
        found: tuple[list[Any], list[BatchMember], bool, int] = ([], [], False, 0)
        try:
            found = _valid(session.stats, members)
        except Exception as exc:
            _errors.internal(session.stats, "batch", exc)
        try:  # a failing decision is counted; the batch then runs unsampled
            # never timed nor speculative; a member that asked decides it as baggage does
            decision = session.begin_root(label, False, asked=found[2])
        except Exception as exc:
            _errors.internal(session.stats, "begin_root", exc)
        if decision is NOT_PROFILED:
            return OFF
        if decision[0] is TIMED:  # metrics: the batch is a root call, timed like any other
            return Timed(session.timed, label, decision[1])
        if decision[0] is not PROFILED:
            return OFF
        call = decision[1]
        try:
            call.batch = _summary(session.stats, found[0], found[1], weights, found[3])
        except Exception as exc:  # the call is still profiled, as a plain one
            _errors.internal(session.stats, "batch", exc)
        return _open(call, None, session, label, {}, None)
    except BaseException as exc:
        _abort_root(call, session, exc)
        raise


def _valid(stats: Any, members: Any) -> tuple[list[Any], list[BatchMember], bool, int]:
    """The first :data:`MAX_MEMBERS` of ``members`` as a list, the tokens among them, whether
    one asked (what the decision needs: the weights are read only once the batch is
    profiled, :func:`_summary`), and how many members were left unread (their number when
    ``members`` has a length, else 1: at least one more).

    What is not a token is counted and left out (``batch_members_invalid``).
    """
    try:
        items = list(itertools.islice(members, MAX_MEMBERS))
        extra = 0
        if len(items) == MAX_MEMBERS:
            extra = _unread(members, items)
    except Exception as exc:  # not iterable, or its iteration failed: nothing to batch
        if _errors.foreign(exc):  # a signal handler's (a timeout): the application's
            raise
        stats.add("batch_members_invalid")
        return [], [], False, 0
    valid = [m for m in items if m.__class__ is BatchMember]
    if len(valid) != len(items):
        stats.add("batch_members_invalid", len(items) - len(valid))
    asked = any(m.asked and not _in_unsampled_trace(m.span_context) for m in valid)
    return items, valid, asked, extra


def _unread(members: Any, items: list[Any]) -> int:
    """Members past the ``items`` read: by the length of ``members`` when it has one (a list,
    a tuple), else 1 if its iterator gives one more (an iterator of unknown length)."""
    if hasattr(members, "__len__"):
        try:
            return max(0, len(members) - len(items))
        except Exception as exc:
            if _errors.foreign(exc):
                raise
    if iter(members) is members:  # an iterator: the next item, if any, is the only one read
        return 1 if next(members, _END) is not _END else 0
    return 0  # an iterable of no length that is not an iterator: read afresh, not guessed


_END = object()


def _in_unsampled_trace(sc: Any) -> bool:
    """The span context belongs to a trace that was not sampled (its spans are never kept)."""
    return sc is not None and sc.is_valid and not sc.trace_flags & _SAMPLED


def _weights(items: list[Any], weights: Any) -> list[float] | None:
    """The weights of the tokens in ``items``, or None when they cannot be used.

    A weight is a real number, numpy's included; a numpy array or a tensor (context lengths,
    ``mask.sum(1)``) gives its numbers as Python's (``tolist()``: one copy, not one 0-d
    tensor per member).
    """
    try:
        to_list = getattr(weights, "tolist", None)
        given = list(to_list() if callable(to_list) else weights)
    except Exception as exc:
        if _errors.foreign(exc):
            raise
        return None
    if len(given) != len(items):
        return None
    out = []
    for item, w in zip(items, given, strict=True):
        if item.__class__ is not BatchMember:
            continue
        if isinstance(w, bool) or not isinstance(w, numbers.Real):
            return None
        try:
            value = float(w)
        except Exception as exc:  # an int past float's range, a Real whose float() fails
            if _errors.foreign(exc):
                raise
            return None
        if not math.isfinite(value) or value < 0:
            return None
        out.append(value)
    if out and not math.isfinite(sum(out)):  # finite weights whose sum overflows: scaled
        top = max(out)
        out = [value / top for value in out]
    return out if sum(out) > 0 else None


def _summary(
    stats: Any, items: list[Any], members: list[BatchMember], given: Any, extra: int = 0
) -> BatchSummary | None:
    """The profiled batch's members with their shares; counts those with no member span.

    The weights ``given`` are read here, for a profiled batch alone (a device tensor's
    ``tolist()`` waits for the device): not one finite number >= 0 per item of ``items``,
    with a positive sum, they are counted (``batch_weights_invalid``) and give equal shares.
    With no token there is nothing to weigh (an empty batch's empty weights are not bad).
    ``extra`` members were left unread (:data:`MAX_MEMBERS`): counted, shares equal, the
    weights unread.
    """
    if not members:
        return None
    if extra:
        stats.add("batch_members_truncated", extra)
        given = None
    weights = _weights(items, given) if given is not None else None
    if given is not None and weights is None:
        stats.add("batch_weights_invalid")
    total = sum(weights) if weights is not None else float(len(members) + extra)
    out = []
    for i, m in enumerate(members):
        sc = m.span_context
        sampled = bool(sc is not None and sc.is_valid and sc.trace_flags & _SAMPLED)
        share = (weights[i] if weights is not None else 1.0) / total
        out.append(BatchMemberSummary(sc if sampled else None, share, sampled))
    unsampled = sum(1 for m in out if not m.sampled)
    if unsampled:
        stats.add("batch_members_unsampled", unsampled)
    return BatchSummary(tuple(out), weighted=weights is not None, truncated=extra)
