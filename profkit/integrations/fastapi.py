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
it again after ``include_router`` labels the routes added since. WebSocket routes and mounted
sub-applications are left alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

try:
    import fastapi.routing
    from fastapi import FastAPI
    from fastapi.routing import APIRoute
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "profkit.integrations.fastapi needs FastAPI: pip install fastapi "
        "(or pip install 'profkit[demo]' for the demo's FastAPI, uvicorn and httpx)"
    ) from exc

from .._api import profiled

__all__ = ["instrument_app"]

_WRAPPERS: dict[int, Any] = {}
"""The endpoint wrappers made so far, by id (kept alive so that ids stay unique): a call
that FastAPI already calls through one of them is not wrapped twice."""


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
    labelled = 0
    for path, dependant in _api_routes(app):
        if path not in skip and _label(path, dependant, attributes):
            labelled += 1
    return labelled


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
    wrapper = profiled(path, attributes=attrs)(call)
    _WRAPPERS[id(wrapper)] = wrapper
    dependant.call = wrapper
    return True
