"""Events -> per-call scope trees with op tables. Runs on the export worker, never on a request.

Inputs are duck-typed like torch's ``FunctionEvent`` (``name``, ``thread``, ``time_range``,
``self_cpu_time_total``, ...) so the builder is tested on synthetic events as well as on real
profiles. Times in events are µs since the trace start; ``trace_start_ns`` anchors them to the
``time.time_ns()`` clock, so spans carry the profiler's own timing on OTel's clock.

Attribution of ops to a call: events on the call's thread inside the call's root range (and,
for a coroutine, inside the intervals in which its task was actually running); device events
through the correlation id of the CPU op that launched them. The per-op rows aggregate the
same fields as ``key_averages()``, so counts and self times match torch's own table.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from ._model import Attribution, AttrValue, CallSummary, OpRow, ScopeSummary
from ._window import CallRecord, ScopeRecord

__all__ = ["EventView", "build_calls", "clip", "rows_for", "top_rows"]

#: tolerance when matching a Python-timed scope to its profiler range (clock rounding)
_SLACK_NS = 200_000


class EventView:
    """The fields of one profiler event that the summary needs, on the epoch clock."""

    __slots__ = ("device", "end_ns", "ev", "id", "linked", "name", "start_ns", "thread", "user")

    def __init__(self, ev: Any, trace_start_ns: int) -> None:
        self.ev = ev
        self.name: str = ev.name
        self.thread: int = ev.thread
        self.start_ns = trace_start_ns + round(ev.time_range.start * 1000)
        self.end_ns = trace_start_ns + round(ev.time_range.end * 1000)
        self.device = str(getattr(ev, "device_type", "DeviceType.CPU")) != "DeviceType.CPU"
        self.user = bool(getattr(ev, "is_user_annotation", False))
        self.id: int = getattr(ev, "id", -1)
        self.linked: int = getattr(ev, "linked_correlation_id", 0) or 0


def clip(text: str, limit: int) -> str:
    """Bound a string's length (labels, op names and attribute values)."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def _shapes(ev: Any) -> str | None:
    shapes = getattr(ev, "input_shapes", None)
    return str(shapes) if shapes else None


def rows_for(events: Iterable[EventView], by_shapes: bool, limit: int) -> list[OpRow]:
    """Aggregate events by name (and shapes) exactly as ``EventList.key_averages`` adds them."""
    acc: dict[tuple[str, bool, str | None], list[Any]] = defaultdict(
        lambda: [0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0]
    )
    for view in events:
        ev = view.ev
        shapes = _shapes(ev) if by_shapes else None
        a = acc[(view.name, view.device, shapes)]
        a[0] += 1
        a[1] += ev.self_cpu_time_total
        a[2] += ev.cpu_time_total
        a[3] += _num(ev, "self_device_time_total")
        a[4] += _num(ev, "device_time_total")
        a[5] += int(_num(ev, "self_cpu_memory_usage"))
        a[6] += int(_num(ev, "self_device_memory_usage"))
        a[7] += int(getattr(ev, "flops", 0) or 0)
    return [
        OpRow(
            name=clip(name, limit),
            count=a[0],
            self_cpu_us=a[1],
            cpu_us=a[2],
            self_device_us=a[3],
            device_us=a[4],
            self_cpu_memory=a[5],
            self_device_memory=a[6],
            flops=a[7],
            shapes=clip(shapes, limit) if shapes else None,
            is_kernel=device,
        )
        for (name, device, shapes), a in acc.items()
    ]


def _num(ev: Any, attr: str) -> float:
    try:
        value = getattr(ev, attr, 0)
    except (AssertionError, AttributeError):  # torch asserts on odd device types
        return 0.0
    return float(value or 0)


def top_rows(rows: Sequence[OpRow], top_k: int) -> tuple[OpRow, ...]:
    """The ``top_k`` heaviest rows, plus one "other" row holding the rest so sums still add up.

    Rows are ranked by self device time when any was recorded, else by self CPU time.
    """
    by_device = any(r.self_device_us > 0 for r in rows)

    def weight(r: OpRow) -> tuple[float, float, str]:
        return (r.self_device_us if by_device else 0.0, r.self_cpu_us, r.name)

    ranked = sorted(rows, key=weight, reverse=True)
    head, tail = ranked[:top_k], ranked[top_k:]
    if not tail:
        return tuple(head)
    other = OpRow(
        name="other",
        count=sum(r.count for r in tail),
        self_cpu_us=sum(r.self_cpu_us for r in tail),
        cpu_us=sum(r.cpu_us for r in tail),
        self_device_us=sum(r.self_device_us for r in tail),
        device_us=sum(r.device_us for r in tail),
        self_cpu_memory=sum(r.self_cpu_memory for r in tail),
        self_device_memory=sum(r.self_device_memory for r in tail),
        flops=sum(r.flops for r in tail),
        is_other=True,
    )
    return (*head, other)


class _Index:
    """Events of one window, split by kind and sorted by start for range queries."""

    def __init__(self, views: list[EventView], labels: set[str]) -> None:
        self.scope_marks: dict[str, list[EventView]] = defaultdict(list)
        self.ops: list[EventView] = []
        self.device_by_link: dict[int, list[EventView]] = defaultdict(list)
        for v in views:
            if v.device:
                self.device_by_link[v.linked].append(v)
            elif v.user and v.name in labels:
                self.scope_marks[v.name].append(v)
            else:
                self.ops.append(v)
        self.ops.sort(key=lambda v: v.start_ns)
        self.starts = [v.start_ns for v in self.ops]

    def match_scope(self, record: ScopeRecord) -> EventView | None:
        """The profiler range of a Python-timed scope: same label, inside its Python bounds."""
        best: EventView | None = None
        for v in self.scope_marks.get(record.label, ()):
            if (
                v.start_ns >= record.start_ns - _SLACK_NS
                and v.end_ns <= record.end_ns + _SLACK_NS
                and (best is None or v.end_ns - v.start_ns > best.end_ns - best.start_ns)
            ):
                best = v
        return best

    def ops_between(self, start_ns: int, end_ns: int) -> list[EventView]:
        lo = bisect.bisect_left(self.starts, start_ns)
        hi = bisect.bisect_right(self.starts, end_ns)
        return [v for v in self.ops[lo:hi] if v.end_ns <= end_ns]


def _in_intervals(v: EventView, intervals: Sequence[tuple[int, int]]) -> bool:
    i = bisect.bisect_right(intervals, (v.start_ns, 1 << 63)) - 1
    return i >= 0 and intervals[i][0] <= v.start_ns and v.end_ns <= intervals[i][1] + _SLACK_NS


def _scope_events(
    index: _Index, span: tuple[int, int], threads: set[int] | None, intervals: Any
) -> list[EventView]:
    found = [
        v
        for v in index.ops_between(*span)
        if (threads is None or v.thread in threads)
        and (intervals is None or _in_intervals(v, intervals))
    ]
    device = [d for v in found for d in index.device_by_link.get(v.id, ())] if found else []
    return found + device


def build_calls(
    window_id: int,
    calls: Sequence[CallRecord],
    events: Sequence[Any],
    trace_start_ns: int,
    *,
    top_k: int,
    by_shapes: bool,
    all_threads: bool,
    limit: int,
    max_attributes: int,
) -> list[CallSummary]:
    """Build one :class:`CallSummary` per recorded (non-warm-up) call of a window."""
    labels = {s.label for c in calls for s in c.scopes}
    index = _Index([EventView(e, trace_start_ns) for e in events], labels)
    out = []
    for call in calls:
        if call.warmup or not call.scopes:
            continue
        out.append(
            _build_call(
                window_id, call, index, top_k, by_shapes, all_threads, limit, max_attributes
            )
        )
    return out


def _build_call(
    window_id: int,
    call: CallRecord,
    index: _Index,
    top_k: int,
    by_shapes: bool,
    all_threads: bool,
    limit: int,
    max_attributes: int,
) -> CallSummary:
    marks = [index.match_scope(s) for s in call.scopes]
    root_mark = marks[0]
    own_threads = {m.thread for m in marks if m is not None}
    intervals = sorted(call.intervals) if call.intervals else None
    attribution: Attribution = "task" if intervals is not None else "thread"
    threads: set[int] | None = own_threads or None
    if root_mark is None or all_threads:
        threads = None
        attribution = "window"
    scopes = []
    for i, (rec, mark) in enumerate(zip(call.scopes, marks, strict=True)):
        span = (mark.start_ns, mark.end_ns) if mark is not None else (rec.start_ns, rec.end_ns)
        scope_threads = {mark.thread} if (mark is not None and i > 0 and threads) else threads
        evs = _scope_events(index, span, scope_threads, intervals)
        rows = rows_for(evs, by_shapes, limit)
        cpu = [v for v in evs if not v.device]
        scopes.append(
            ScopeSummary(
                index=i,
                parent=rec.parent,
                label=clip(rec.label, limit),
                start_ns=span[0],
                end_ns=span[1],
                attributes=_bounded_attrs(rec.attributes, limit, max_attributes),
                ops=top_rows(rows, top_k),
                op_count=len(cpu),
                self_cpu_us=sum(r.self_cpu_us for r in rows if not r.is_kernel),
                self_device_us=sum(r.self_device_us for r in rows),
                code=rec.code,
                timing="profiler" if mark is not None else "python",
            )
        )
    device_active = any(r.is_kernel for s in scopes for r in s.ops)
    return CallSummary(
        window_id=window_id,
        call_index=call.index,
        label=scopes[0].label,
        scopes=tuple(scopes),
        parent_span_context=call.parent_span_context,
        policy=call.policy,
        attribution=attribution,
        error=call.error,
        thread_name=call.thread_name,
        device_active=device_active,
    )


def _bounded_attrs(attrs: dict[str, Any], limit: int, max_count: int) -> dict[str, AttrValue]:
    out: dict[str, AttrValue] = {}
    for key, value in list(attrs.items())[:max_count]:
        if isinstance(value, (bool, int, float)):
            out[clip(str(key), limit)] = value
        else:
            out[clip(str(key), limit)] = clip(str(value), limit)
    return out
