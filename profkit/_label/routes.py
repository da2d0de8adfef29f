"""The check for ``@profiled`` placed above a FastAPI/Starlette route decorator.

The route then calls the undecorated function, never profkit's wrapper, so nothing is ever
profiled: a :class:`profkit.ProfkitConfigWarning` says so at decoration time, naming the
route, at the handler's line.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from .._config import ProfkitConfigWarning

__all__ = ["warn_if_route"]

#: the modules between the decorating code and this check
_OURS = frozenset({__name__, __name__.rpartition(".")[0] + ".decorate"})


def _route_calling(func: Any) -> str | None:
    """The path of a FastAPI/Starlette route that calls ``func`` itself, found among the
    globals of ``func``'s module and the locals of the code that decorates it; None when
    there is none (or neither framework is imported)."""
    if "starlette" not in sys.modules:
        return None
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__") in _OURS:
        frame = frame.f_back  # the first frame outside these modules: the decorating code
    values = [*frame.f_locals.values()]
    namespace = getattr(func, "__globals__", None)
    if isinstance(namespace, dict) and namespace is not frame.f_locals:
        values.extend(namespace.values())
    for value in values:
        module = type(value).__module__  # a dynamic type may have any value here, or none
        if not isinstance(module, str) or not module.startswith(("fastapi", "starlette")):
            continue  # (no getattr on anything else: a lazy proxy could run code)
        for route in getattr(value, "routes", None) or ():
            if getattr(route, "endpoint", None) is func:
                return str(getattr(route, "path", "?"))
    return None


def warn_if_route(func: Any, label: str) -> None:
    """``@profiled`` above ``@app.get(...)``: the route calls the function, not the wrapper.

    A check that fails (an app object whose ``routes`` raises) stays silent: decorating never
    raises because of it."""
    try:
        path = _route_calling(func)
    except Exception:
        return
    code = getattr(func, "__code__", None)
    if path is None or code is None:
        return
    warnings.warn_explicit(
        f"@profkit.profiled is above the route decorator of {path!r}: the route calls "
        f"{label!r} itself, never profkit's wrapper, so it is never profiled; put "
        "@profkit.profiled below the route decorator, or call instrument_app(app) once the "
        "routes are added",
        ProfkitConfigWarning,
        code.co_filename,
        code.co_firstlineno,
    )
