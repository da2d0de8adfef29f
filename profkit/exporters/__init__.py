"""Exporters: where summaries go. Each receives every :class:`~profkit.WindowSummary`.

Built-in, by name in ``configure(exporters=...)``:

* ``"otel"``: one span per sampled call (a child of the request's span) and one per nested
  scope, via the global or given TracerProvider (:mod:`profkit.exporters.otel`).
* ``"log"``: structlog events ``profkit.profile`` and ``profkit.op`` carrying the span's
  ``trace_id`` / ``span_id`` (:mod:`profkit.exporters.logs`).
* ``"console"``: a readable table per call on stderr; ``"json"``: one JSON line per call on
  stdout (:mod:`profkit.exporters.console`).

Your own: subclass :class:`Exporter` and pass instances in
``configure(extra_exporters=[...])``. Spans are made first, whatever the order of the
exporters: every exporter receives summaries whose calls carry their span's ``trace_id`` and
``span_id`` when ``"otel"`` is on.

Shipping spans to a collector is the TracerProvider's job:
:func:`profkit.exporters.otlp.otlp_span_processor` builds an OTLP ``BatchSpanProcessor`` that
counts failed exports into ``profkit.stats()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._model import WindowSummary

__all__ = ["Exporter"]


class Exporter:
    """Base class of exporters: receives summaries on profkit's export thread.

    Each exporter runs on a thread of its own and gets each window when the others do, so
    one that is slow or hangs is cut off after ``export_timeout`` (and skipped while still
    stuck) without adding its time to the others'; what it raises is counted, never
    propagated. ``force_flush`` and ``shutdown`` get what is
    left of the caller's deadline.
    """

    #: the name used in ``stats()`` reasons (``export_error:<name>``); defaults to the class
    name: str = ""

    def export(self, summary: WindowSummary) -> None:
        """Ship one window's calls somewhere."""
        raise NotImplementedError

    def force_flush(self, timeout: float = 5.0) -> bool:
        """Deliver what is buffered within ``timeout`` seconds; True when all went out."""
        return True

    def shutdown(self, timeout: float = 5.0) -> None:
        """Release resources; called once, with what is left of ``shutdown()``'s deadline."""
        return None
