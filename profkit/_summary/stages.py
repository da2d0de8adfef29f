"""A stage record (``capture_slow``: a slow call that no window watched) to a summary.

Runs on the export worker. The request path recorded the root call and each region it
entered on ``perf_counter_ns`` (:class:`profkit._records.StageWindow`); here they are put on
the epoch clock that spans use, nested by containment (a region inside another region's
time is its child; scopes are numbered in start order, so a parent always comes first),
bounded (the first :data:`MAX_STAGES` regions, then ``truncated = "max_stages"``) and
cleaned as a profile's scopes are. The summary has no op rows: every scope is
``timing="python"`` with no ops, the call's policy is ``"slow_stages"``.
"""

from __future__ import annotations

from typing import Any

from .._model import CallSummary, ScopeSummary, WindowSummary
from .._records import StageWindow
from .._text import clean
from .builder import _bounded_attrs, _clean_code, _error_text

__all__ = ["MAX_STAGES", "stage_summary"]

#: regions of one stage record kept (spans of one call), the earliest
MAX_STAGES = 256


def stage_summary(record: StageWindow, limit: int, max_attributes: int) -> WindowSummary:
    """The summary of one stage record (``limit``, ``max_attributes``: as for a profile)."""
    call = record.call
    offset = record.offset
    stages = sorted(record.stages, key=lambda s: (s[3], -s[4]))
    truncated = "max_stages" if len(stages) > MAX_STAGES else None
    stages = stages[:MAX_STAGES]
    error = _error_text(call.error, limit)
    scopes = [
        ScopeSummary(
            index=0,
            parent=-1,
            label=clean(record.label, limit),
            start_ns=record.start + offset,
            end_ns=record.end + offset,
            attributes=_bounded_attrs(record.attributes, limit, max_attributes),
            ops=(),
            op_count=0,
            self_cpu_us=0.0,
            self_device_us=0.0,
            code=_clean_code(record.code, limit),
            timing="python",
            error=error,
        )
    ]
    open_: list[tuple[int, int, int]] = []  # (index, start, end) of the regions around
    for label, attributes, code, start, end in stages:
        while open_ and not (open_[-1][1] <= start and end <= open_[-1][2]):
            open_.pop()
        index = len(scopes)
        scopes.append(
            ScopeSummary(
                index=index,
                parent=open_[-1][0] if open_ else 0,
                label=clean(label, limit),
                start_ns=start + offset,
                end_ns=end + offset,
                attributes=_bounded_attrs(_as_dict(attributes), limit, max_attributes),
                ops=(),
                op_count=0,
                self_cpu_us=0.0,
                self_device_us=0.0,
                code=_clean_code(code, limit),
                timing="python",
            )
        )
        open_.append((index, start, end))
    summary = CallSummary(
        window_id=record.id,
        call_index=0,
        label=scopes[0].label,
        scopes=tuple(scopes),
        parent_span_context=call.parent_span_context,
        policy=call.policy_name,
        attribution="thread",
        error=call.error,
        error_text=error,
        thread_name=call.thread_name,
        truncated=truncated,
        slow_threshold_ms=call.slow_threshold_ms,
        unsampled_p50_ms=call.unsampled_p50_ms,
    )
    return WindowSummary(record.id, (summary,), 0)


def _as_dict(attributes: Any) -> dict[str, Any]:
    return attributes if isinstance(attributes, dict) else {}
