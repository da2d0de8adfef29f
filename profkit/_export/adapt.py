"""The exporters of a session as profkit calls them: built from the settings, and the
application's own adapted (duck-typed, a ``force_flush`` / ``shutdown`` without a
``timeout`` in seconds first)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .. import _compat
from .._config import Config
from .._model import WindowSummary
from ..exporters import Exporter
from ..exporters.console import ConsoleExporter, JsonLinesExporter
from ..exporters.logs import LogExporter
from ..exporters.otel import SpanExporter
from .runner import name_of

__all__ = ["build_exporters", "flushes"]


class _Adapted(Exporter):
    """An object with ``export()`` that does not subclass :class:`Exporter` (duck-typed), or
    a subclass whose ``force_flush`` / ``shutdown`` take no ``timeout`` seconds first.

    Its optional ``force_flush`` and ``shutdown`` are looked up once, here.
    """

    def __init__(self, target: Any) -> None:
        self.target = target
        self.name = name_of(target)
        self._flush = getattr(target, "force_flush", None)
        inherited = isinstance(target, Exporter) and not flushes(target)  # (the base's no-op)
        self.flushes = self._flush is not None and not inherited
        self._flush_arg = _timeout_arg(self._flush)
        self._stop = getattr(target, "shutdown", None)
        self._stop_arg = _timeout_arg(self._stop)

    def export(self, summary: WindowSummary) -> Any:
        return self.target.export(summary)

    def force_flush(self, timeout: float = 5.0) -> Any:  # (the runner judges the result)
        if self._flush is None:
            return True
        args, kwargs = self._flush_arg(timeout)
        return self._flush(*args, **kwargs)

    def shutdown(self, timeout: float = 5.0) -> Any:
        if self._stop is not None:
            args, kwargs = self._stop_arg(timeout)
            return self._stop(*args, **kwargs)
        return None


def flushes(exporter: Exporter) -> bool:
    """Whether ``exporter`` has a ``force_flush`` of its own (else there is nothing to flush)."""
    if isinstance(exporter, _Adapted):
        return exporter.flushes
    return type(exporter).force_flush is not Exporter.force_flush


def _timeout_arg(fn: Callable[..., Any] | None) -> Callable[[float], tuple[Any, Any]]:
    """How to pass a timeout in seconds to ``fn`` as (args, kwargs): not at all (no
    parameter), as seconds, or as milliseconds when its parameter says so (OpenTelemetry's
    ``timeout_millis``), by position or by keyword as its signature takes it."""
    try:
        params = list(inspect.signature(fn).parameters.values()) if fn is not None else []
    except (TypeError, ValueError):
        params = []
    params = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not params:
        return lambda timeout: ((), {})
    first = params[0]
    millis = "millis" in first.name

    def value(timeout: float) -> float | int:
        return int(timeout * 1000) if millis else timeout

    if first.kind is first.KEYWORD_ONLY:  # force_flush(self, *, timeout=...)
        return lambda timeout: ((), {first.name: value(timeout)})
    return lambda timeout: ((value(timeout),), {})


def build_exporters(config: Config) -> tuple[SpanExporter | None, list[Exporter]]:
    """The span step ("otel" in ``exporters``) and the other exporters, in order."""
    spans: SpanExporter | None = None
    out: list[Exporter] = []
    for name in config.exporters:
        if name == "otel":
            spans = SpanExporter(
                config.tracer_provider,
                watch=_compat.watch_provider_shutdown,
                shut_down=_compat.provider_shut_down,
            )
        elif name == "log":
            out.append(LogExporter(config.logger))
        elif name == "console":
            out.append(ConsoleExporter())
        elif name == "json":
            out.append(JsonLinesExporter())
    out.extend(e if _takes_seconds(e) else _Adapted(e) for e in config.extra_exporters)
    return spans, out


def _takes_seconds(exporter: Any) -> bool:
    """An :class:`Exporter` whose ``force_flush`` and ``shutdown`` take ``timeout`` seconds
    first, as the base class's (else it is adapted: no parameter, OpenTelemetry's
    ``timeout_millis``, keyword-only)."""
    if not isinstance(exporter, Exporter):
        return False
    for method in ("force_flush", "shutdown"):
        fn = getattr(type(exporter), method)
        if fn is not getattr(Exporter, method):
            try:
                params = list(inspect.signature(fn).parameters.values())[1:]  # (self)
            except (TypeError, ValueError):
                return False
            if not params or params[0].name != "timeout" or params[0].kind not in _POSITIONAL:
                return False
    return True


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
