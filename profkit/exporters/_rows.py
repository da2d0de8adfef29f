"""Plain-data views of a call summary shared by the log, JSON and console exporters."""

from __future__ import annotations

import datetime
from typing import Any

from .._model import CallSummary, OpRow, ScopeSummary

__all__ = ["batch_members", "call_extras", "call_fields", "call_ids", "iso_time", "op_dict"]


def iso_time(epoch_ns: int) -> str:
    """An epoch time in ns as ISO 8601 UTC with µs: ``2026-12-01T05:30:00.123456Z``."""
    seconds, rest = divmod(epoch_ns, 1_000_000_000)
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{rest // 1000:06d}Z"


def op_dict(row: OpRow) -> dict[str, Any]:
    """One op row as a flat dict (µs rounded to 0.001, bytes and counts as ints)."""
    out: dict[str, Any] = {
        "op": row.name,
        "count": row.count,
        "self_cpu_us": round(row.self_cpu_us, 3),
        "cpu_us": round(row.cpu_us, 3),
    }
    if row.self_device_us or row.device_us:
        out["self_device_us"] = round(row.self_device_us, 3)
        out["device_us"] = round(row.device_us, 3)
    if row.self_cpu_memory or row.self_device_memory:
        out["self_cpu_memory"] = row.self_cpu_memory
        out["self_device_memory"] = row.self_device_memory
    if row.flops:
        out["flops"] = row.flops
    if row.shapes:
        out["shapes"] = row.shapes
    if row.is_kernel:
        out["kernel"] = True
    return out


def call_extras(call: CallSummary) -> dict[str, Any]:
    """The facts a call has only sometimes, by their log field names (spans prefix them)."""
    out: dict[str, Any] = {}
    if call.truncated:
        out["truncated"] = call.truncated
    if call.compile_us:
        out["compile_us"] = round(call.compile_us, 3)
    if call.compiled_labels:
        out["compiled_labels"] = list(call.compiled_labels)
    if call.trace_path:
        out["trace_path"] = call.trace_path
    if call.slow_threshold_ms is not None:
        out["slow_threshold_ms"] = round(call.slow_threshold_ms, 3)
    if call.unsampled_p50_ms is not None:
        out["unsampled_p50_ms"] = round(call.unsampled_p50_ms, 3)
    if call.cold:
        out["cold"] = True
    if call.batch is not None:
        out["batch_size"] = call.batch.size
    return out


def batch_members(call: CallSummary) -> list[dict[str, Any]]:
    """A batch's members: share, and the ids of each one's span (its member span once the
    span step made it, else the request's span; none for a member with no span)."""
    assert call.batch is not None
    out = []
    for m in call.batch.members:
        entry: dict[str, Any] = {"share": round(m.share, 6)}
        ctx: Any = m.span_context
        if m.span_id:
            entry.update(trace_id=m.trace_id, span_id=m.span_id)
        elif ctx is not None:
            entry.update(trace_id=f"{ctx.trace_id:032x}", span_id=f"{ctx.span_id:016x}")
        out.append(entry)
    return out


def call_fields(call: CallSummary, *, with_ops: bool = True) -> dict[str, Any]:
    """The fields of the ``profkit.profile`` event (without trace ids).

    ``with_ops`` False leaves out ``top_ops`` (the log exporter writes each row as an event).
    """
    root = call.root
    out: dict[str, Any] = {
        "label": call.label,
        "start_time": iso_time(root.start_ns),
        "duration_us": round(root.duration_us, 3),
        "op_count": root.op_count,
        "self_cpu_us": round(root.self_cpu_us, 3),
        "self_device_us": round(root.self_device_us, 3),
        "window_id": call.window_id,
        "policy": call.policy,
        "attribution": call.attribution,
        "regions": [_region(s, root.start_ns) for s in call.scopes[1:]],
    }
    if with_ops:
        out["top_ops"] = [op_dict(r) for r in root.ops]
    if call.error is not None:
        out["error"] = call.error_text.type if call.error_text else type(call.error).__name__
    out.update(call_extras(call))
    if call.batch is not None:
        out["batch_members"] = batch_members(call)
    if call.diagnosis is not None:
        d = call.diagnosis
        out["diagnosis"] = d.verdict
        out["diagnosis_reason"] = d.reason
        out["diagnosis_confidence"] = d.confidence
        out["amdahl"] = [
            {"what": w, "fraction": round(f, 4), "max_speedup": round(s, 3)} for w, f, s in d.amdahl
        ]
    return out


def _region(scope: ScopeSummary, root_start_ns: int) -> dict[str, Any]:
    """One nested scope of the event's ``regions``; ``error``, the exception's type, only
    when an exception left it."""
    out: dict[str, Any] = {
        "region": scope.label,
        "start_us": round((scope.start_ns - root_start_ns) / 1000.0, 3),
        "duration_us": round(scope.duration_us, 3),
        "parent": scope.parent,
    }
    if scope.error is not None:
        out["error"] = scope.error.type
    return out


def call_ids(call: CallSummary) -> dict[str, str]:
    """The ids a log line or JSON line joins on: the call's span's, or, when its span was not
    recorded (no ``"otel"``, a sampler's no), the request span's it ran under; else none."""
    if call.trace_id:
        return {"trace_id": call.trace_id, "span_id": call.span_id}
    parent: Any = call.parent_span_context
    if parent is not None:
        return {"trace_id": f"{parent.trace_id:032x}", "span_id": f"{parent.span_id:016x}"}
    return {}
