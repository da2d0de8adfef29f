"""Embedded default outputs that need no collector: a readable table, or JSON lines."""

from __future__ import annotations

import json
import sys
from typing import IO

from .._model import CallSummary, WindowSummary
from .._text import escape
from .._weak import renewed_at_fork
from . import Exporter
from ._rows import call_fields, call_ids

__all__ = ["ConsoleExporter", "JsonLinesExporter", "render_call"]


def render_call(call: CallSummary) -> str:
    """A readable block: the call, its regions, its diagnosis and its top op rows.

    Control characters in what it shows (labels, op names, paths) are printed as escapes
    (``\\x1b``), so nothing in a summary can drive the terminal.
    """
    root = call.root
    lines = [
        f"profkit ▸ {call.label}  {root.duration_us / 1000:.3f} ms  "
        f"{root.op_count} ops  window {call.window_id} ({call.policy}, {call.attribution})"
        + (f"  ERROR {_error_type(call)}" if call.error is not None else "")
        + (f"  truncated: {call.truncated}" if call.truncated else ""),
    ]
    if call.trace_id:
        lines.append(f"  trace {call.trace_id} span {call.span_id}")
    if call.batch is not None:
        shares = ", ".join(f"{m.share:.3g}" for m in call.batch.members[:8])
        more = " ..." if call.batch.size > 8 else ""
        lines.append(f"  batch of {call.batch.size} requests, shares {shares}{more}")
    for scope in call.scopes[1:]:
        depth = _depth(call, scope.index)
        lines.append(f"  {'  ' * depth}region {scope.label:<24} {scope.duration_us / 1000:9.3f} ms")
    if call.compile_us:
        lines.append(f"  torch.compile compiled in this call: {call.compile_us / 1e3:.3f} ms")
    if call.compiled_labels:
        lines.append(f"  compiled away (no span): {', '.join(call.compiled_labels)}")
    if call.diagnosis is not None:
        d = call.diagnosis
        sure = "" if d.confidence == "high" else f" ({d.confidence} confidence)"
        lines.append(f"  diagnosis: {d.verdict}{sure} — {d.reason}")
        for what, frac, speedup in call.diagnosis.amdahl[:3]:
            lines.append(f"    {what:<30} {frac:6.1%} of the call, at best {speedup:.2f}x if free")
    device = any(r.self_device_us for r in root.ops)
    head = f"  {'op':<34} {'count':>6} {'self cpu us':>12} {'total cpu us':>13}"
    lines.append(head + (f" {'self dev us':>12}" if device else ""))
    for row in root.ops:
        line = f"  {row.name[:34]:<34} {row.count:>6} {row.self_cpu_us:>12.1f} {row.cpu_us:>13.1f}"
        lines.append(line + (f" {row.self_device_us:>12.1f}" if device else ""))
    return "\n".join(escape(line) for line in lines)


def _error_type(call: CallSummary) -> str:
    return call.error_text.type if call.error_text is not None else type(call.error).__name__


def _depth(call: CallSummary, index: int) -> int:
    depth = 0
    while call.scopes[index].parent > 0:
        index = call.scopes[index].parent
        depth += 1
    return depth


class _StreamExporter(Exporter):
    """Writes each sampled call, rendered, to a text stream (resolved at export time)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream
        self._lock = renewed_at_fork(self)

    def _default_stream(self) -> IO[str]:
        raise NotImplementedError

    def _render(self, call: CallSummary) -> str:
        raise NotImplementedError

    def export(self, summary: WindowSummary) -> None:
        stream = self._stream or self._default_stream()
        with self._lock:
            for call in summary.calls:
                stream.write(self._render(call))
            stream.flush()


class ConsoleExporter(_StreamExporter):
    """Prints :func:`render_call` for every sampled call (stderr by default)."""

    name = "console"

    def _default_stream(self) -> IO[str]:
        return sys.stderr

    def _render(self, call: CallSummary) -> str:
        return render_call(call) + "\n\n"


class JsonLinesExporter(_StreamExporter):
    """Writes one JSON object per sampled call (stdout by default)."""

    name = "json"

    def _default_stream(self) -> IO[str]:
        return sys.stdout

    def _render(self, call: CallSummary) -> str:
        record = {"event": "profkit.profile", **call_fields(call), **call_ids(call)}
        return json.dumps(record, default=str) + "\n"
