"""Ray Serve: profkit in every replica, traces across the hop, ``@serve.batch`` batches.

::

    from ray import serve
    import profkit
    from profkit.integrations import ray_serve

    @serve.deployment(num_replicas=2)
    @ray_serve.replica(sample_every=50, metrics=True, setup=make_providers)
    class Model:
        @ray_serve.batch(label="forward", max_batch_size=8, batch_wait_timeout_s=0.01)
        async def __call__(self, inputs: list[torch.Tensor]) -> list[int]:
            ...  # one forward for the batch: a profkit.batch("forward", members) root call

    @serve.deployment
    @ray_serve.replica(sample_every=50)
    class Ingress:
        def __init__(self, model: DeploymentHandle) -> None:
            self.model = ray_serve.traced(model)  # the caller's trace goes with each call

        @profkit.profiled("classify")
        async def __call__(self, request: Request) -> dict: ...

:func:`replica` is a class decorator under ``@serve.deployment``: it travels with the
deployment (Ray pickles the class), so each replica configures profkit in its own process
before the class's ``__init__`` runs (with ``settings``, the rest from ``PROFKIT_*``, which
``ray_actor_options={"runtime_env": {"env_vars": ...}}`` carries), and shuts profkit down in
``__del__`` (which Ray Serve calls when it stops a replica: a scale-down, a redeploy,
``serve.shutdown()``), before the class's own ``__del__``: what was sampled is exported, or
counted as dropped. ``setup`` (a callable with no arguments, run in the replica) returns
what cannot be pickled: ``{"tracer_provider": ..., "meter_provider": ...}``.

Each method of the class (``__call__`` and the public ones) runs in the trace of its
request (profkit's root calls are children of its span, and skipped in an unsampled trace):

* the request's own W3C context: the ``traceparent`` (and ``tracestate``, ``baggage``) of
  the HTTP request, for a method given the request (a Starlette ``Request``); for a call
  through a :func:`traced` handle, the caller's context, which the handle sends as the
  keyword argument :data:`TRACE_KWARG` and the receiving method's wrapper takes out again
  (so a :func:`traced` handle calls deployments that are ``@replica`` themselves: Ray's own
  ``_ray_trace_ctx`` keyword cannot carry it, Ray refuses it while Ray's tracing is off);
* with Ray Serve's own tracing on (``serve.start(tracing_config=...)``,
  ``RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH``): Ray Serve's current span, where it is in
  the request's trace; a request with no context of its own that Ray Serve did not sample
  (it leaves no span) is an unsampled trace for profkit too.

:func:`batch` replaces ``@serve.batch``: each request takes a :func:`profkit.batch_member`
token in its own context, and the batch body runs in ``profkit.batch(label, members)``.

Ray is optional: ``pip install 'profkit[ray]'``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

try:
    from ray import serve
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "profkit.integrations.ray_serve needs Ray Serve: pip install 'profkit[ray]'"
    ) from exc

from opentelemetry import context as otel_context

from .. import _global
from .._label.batch import BatchMember, batch_member
from .._label.batch import batch as profkit_batch
from ._ray_trace import TRACE_KWARG, in_request_trace, traced

__all__ = ["SHUTDOWN_FLUSH_S", "TRACE_KWARG", "batch", "replica", "stop", "traced"]

#: seconds the flush at a replica's shutdown may take (Ray Serve's own graceful shutdown
#: timeout, ``graceful_shutdown_timeout_s``, is 20 s by default)
SHUTDOWN_FLUSH_S = 5.0

_C = TypeVar("_C", bound=type)
#: the instance attribute holding the session its ``__init__`` configured (None once stopped)
_SESSION = "_profkit_session"


def replica(
    cls: _C | None = None,
    /,
    *,
    setup: Callable[[], Mapping[str, Any] | None] | None = None,
    flush_timeout: float = SHUTDOWN_FLUSH_S,
    **settings: Any,
) -> Any:
    """Class decorator for a deployment (under ``@serve.deployment``): profkit in each replica.

    Args:
        cls: The deployment class (bare ``@replica``, or ``@replica(...)`` with settings).
        setup: Run in each replica before ``configure()``; what it returns is added to the
            settings (a TracerProvider, a MeterProvider, exporters: what cannot travel).
        flush_timeout: Seconds the shutdown flush in ``__del__`` may take.
        **settings: ``profkit.configure()`` settings (plain values: they travel with the
            class); those left out come from ``PROFKIT_*`` in the replica's environment.

    Returns:
        The class, changed in place.

    Raises:
        ValueError: a setting is unknown or out of range (checked here, on the driver).
    """
    from .._config import build_config

    build_config(dict(settings))  # a typo fails the deploy script, not every replica

    def decorate(target: _C) -> _C:
        _instrument(target, settings, setup, flush_timeout)
        return target

    return decorate(cls) if cls is not None else decorate


def _instrument(
    cls: type,
    settings: dict[str, Any],
    setup: Callable[[], Mapping[str, Any] | None] | None,
    flush_timeout: float,
) -> None:
    owner: Any = cls
    init = cls.__dict__.get("__init__")
    user_del = cls.__dict__.get("__del__")

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        extra = dict(setup() or {}) if setup is not None else {}
        _global.configure(**{**settings, **extra})
        with contextlib.suppress(AttributeError):  # (__slots__: __del__ then stops nothing)
            object.__setattr__(self, _SESSION, _global.get_session())
        if init is not None:
            init(self, *args, **kwargs)
        else:
            base: Any = super(owner, self)  # the __init__ the class inherits
            base.__init__(*args, **kwargs)

    def __del__(self: Any) -> None:
        # Ray Serve calls it once the replica has drained; the GC may call it again. Only
        # the instance whose __init__ configured the session in place stops it (not one made
        # without __init__, nor an older one after another configure())
        session = getattr(self, _SESSION, None)
        if session is not None:
            object.__setattr__(self, _SESSION, None)
            if _global.get_session() is session:
                stop(flush_timeout)
        if user_del is not None:
            user_del(self)

    if init is not None:
        functools.update_wrapper(__init__, init)
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __del__.__qualname__ = f"{cls.__qualname__}.__del__"
    cls.__init__ = __init__  # type: ignore[misc]
    cls.__del__ = __del__  # type: ignore[attr-defined]
    for name, member in list(cls.__dict__.items()):
        if (name == "__call__" or not name.startswith("_")) and inspect.isfunction(
            getattr(member, "__wrapped__", member)
        ):
            wrapped = in_request_trace(member)
            if wrapped is not member:
                setattr(cls, name, wrapped)


def stop(timeout: float = SHUTDOWN_FLUSH_S) -> bool:
    """Flush and shut profkit down in this replica (what ``__del__`` does); True when all
    that was sampled was exported (else it is counted as dropped, ``profkit.stats()``)."""
    _global.close_idle_here()  # a window waiting on this (the replica loop's) thread
    return _global.shutdown(timeout)


class _Item:
    """One request's input and its batch token, through Ray Serve's batch queue."""

    __slots__ = ("member", "value")

    def __init__(self, member: BatchMember, value: Any) -> None:
        self.member = member
        self.value = value


def batch(
    func: Callable[..., Any] | None = None,
    /,
    *,
    label: str | None = None,
    weight: Callable[[Any], float] | None = None,
    batch_size_fn: Callable[[list[Any]], int] | None = None,
    **serve_batch: Any,
) -> Any:
    """``@serve.batch`` whose batches are profkit batches: ``@ray_serve.batch(label=...,
    max_batch_size=8, batch_wait_timeout_s=0.01)`` on a method ``(self, inputs: list)``.

    Each call (``await self.method(one_input)``) takes :func:`profkit.batch_member` in its
    request's context and queues its input with it; the method then runs on the batch's
    inputs inside ``profkit.batch(label, members, weights)``: a root call named ``label``
    (default: the method's name), profiled one batch in N, each request's trace getting its
    share. The method may be ``async def`` or ``def``; either runs where Ray Serve runs the
    batch (the replica's event loop): keep the forward inside it, not behind an ``await``
    (a thread-local window records the loop's other tasks meanwhile).

    Args:
        func: The batch method (bare ``@ray_serve.batch``).
        label: The batch's label.
        weight: One input's weight (its tokens): the shares are weights over their sum; read
            for a profiled batch only.
        batch_size_fn: As ``serve.batch``'s, given the inputs.
        **serve_batch: ``serve.batch``'s other arguments (``max_batch_size``,
            ``batch_wait_timeout_s``, ``max_concurrent_batches``).
    """

    def decorate(method: Callable[..., Any]) -> Any:
        if inspect.isasyncgenfunction(method) or inspect.isgeneratorfunction(method):
            raise TypeError(
                "profkit.integrations.ray_serve.batch does not take a generator (a streamed "
                "batch): use serve.batch with profkit.batch_member() and profkit.batch() "
                "(docs/ray-serve.md)"
            )
        name = label if label is not None else method.__name__
        is_async = inspect.iscoroutinefunction(method)

        async def body(self: Any, items: list[_Item]) -> Any:
            inputs = [item.value for item in items]
            weights = None if weight is None else (weight(x) for x in inputs)
            # a trace of its own (the batch task kept the context of the request that made
            # the queue; Ray Serve's tracing, the first request's): the members link to it
            token = otel_context.attach(otel_context.Context())
            try:
                with profkit_batch(name, [item.member for item in items], weights):
                    if is_async:
                        return await method(self, inputs)
                    return method(self, inputs)
            finally:
                otel_context.detach(token)

        body.__name__, body.__qualname__ = method.__name__, method.__qualname__
        sizes = None
        if batch_size_fn is not None:
            size_fn = batch_size_fn

            def sizes(items: list[_Item]) -> int:
                return size_fn([item.value for item in items])

        queued: Any = serve.batch(body, batch_size_fn=sizes, **serve_batch)

        @functools.wraps(method)
        async def one(self: Any, value: Any) -> Any:
            return await queued(self, _Item(batch_member(), value))

        one.__wrapped__ = body  # serve.batch finds self by it
        for attr in ("set_max_batch_size", "set_batch_wait_timeout_s"):
            setattr(one, attr, getattr(queued, attr))
        for attr in ("_get_max_batch_size", "_get_batch_wait_timeout_s"):
            if hasattr(queued, attr):
                setattr(one, attr, getattr(queued, attr))
        return one

    return decorate(func) if func is not None else decorate
