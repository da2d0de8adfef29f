"""Exporters: where summaries go. Each receives every :class:`~profkit.WindowSummary`.

Built-in, by name in ``configure(exporters=...)``:

* ``"otel"``: one span per sampled call (a child of the request's span) and one per nested
  scope, via the global or given TracerProvider (:mod:`profkit.exporters.otel`).
* ``"log"``: structlog events ``profkit.profile`` and ``profkit.op`` carrying the span's
  ``trace_id`` / ``span_id`` (:mod:`profkit.exporters.logs`).
* ``"console"``: a readable table per call on stderr; ``"json"``: one JSON line per call on
  stdout (:mod:`profkit.exporters.console`).

Any object with ``export(summary)`` (and optionally ``force_flush(timeout)`` and
``shutdown()``) can be passed in ``configure(extra_exporters=[...])``.

Shipping spans to a collector is the TracerProvider's job:
:func:`profkit.exporters.otlp.otlp_span_processor` builds an OTLP ``BatchSpanProcessor`` that
counts failed exports into ``profkit.stats()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .._config import Config
    from .._model import WindowSummary

__all__ = ["Exporter", "build_exporters"]


@runtime_checkable
class Exporter(Protocol):
    """Receives summaries on the export worker; may be slow, may fail: both are contained."""

    name: str

    def export(self, summary: WindowSummary) -> None:
        """Ship one window's calls somewhere."""
        ...


def build_exporters(config: Config) -> list[Any]:
    """The exporters named in ``config.exporters`` followed by ``config.extra_exporters``."""
    out: list[Any] = []
    for name in config.exporters:
        if name == "otel":
            from .otel import SpanExporter

            out.append(SpanExporter(config))
        elif name == "log":
            from .logs import LogExporter

            out.append(LogExporter(config))
        elif name == "console":
            from .console import ConsoleExporter

            out.append(ConsoleExporter())
        elif name == "json":
            from .console import JsonLinesExporter

            out.append(JsonLinesExporter())
    out.extend(config.extra_exporters)
    return out
