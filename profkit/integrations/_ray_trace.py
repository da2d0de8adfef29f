"""Ray Serve: a request's trace across the hop into a replica (see :mod:`.ray_serve`).

A replica method runs in its request's OTel context: Ray Serve's own where its tracing is on
(a request it did not sample is an unsampled trace for profkit too), else the W3C headers of
the HTTP request the method is given, or the carrier a :class:`traced` handle sent in the
keyword argument :data:`TRACE_KWARG`. Imported only by :mod:`.ray_serve`, after Ray is.
"""

from __future__ import annotations

import functools
import inspect
import random
from collections.abc import Iterable
from contextvars import Token
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from .. import _errors, _global

try:  # Ray Serve's own tracing (alpha): whether it is set up in this process
    from ray.serve._private.tracing_utils import is_tracing_enabled as _tracing_enabled
except ImportError:  # pragma: no cover - another Ray release: taken as off

    def _tracing_enabled() -> bool:
        return False


__all__ = ["TRACE_KWARG", "in_request_trace", "traced"]

#: the keyword argument a :class:`traced` handle carries the caller's W3C context in (a dict
#: of ``traceparent``, ``tracestate``, ``baggage``); a ``replica`` method takes it out
TRACE_KWARG = "_profkit_trace"


def in_request_trace(method: Any) -> Any:
    """``method``, run in its request's trace (see the module docstring); generators and
    async generators (streamed answers) are left alone."""
    if inspect.isgeneratorfunction(method) or inspect.isasyncgenfunction(method):
        return method
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            token = _attach(args, kwargs.pop(TRACE_KWARG, None))
            try:
                return await method(*args, **kwargs)
            finally:
                if token is not None:
                    otel_context.detach(token)

        wrapper: Any = async_wrapper
    else:

        @functools.wraps(method)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            token = _attach(args, kwargs.pop(TRACE_KWARG, None))
            try:
                return method(*args, **kwargs)
            finally:
                if token is not None:
                    otel_context.detach(token)

        wrapper = sync_wrapper
    # serve.batch finds a method's ``self`` by its ``__wrapped__``: keep the one it knows
    wrapper.__wrapped__ = getattr(method, "__wrapped__", method)
    return wrapper


def _attach(args: tuple[Any, ...], sent: Any) -> Token[otel_context.Context] | None:
    """Attach the request's context, when this replica's current one is not it already."""
    try:
        ctx = _request_context(args[1:], sent)
        return otel_context.attach(ctx) if ctx is not None else None
    except Exception as exc:  # never fail the request over its trace
        session = _global.get_session()
        if session is None:
            raise
        _errors.internal(session.stats, "ray_serve_context", exc)
        return None


def _request_context(args: Iterable[Any] = (), sent: Any = None) -> otel_context.Context | None:
    """The OTel context this replica's current request belongs to, or None when the current
    one already is (or there is none). ``args``: the method's arguments (a Starlette
    ``Request`` among them gives its headers); ``sent``: what a :class:`traced` handle sent.

    The request's own W3C context (headers, a traced handle's carrier) is its trace and its
    caller's sampling decision. With Ray Serve's tracing on, Ray Serve's current span is the
    parent when it is in that trace (or there is none to compare); a span of Ray Serve's in
    another trace lost the request's parent on the way (Ray 2.60's proxy and router run on
    loops of their own), so the request's context wins; no span of Ray Serve's and no
    context of the request's: Ray Serve did not sample it, and neither does profkit.
    """
    carrier = _carrier(sent)
    if carrier is None:
        for arg in args:
            carrier = _headers(arg)
            if carrier is not None:
                break
    ctx = propagate.extract(carrier) if carrier else None
    if not _serve_tracing_on():
        return ctx
    current = trace.get_current_span().get_span_context()
    if current.is_valid:
        theirs = trace.get_current_span(ctx).get_span_context() if ctx is not None else None
        if theirs is None or not theirs.is_valid or theirs.trace_id == current.trace_id:
            return None  # Ray Serve's span, in the request's trace
        return ctx
    if ctx is not None and trace.get_current_span(ctx).get_span_context().is_valid:
        return ctx
    return trace.set_span_in_context(NonRecordingSpan(_unsampled()))


def _serve_tracing_on() -> bool:
    """Ray Serve's own tracing is set up in this process (its ``setup_tracing``)."""
    return bool(_tracing_enabled())


def _unsampled() -> SpanContext:
    """A valid span context whose trace is not sampled (profkit skips calls under it)."""
    return SpanContext(
        trace_id=random.getrandbits(128) or 1,
        span_id=random.getrandbits(64) or 1,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.DEFAULT),
    )


def _carrier(sent: Any) -> dict[str, str] | None:
    """The W3C carrier a :func:`traced` handle sent (strings only), else None."""
    if isinstance(sent, dict) and isinstance(sent.get("traceparent"), str):
        return {k: v for k, v in sent.items() if isinstance(k, str) and isinstance(v, str)}
    return None


def _headers(arg: Any) -> dict[str, str] | None:
    """The trace headers of an HTTP request (an ASGI ``scope`` with headers), else None."""
    scope = getattr(arg, "scope", None)
    if not isinstance(scope, dict) or scope.get("type") != "http":
        return None
    out: dict[str, str] = {}
    for key, value in scope.get("headers") or ():
        name = key.decode("latin-1").lower()
        if name in ("traceparent", "tracestate", "baggage"):
            out[name] = value.decode("latin-1")
    return out


class traced:
    """A ``DeploymentHandle`` whose calls carry the caller's W3C trace context.

    ``traced(handle).remote(x)``, ``traced(handle).method.remote(x)`` and
    ``traced(handle).options(...)`` are the handle's own, with the current context (the
    request's, in an instrumented replica) injected into :data:`TRACE_KWARG` when there is
    one (with Ray Serve's tracing on too: its router does not always carry it). The
    deployment called must be a :func:`replica` (its ``__call__`` and public methods take
    the keyword out); a method whose name starts with ``_`` is called as it is.
    """

    __slots__ = ("handle", "method")

    handle: Any
    """The ``DeploymentHandle`` (or method handle) it calls."""
    method: str
    """The deployment's method it calls."""

    def __init__(self, handle: Any, method: str = "__call__") -> None:
        self.handle = handle.handle if isinstance(handle, traced) else handle
        self.method = method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """The handle's ``remote``, with the caller's trace context."""
        public = self.method == "__call__" or not self.method.startswith("_")
        if public and TRACE_KWARG not in kwargs:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            if carrier.get("traceparent"):
                kwargs[TRACE_KWARG] = carrier
        return self.handle.remote(*args, **kwargs)

    def options(self, *args: Any, **kwargs: Any) -> traced:
        """The handle's ``options``, traced."""
        method = kwargs.get("method_name") or self.method
        return traced(self.handle.options(*args, **kwargs), method)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.handle, name)
        return traced(value, name) if callable(getattr(value, "remote", None)) else value

    def __repr__(self) -> str:
        return f"profkit.integrations.ray_serve.traced({self.handle!r})"
