"""Structured log events through structlog: ``profkit.profile`` per call, ``profkit.op`` per row,
and for a batch (``profkit.batch``) one ``profkit.batch_member`` per member whose trace is
sampled, carrying that member's ids (its member span's, else its request span's).

The op rows are only in the ``profkit.op`` events (the ``"json"`` exporter's one line per
call keeps them as ``top_ops``), so that a call is one short line plus one line per row.

Both carry ``trace_id`` and ``span_id`` in OTel's hex form (the call's own span when spans are
on, else the request's span), so a log backend joins them to the trace, and ``start_time``:
when the call began (ISO 8601 UTC, µs; the span's start), as the events themselves are
emitted later, off the request path. The host application's structlog configuration
(processors, renderer) applies unchanged.
"""

from __future__ import annotations

from typing import Any

import structlog

from .._model import CallSummary, WindowSummary
from . import Exporter
from ._rows import batch_members, call_fields, op_dict

__all__ = ["LogExporter"]


def _ids(call: CallSummary) -> dict[str, str]:
    if call.trace_id:
        return {"trace_id": call.trace_id, "span_id": call.span_id}
    parent: Any = call.parent_span_context
    if parent is not None:
        return {"trace_id": f"{parent.trace_id:032x}", "span_id": f"{parent.span_id:016x}"}
    return {}


class LogExporter(Exporter):
    """Emits one ``profkit.profile`` event and ``top_k`` ``profkit.op`` events per call."""

    name = "log"

    def __init__(self, logger: Any = None) -> None:
        self._logger = logger

    def export(self, summary: WindowSummary) -> None:
        logger = self._logger if self._logger is not None else structlog.get_logger("profkit")
        bind = getattr(logger, "bind", None)
        if callable(bind):  # a lazy structlog proxy binds on every event: once per window here
            logger = bind()
        for call in summary.calls:
            ids = _ids(call)
            fields = call_fields(call, with_ops=False)  # each row is a profkit.op event
            if call.error is not None:
                logger.warning("profkit.profile", **ids, **fields)
            else:
                logger.info("profkit.profile", **ids, **fields)
            head = {**ids, "label": call.label, "start_time": fields["start_time"]}
            for rank, row in enumerate(call.root.ops, 1):
                logger.info("profkit.op", **head, rank=rank, **op_dict(row))
            if call.batch is not None:
                _members(logger, call, ids, head)


def _members(logger: Any, call: CallSummary, ids: dict[str, str], head: dict[str, Any]) -> None:
    """One ``profkit.batch_member`` event per member with a span, in that member's trace."""
    assert call.batch is not None
    root = call.root
    batch_ids = {f"batch_{key}": value for key, value in ids.items()}
    for member, entry in zip(call.batch.members, batch_members(call), strict=True):
        if not member.sampled or "span_id" not in entry:
            continue
        logger.info(
            "profkit.batch_member",
            **entry,
            label=head["label"],
            start_time=head["start_time"],
            duration_us=round(root.duration_us, 3),
            batch_size=call.batch.size,
            self_cpu_us=round(root.self_cpu_us * member.share, 3),
            **batch_ids,
        )
