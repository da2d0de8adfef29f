"""Structured log events through structlog: ``profkit.profile`` per call, ``profkit.op`` per row,
and for a batch (``profkit.batch``) one ``profkit.batch_member`` per member whose trace is
sampled, carrying that member's ids (its member span's, else its request span's).

The op rows are only in the ``profkit.op`` events (the ``"json"`` exporter's one line per
call keeps them as ``top_ops``), so that a call is one short line plus one line per row.

With structlog not configured (``structlog.is_configured()`` false: its default renderer
writes every key of every event on stdout, mixed into the service's own output), each call
is one compact ``profkit.profile`` event instead: label, duration, diagnosis, the top
:data:`COMPACT_OPS` ops by self CPU time, and the ids. The full rows go to a configured
structlog (or the logger given) and to the ``"json"`` exporter. ``python -m profkit report``
reads the compact lines (:func:`parse_compact`) as well as JSON lines.

Both carry ``trace_id`` and ``span_id`` in OTel's hex form (the call's own span when spans are
on, else the request's span), so a log backend joins them to the trace, and ``start_time``:
when the call began (ISO 8601 UTC, µs; the span's start), as the events themselves are
emitted later, off the request path. The host application's structlog configuration
(processors, renderer) applies unchanged.
"""

from __future__ import annotations

import ast
import inspect
import logging
import re
from collections.abc import Mapping
from typing import Any

import structlog

from .._model import CallSummary, WindowSummary
from . import Exporter
from ._rows import batch_members, call_fields, call_ids, op_dict

__all__ = ["COMPACT_OPS", "LogExporter", "compact_fields", "parse_compact"]

#: ops in a compact ``profkit.profile`` line
COMPACT_OPS = 3


class LogExporter(Exporter):
    """Emits one ``profkit.profile`` event and ``top_k`` ``profkit.op`` events per call."""

    name = "log"

    def __init__(self, logger: Any = None) -> None:
        self._logger = _structured(logger)

    def export(self, summary: WindowSummary) -> None:
        compact = self._logger is None and not structlog.is_configured()
        logger = self._logger if self._logger is not None else structlog.get_logger("profkit")
        bind = getattr(logger, "bind", None)
        if callable(bind):  # a lazy structlog proxy binds on every event: once per window here
            logger = bind()
        for call in summary.calls:
            if compact:
                emit = logger.warning if call.error is not None else logger.info
                emit("profkit.profile", **compact_fields(call))
                continue
            ids = call_ids(call)
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


#: ``structlog.wrap_logger``'s own parameters (its other keyword arguments are the context)
_WRAP_ARGS = frozenset(inspect.signature(structlog.wrap_logger).parameters)


def _structured(logger: Any) -> Any:
    """A stdlib ``logging.Logger`` (or ``LoggerAdapter``) wrapped in structlog's stdlib
    ``BoundLogger``: its ``info(msg)`` takes no event fields (``TypeError`` on every call, so
    every sampled call was dropped); wrapped, the events go through the host application's
    structlog processors and reach that logger as one message each.

    A plain ``LoggerAdapter`` (its ``process()`` not overridden) is unwrapped: its logger is
    wrapped, its ``extra`` are event fields. Its ``process()`` would replace the ``extra``
    that structlog's ``ProcessorFormatter`` finds its events by, and each event would be
    rendered as the text of a dict.
    """
    if (
        isinstance(logger, logging.LoggerAdapter)
        and type(logger).process is logging.LoggerAdapter.process
        and isinstance(logger.logger, logging.Logger)
    ):
        extra = logger.extra if isinstance(logger.extra, Mapping) else {}
        fields: dict[str, Any] = {  # (a key named as one of wrap_logger's own is left out)
            k: v for k, v in extra.items() if isinstance(k, str) and k not in _WRAP_ARGS
        }
        return structlog.wrap_logger(
            logger.logger, wrapper_class=structlog.stdlib.BoundLogger, **fields
        )
    if isinstance(logger, logging.Logger | logging.LoggerAdapter):
        return structlog.wrap_logger(logger, wrapper_class=structlog.stdlib.BoundLogger)
    return logger


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


def compact_fields(call: CallSummary) -> dict[str, Any]:
    """The fields of a compact ``profkit.profile`` event: short values, no nested rows."""
    root = call.root
    rows = [r for r in root.ops if r.name != "other"][:COMPACT_OPS]
    out: dict[str, Any] = {"label": call.label, "duration_ms": round(root.duration_us / 1e3, 3)}
    if call.diagnosis is not None:
        out["diagnosis"] = call.diagnosis.verdict
        if call.diagnosis.confidence != "high":
            out["confidence"] = call.diagnosis.confidence
    if call.error is not None:
        out["error"] = call.error_text.type if call.error_text else type(call.error).__name__
    out["ops"] = ", ".join(f"{r.name} {r.self_cpu_us:.1f}us" for r in rows)
    out.update(call_ids(call))
    return out


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PAIR = re.compile(r"""(\w+)=('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\S+)""")
_OP = re.compile(r"^(?P<name>.+) (?P<us>[0-9.]+)us$")


def parse_compact(line: str) -> dict[str, Any] | None:
    """A compact ``profkit.profile`` line as rendered by structlog's default console renderer
    (``... [info     ] profkit.profile   duration_ms=1.352 label=/predict ops='...'``), as
    the dict the ``"json"`` exporter would have written for it (``duration_us``,
    ``top_ops``); None for any other line."""
    text = _ANSI.sub("", line)
    head, sep, tail = text.partition(" profkit.profile ")
    if not sep or "]" not in head:
        return None
    event: dict[str, Any] = {"event": "profkit.profile"}
    for key, raw in _PAIR.findall(tail):
        event[key] = _text(raw)
    try:
        event["duration_us"] = float(event.pop("duration_ms")) * 1e3
    except (KeyError, ValueError, OverflowError):
        event["duration_us"] = None  # what the report counts as unreadable
    if "confidence" in event:
        event["diagnosis_confidence"] = event.pop("confidence")
    ops = event.pop("ops", "")
    event["top_ops"] = [_op(part) for part in str(ops).split(", ") if part]
    return event


def _text(raw: str) -> str:
    """A value as structlog's console renderer wrote it: a ``repr()`` when quoted."""
    if raw[:1] in "'\"":
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return raw
        return value if isinstance(value, str) else raw
    return raw


def _op(part: str) -> dict[str, Any]:
    found = _OP.match(part)
    if found is None:
        return {"op": part, "self_cpu_us": None}
    return {"op": found["name"], "self_cpu_us": float(found["us"])}
