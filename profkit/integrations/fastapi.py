"""FastAPI: make every route handler of an app a labelled profkit root call.

::

    from profkit.integrations.fastapi import instrument_app

    app = FastAPI()

    @app.post("/predict")
    def predict(request: PredictRequest) -> PredictResponse: ...

    instrument_app(app)  # after the routes are added; /predict is now a root call

Each route's endpoint function is wrapped as ``@profkit.profiled(<path template>)`` would
wrap it (label ``"/items/{item_id}"``, attribute ``http.route``), in place, where FastAPI
calls it: a sync endpoint is profiled on the worker thread that runs it, an async one in its
task, a generator endpoint (streamed by FastAPI) while it yields. Nothing else about the
route changes (path, OpenAPI schema, dependencies, response model).

The same convention as ``FastAPIInstrumentor.instrument_app`` and
``logfire.instrument_fastapi``: call it once the routes exist. It is idempotent, so calling
it again after ``include_router`` labels the routes added since; routes added after it are
also labelled when the application starts (its lifespan), and an app with no routes yet
gets a ``ProfkitConfigWarning``. WebSocket routes and mounted sub-applications are left
alone.

It also flushes profkit when the application shuts down (its lifespan, the app's own
shutdown code included, is wrapped once): under uvicorn, SIGTERM ends in a graceful
shutdown and then re-raises the signal, so the process dies without running Python's exit
hooks; what was sampled is exported first, before the app's own shutdown code (which may
shut down its TracerProvider) runs.

``add_trigger_route(app, token=...)`` mounts an optional admin route, ``POST
/profkit/trigger``, that calls :func:`profkit.trigger` for a caller with the token; nothing is
mounted unless it is called.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import sys
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Annotated, Any
from urllib.parse import parse_qsl

try:
    import fastapi.routing
    from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.routing import APIRoute
    from pydantic import BaseModel, Field, ValidationError
    from starlette.concurrency import run_in_threadpool
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "profkit.integrations.fastapi needs FastAPI: pip install fastapi "
        "(or pip install 'profkit[demo]' for the demo's FastAPI, uvicorn and httpx)"
    ) from exc

from .. import _global
from .._config import ProfkitConfigWarning
from .._label.decorate import label_endpoint

__all__ = [
    "MAX_TRIGGER_N",
    "SHUTDOWN_FLUSH_S",
    "TOKEN_ENV",
    "add_trigger_route",
    "instrument_app",
]

_WRAPPERS: dict[int, Any] = {}
"""The endpoint wrappers made so far, by id (kept alive so that ids stay unique): a call
that FastAPI already calls through one of them is not wrapped twice; nor is profkit's own
admin endpoint (``add_trigger_route``), never a root call."""

_FLUSHING: dict[int, Any] = {}
"""The routers whose lifespan already flushes profkit on shutdown, by id (kept alive so that
ids stay unique; wrapped once)."""
_RELABEL: dict[int, Callable[[], int]] = {}
"""Per router (by id, kept alive by ``_FLUSHING``): label the routes added since the latest
``instrument_app`` call, with its options; run as the application starts."""
_EMPTY_WARNED: dict[int, Any] = {}
"""The apps ``instrument_app`` warned about having no routes (once each; kept alive)."""
#: seconds the flush on application shutdown may take
SHUTDOWN_FLUSH_S = 5.0
#: seconds the window in export after the application's shutdown code still gets
WRITE_OFF_GRACE_S = 1.0

#: the environment variable ``add_trigger_route`` reads its token from, when not given one
TOKEN_ENV = "PROFKIT_TRIGGER_TOKEN"
#: the most root calls one request to the trigger route may ask for
MAX_TRIGGER_N = 100
_MAX_LABEL = 200


def instrument_app(
    app: FastAPI,
    *,
    exclude: Iterable[str] = (),
    attributes: Mapping[str, Any] | None = None,
) -> int:
    """Make every route handler of ``app`` a labelled root call (label: the path template).

    Args:
        app: The FastAPI application, with its routes already added.
        exclude: Path templates to leave unprofiled (``"/healthz"``, ``"/metrics"``).
        attributes: Extra attributes for every route's root span (``{"model": "mlp"}``).

    Returns:
        How many routes were labelled by this call (0 when all already were).
    """
    skip = set(exclude)
    _flush_on_shutdown(app, lambda: _label_routes(app, skip, attributes))
    routes = list(_api_routes(app))
    if not routes and id(app) not in _EMPTY_WARNED:
        _EMPTY_WARNED[id(app)] = app
        warnings.warn(
            "instrument_app(app) found no routes: routes added after it are labelled only "
            "when the application starts (its lifespan; not with lifespan='off'); call "
            "instrument_app(app) once the routes are added",
            ProfkitConfigWarning,
            stacklevel=2,
        )
    return _label_routes(app, skip, attributes, routes)


def _label_routes(
    app: FastAPI,
    skip: set[str],
    attributes: Mapping[str, Any] | None,
    routes: list[tuple[str, Any]] | None = None,
) -> int:
    labelled = 0
    for path, dependant in _api_routes(app) if routes is None else routes:
        if path not in skip and _label(path, dependant, attributes):
            labelled += 1
    return labelled


def _flush_on_shutdown(app: FastAPI, relabel: Callable[[], int]) -> None:
    """Wrap the app's lifespan once: on start-up, label the routes added since
    ``instrument_app`` (``relabel``, the latest call's); on shutdown, flush profkit before
    the app's own code."""
    router = app.router
    _RELABEL[id(router)] = relabel
    if id(router) in _FLUSHING:
        return
    inner = router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(asgi_app: Any) -> AsyncIterator[Any]:
        _RELABEL[id(router)]()
        async with inner(asgi_app) as state:
            try:
                yield state
            finally:  # the server stopped taking requests and finished those in flight
                # a window waiting on this (the event loop's) thread closes only here
                _global.close_idle_here()
                # (its answer is left to the app's own shutdown() or force_flush())
                await run_in_threadpool(_global.flush_ahead, SHUTDOWN_FLUSH_S)
        # the app's shutdown code ran: under uvicorn the process now dies by SIGTERM without
        # exit hooks, and what is not exported yet with it: counted and said, not lost
        lost = await run_in_threadpool(_global.write_off, "shutdown", WRITE_OFF_GRACE_S)
        if lost:
            _say_lost(lost)

    router.lifespan_context = lifespan
    _FLUSHING[id(router)] = router


def _say_lost(lost: int) -> None:
    """One line on stderr: how many sampled calls the application's shutdown left behind."""
    with contextlib.suppress(Exception):  # (a closed stderr: the counters still say it)
        sys.stderr.write(
            f"profkit: {lost} sampled call{'s' if lost != 1 else ''} not exported when the "
            f"application shut down (the exporters were still busy after the "
            f"{SHUTDOWN_FLUSH_S:g} s shutdown flush): counted dropped ('shutdown')\n"
        )
        sys.stderr.flush()


def _api_routes(app: FastAPI) -> Iterator[tuple[str, Any]]:
    """(path template, dependant) of each HTTP route FastAPI serves, included routers too.

    FastAPI releases that include routers lazily list them through
    ``fastapi.routing.iter_route_contexts`` (the effective path and dependant of each
    inclusion); older ones copy included routes into ``app.router.routes``.
    """
    iter_contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    routes: Iterable[Any] = app.router.routes
    for item in iter_contexts(routes) if iter_contexts is not None else routes:
        route = getattr(item, "original_route", item)
        dependant = getattr(item, "dependant", None)
        path = getattr(item, "path", None)
        if isinstance(route, APIRoute) and isinstance(path, str) and dependant is not None:
            yield path, dependant


def _label(path: str, dependant: Any, attributes: Mapping[str, Any] | None) -> bool:
    """Wrap the function FastAPI calls for a route; False when it was already wrapped."""
    call = dependant.call
    if call is None or id(call) in _WRAPPERS:
        return False
    attrs = {"http.route": path, **(attributes or {})}
    wrapper = label_endpoint(call, path, attrs)
    _WRAPPERS[id(wrapper)] = wrapper
    dependant.call = wrapper
    return True


class _TriggerBody(BaseModel):
    """The JSON body of a trigger request; each field given here wins over the query's."""

    n: int = Field(1, ge=1, le=MAX_TRIGGER_N, strict=True)  # strict: not true, nor 2.0
    label: str | None = Field(None, min_length=1, max_length=_MAX_LABEL)


def add_trigger_route(
    app: FastAPI,
    *,
    token: str | None = None,
    path: str = "/profkit/trigger",
    include_in_schema: bool = False,
) -> None:
    """Mount ``POST <path>``: profile the next ``n`` root calls (of ``label``) on request.

    ``n`` (1 to :data:`MAX_TRIGGER_N`, default 1) and ``label`` come as query parameters or
    as a JSON body (``{"n": 3, "label": "/predict"}``); the answer is ``{"triggered": added,
    "label": label, "pending": pending, "capped": added < n}`` (at most 1000 triggers are
    pending in all). A request must carry ``Authorization: Bearer <token>`` (compared in
    constant time): without it, or with another, the answer is 401 before the parameters or
    the body are looked at; anything it cannot use (a bad ``n`` or ``label``, a body that is
    not a JSON object or not UTF-8) is 422, never 500; 503 while profkit is not configured.
    The route is not listed in the OpenAPI schema unless ``include_in_schema``, and is never
    a root call itself (``instrument_app`` leaves it alone).

    Args:
        app: The FastAPI application.
        token: The shared secret; None reads ``PROFKIT_TRIGGER_TOKEN`` (now, once).
        path: Where to mount the route.
        include_in_schema: List the route in ``/openapi.json`` and ``/docs``.

    Raises:
        ValueError: no token (neither given nor in ``PROFKIT_TRIGGER_TOKEN``), or a blank one:
            an admin route is never mounted open.
    """
    secret = token if token is not None else os.environ.get(TOKEN_ENV, "")
    if not isinstance(secret, str) or not secret.strip():
        raise ValueError(
            f"add_trigger_route needs a token (token= or {TOKEN_ENV}): "
            "profkit does not mount an admin route anyone may call"
        )
    expected = secret.strip().encode()

    def authorized(authorization: Annotated[str | None, Header()] = None) -> None:
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise HTTPException(
                status_code=401,
                detail="profkit trigger: a valid bearer token is required",
                headers={"WWW-Authenticate": "Bearer"},
            )

    async def profkit_trigger(
        request: Request,
        n: Annotated[int, Query(ge=1, le=MAX_TRIGGER_N)] = 1,
        label: Annotated[str | None, Query(min_length=1, max_length=_MAX_LABEL)] = None,
    ) -> dict[str, Any]:
        # the body is read here, after the token was checked (a Body() parameter is parsed
        # before any dependency runs: a caller without the token would get its 422s)
        body = await _read_body(request)
        if body is not None:
            n = body.n if "n" in body.model_fields_set else n
            label = body.label if "label" in body.model_fields_set else label
        _check_query(request)
        session = _global.get_session()
        if session is None:
            raise HTTPException(status_code=503, detail="profkit is not configured")
        added = session.trigger(n, label)
        pending = session.triggered.pending
        return {"triggered": added, "label": label, "pending": pending, "capped": added < n}

    _WRAPPERS[id(profkit_trigger)] = profkit_trigger  # instrument_app: not a root call
    app.add_api_route(
        path,
        profkit_trigger,
        methods=["POST"],
        dependencies=[Depends(authorized)],
        include_in_schema=include_in_schema,
        name="profkit_trigger",
    )


async def _read_body(request: Request) -> _TriggerBody | None:
    """The request's JSON body, or None when it has none; a bad one is FastAPI's 422."""
    raw = await request.body()
    if not raw.strip():
        return None
    try:  # as text first: a validation error echoes its input, and raw bytes cannot be
        text = raw.decode("utf-8")  # written back as JSON (FastAPI's 422 would fail: a 500)
    except UnicodeDecodeError:
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ("body",), "msg": "the body is not UTF-8"}]
        ) from None
    try:
        return _TriggerBody.model_validate_json(text)
    except ValidationError as exc:
        # not the input: it may hold what JSON cannot write (inf, nan, a 5000-digit int),
        # which turned FastAPI's 422 into a 500
        raise RequestValidationError(
            [
                {"type": e["type"], "loc": ("body", *e["loc"]), "msg": e["msg"]}
                for e in exc.errors(include_url=False, include_context=False, include_input=False)
            ]
        ) from None


def _check_query(request: Request) -> None:
    """A 422 for a query string that is not UTF-8 once unquoted (Starlette would have made
    its bytes U+FFFD: a label no root call has)."""
    raw = request.scope.get("query_string", b"")
    try:
        parse_qsl(raw.decode("latin-1"), keep_blank_values=True, errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise RequestValidationError(
            [{"type": "string_unicode", "loc": ("query",), "msg": "the query is not UTF-8"}]
        ) from None
