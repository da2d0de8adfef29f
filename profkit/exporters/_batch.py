"""What a batch (``profkit.batch``) adds to the exports: links, member attributes, shares.

The batch's own span links the span of every member whose trace is sampled; each such
member gets a span of its own in its trace, named after the batch, with the batch's start
and end, its share and the batch's op rows scaled by that share (so that the ops of a
request's spans add up over the batches it was in).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from opentelemetry.trace import Link

from .._model import BatchMemberSummary, BatchSummary, CallSummary, OpRow

__all__ = ["batch_links", "member_attributes", "scaled_rows", "without_ids"]


def batch_links(call: CallSummary) -> list[Link] | None:
    """One link per member span of a batch call (None for any other call)."""
    if call.batch is None:
        return None
    return [Link(m.span_context) for m in call.batch.members if m.sampled]  # type: ignore[arg-type]


def scaled_rows(rows: Sequence[OpRow], share: float) -> list[OpRow]:
    """The rows with times, memory and flops times ``share`` (counts are the batch's)."""
    return [
        dataclasses.replace(
            r,
            self_cpu_us=r.self_cpu_us * share,
            cpu_us=r.cpu_us * share,
            self_device_us=r.self_device_us * share,
            device_us=r.device_us * share,
            self_cpu_memory=round(r.self_cpu_memory * share),
            self_device_memory=round(r.self_device_memory * share),
            flops=round(r.flops * share),
        )
        for r in rows
    ]


def member_attributes(call: CallSummary, member: BatchMemberSummary) -> dict[str, Any]:
    """profkit's attributes of a member's span (the op rows are added by the caller)."""
    assert call.batch is not None
    root = call.root
    attrs: dict[str, Any] = {
        "profkit.scope.label": call.label,
        "profkit.window.id": call.window_id,
        "profkit.batch.size": call.batch.size,
        "profkit.batch.share": round(member.share, 6),
        "profkit.batch.weighted": call.batch.weighted,
        "profkit.ops.scale": round(member.share, 6),
        "profkit.op_count": root.op_count,
        "profkit.self_cpu_us": round(root.self_cpu_us * member.share, 3),
        "profkit.sampling.policy": call.policy,
    }
    if root.self_device_us:
        attrs["profkit.self_device_us"] = round(root.self_device_us * member.share, 3)
    if call.diagnosis is not None:
        attrs["profkit.diagnosis.verdict"] = call.diagnosis.verdict
    return attrs


def without_ids(batch: BatchSummary) -> BatchSummary:
    """The batch with no member span ids (their spans reached no exporter)."""
    members = tuple(dataclasses.replace(m, trace_id="", span_id="") for m in batch.members)
    return dataclasses.replace(batch, members=members)
