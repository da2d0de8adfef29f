"""Events -> per-call scope trees with op tables. Runs on the export worker, never on a request.

Inputs are duck-typed like torch's ``FunctionEvent`` (``name``, ``thread``, ``time_range``,
``self_cpu_time_total``, ...) so the builder is tested on synthetic events as well as on real
profiles. Times in events are µs since the trace start; ``trace_start_ns`` anchors them to the
``time.time_ns()`` clock, so spans carry the profiler's own timing on OTel's clock.

Attribution of ops to a call (the rule ``CallSummary.attribution`` reports):

* ``"thread"``: ops on the call's own thread inside its root range, plus ops on any other
  thread inside one of the call's own nested scopes (a region or decorated function run in
  the call's copied context, e.g. via ``asyncio.to_thread``; recorded with ``all_threads``).
* ``"task"``: the same, but ops on the call's own thread count only inside the intervals in
  which its coroutine (or generator) was actually running, so other tasks are left out.
* ``"window"``: exactness is impossible: with ``all_threads`` and no scope of the call on
  another thread, every thread's ops in the root range are taken (another request's may be
  among them); or the root's profiler range was not found; or the root, a ``region()`` in a
  task, let its event loop run other callbacks (``CallRecord.interleaved``).

Device events join through the CPU op that launched them; rows aggregate as ``key_averages``
does; an unreadable event is skipped rather than failing the window."""

from __future__ import annotations

import bisect
import math
import operator
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, cast

from .._model import Attribution, AttrValue, CallSummary, CodeInfo, ErrorText, OpRow, ScopeSummary
from .._records import CallRecord, ScopeRecord
from .._text import as_label, clean
from .compile_events import compile_row, compiled_labels, fold_compiles, is_compile_event
from .events import LOADER_RANGES, EventView, RawEvent
from .steps import in_intervals, merged, steps_of

__all__ = ["build_calls", "rows_for", "top_rows"]

_BY_START = operator.attrgetter("start_ns")
#: tolerance when matching a Python-timed scope to its profiler range (clock rounding)
_SLACK_NS = 200_000


def _shapes(ev: Any) -> str | None:
    shapes = getattr(ev, "input_shapes", None)
    return str(shapes) if shapes else None


def rows_for(events: Iterable[EventView], by_shapes: bool, limit: int) -> list[OpRow]:
    """Aggregate events by name (and shapes) exactly as ``EventList.key_averages`` adds them."""
    acc: dict[tuple[str, bool, str | None], list[Any]] = defaultdict(
        lambda: [0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0]
    )
    view: Any
    for view in events:
        if type(view) is RawEvent:  # profkit's own reader: plain CPU fields, no device or memory
            a = acc[(view.name, False, _shapes(view) if by_shapes else None)]
            a[0] += 1
            a[1] += view.self_cpu_time_total
            a[2] += view.cpu_time_total
            a[7] += view.flops
            continue
        ev = view.ev
        shapes = _shapes(ev) if by_shapes else None
        a = acc[(view.name, view.device, shapes)]
        a[0] += 1
        a[1] += _num(ev, "self_cpu_time_total")
        a[2] += _num(ev, "cpu_time_total")
        a[3] += _num(ev, "self_device_time_total")
        a[4] += _num(ev, "device_time_total")
        a[5] += int(_num(ev, "self_cpu_memory_usage"))
        a[6] += int(_num(ev, "self_device_memory_usage"))
        a[7] += int(_num(ev, "flops"))
    return [
        OpRow(
            name=clean(name, limit),  # once per distinct row, not per event
            count=a[0],
            self_cpu_us=a[1],
            cpu_us=a[2],
            self_device_us=a[3],
            device_us=a[4],
            self_cpu_memory=a[5],
            self_device_memory=a[6],
            flops=a[7],
            shapes=clean(shapes, limit) if shapes else None,
            is_kernel=device,
        )
        for (name, device, shapes), a in acc.items()
    ]


def _num(ev: Any, attr: str) -> float:
    try:
        value = float(getattr(ev, attr, 0) or 0)
    except (AssertionError, AttributeError, TypeError, ValueError):  # torch asserts on odd types
        return 0.0
    return value if math.isfinite(value) else 0.0


def top_rows(rows: Sequence[OpRow], top_k: int) -> tuple[OpRow, ...]:
    """The ``top_k`` heaviest rows, plus one "other" row holding the rest so sums still add up.

    Rows are ranked by self device time when any was recorded, else by self CPU time. A data
    loader's range is never in "other" (the diagnosis reads its time as input; on a device,
    where it has no time of its own, it would rank last).
    """
    by_device = any(r.self_device_us > 0 for r in rows)

    def weight(r: OpRow) -> tuple[float, float, str]:
        return (r.self_device_us if by_device else 0.0, r.self_cpu_us, r.name)

    ranked = sorted(rows, key=weight, reverse=True)
    head, tail = ranked[:top_k], ranked[top_k:]
    head += [r for r in tail if r.name.startswith(LOADER_RANGES)]
    tail = [r for r in tail if not r.name.startswith(LOADER_RANGES)]
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
        compiles: list[EventView] = []
        for v in views:
            if v.device:
                self.device_by_link[v.linked].append(v)
            elif v.user and v.name in labels:
                self.scope_marks[v.name].append(v)
            else:
                self.ops.append(v)
                if is_compile_event(v.name):
                    compiles.append(v)
        #: ids of the outermost compile events: each stands for the compile work inside it
        self.compiles: set[int] = set()
        if compiles:
            self.ops, self.compiles = fold_compiles(self.ops, compiles)
        self.ops.sort(key=_BY_START)
        self.starts = [v.start_ns for v in self.ops]
        #: ids of the scope ranges already matched to a scope (:meth:`match_scope`)
        self.taken: set[int] = set()

    def match_scope(self, record: ScopeRecord) -> EventView | None:
        """The profiler range of a Python-timed scope: same label, inside its Python bounds
        (with the slack), the closest to them, and none an earlier scope took. Scopes of one
        label nest (recursion) or overlap (gathered coroutines): an inner scope's bounds may
        hold the outer's range too, but its own range fits closest (Python times it just
        outside the range), and a range serves one scope."""
        best: EventView | None = None
        best_gap = 0
        start, end, taken = record.start_ns, record.end_ns, self.taken
        for v in self.scope_marks.get(record.label, ()):
            if v.start_ns < start - _SLACK_NS or v.end_ns > end + _SLACK_NS or id(v) in taken:
                continue
            gap = abs(v.start_ns - start) + abs(v.end_ns - end)
            if best is None or gap < best_gap:
                best, best_gap = v, gap
        if best is not None:
            taken.add(id(best))
        return best

    def split_compiles(self, evs: list[EventView]) -> tuple[list[EventView], list[EventView]]:
        """A scope's events as (ops, outermost compile events)."""
        if not self.compiles:
            return evs, []
        done = self.compiles
        return [v for v in evs if id(v) not in done], [v for v in evs if id(v) in done]

    def ops_between(self, start_ns: int, end_ns: int) -> list[EventView]:
        lo = bisect.bisect_left(self.starts, start_ns)
        hi = bisect.bisect_right(self.starts, end_ns)
        return [v for v in self.ops[lo:hi] if v.end_ns <= end_ns]


def _events_in(
    index: _Index,
    span: tuple[int, int],
    thread: int | None,
    intervals: Sequence[tuple[int, int]] | None,
    home: int | None,
) -> list[EventView]:
    """Ops in ``span`` on ``thread`` (None: any); on the home thread only inside ``intervals``."""
    return [
        v
        for v in index.ops_between(*span)
        if (thread is None or v.thread == thread)
        and (
            intervals is None
            or (home is not None and v.thread != home)
            or in_intervals(v, intervals)
        )
    ]


def _with_device(index: _Index, found: list[EventView]) -> list[EventView]:
    """``found`` plus the device events launched by its ops.

    As in torch's own parsing, only an op without a linked correlation id of its own (an
    aten/frontend op, not a runtime call such as ``cudaLaunchKernel``) owns device events:
    runtime calls carry ids from another counter, which may collide with an op's id.
    """
    if not index.device_by_link:  # a CPU-only window: nothing to look up per op
        return found
    device = [d for v in found if v.linked == 0 for d in index.device_by_link.get(v.id, ())]
    return found + device


def _views(events: Sequence[Any], trace_start_ns: int) -> list[EventView]:
    """Views of the events whose fields can be read; a malformed event is skipped.

    The events of profkit's own reader are their own views (no object per event).
    """
    if set(map(type, events)) == {RawEvent}:
        return cast("list[EventView]", list(events))
    views = []
    for e in events:
        try:
            view = EventView(e, trace_start_ns)
        except (AttributeError, TypeError, ValueError, OverflowError, AssertionError):
            continue
        if isinstance(view.name, str) and isinstance(view.thread, int):
            views.append(view)
    return views


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
    index = _Index(_views(events, trace_start_ns), labels)
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
    intervals = merged(call.intervals) if call.intervals else None
    attribution, per_scope = _attribute(index, call, marks, intervals, all_threads)
    scopes = []
    compile_us = 0.0
    error_text = _error_text(call.error, limit)  # (a raising call's leaves each scope)
    for i, (rec, mark) in enumerate(zip(call.scopes, marks, strict=True)):
        span = (mark.start_ns, mark.end_ns) if mark is not None else (rec.start_ns, rec.end_ns)
        evs, compiles = index.split_compiles(per_scope[i])
        rows = rows_for(evs, by_shapes, limit)
        if compiles:
            rows.append(compile_row(compiles))
            if i == 0:  # the root's (scopes are inclusive)
                compile_us = rows[-1].self_cpu_us
        cpu = [v for v in evs if not v.device]
        scopes.append(
            ScopeSummary(
                index=i,
                parent=rec.parent,
                label=clean(rec.label, limit),
                start_ns=span[0],
                end_ns=span[1],
                attributes=_bounded_attrs(rec.attributes, limit, max_attributes),
                ops=top_rows(rows, top_k),
                op_count=len(cpu),  # the compile row is not an op
                self_cpu_us=sum(r.self_cpu_us for r in rows if not r.is_kernel),
                # device events only: a CPU op's device time mirrors the kernels it launched
                self_device_us=sum(r.self_device_us for r in rows if r.is_kernel),
                code=_clean_code(rec.code, limit),
                timing="profiler" if mark is not None else "python",
                error=error_text if rec.error is call.error else _error_text(rec.error, limit),
            )
        )
    device_active = any(v.device for evs in per_scope for v in evs)
    return CallSummary(
        window_id=window_id,
        call_index=call.index,
        label=scopes[0].label,
        scopes=tuple(scopes),
        parent_span_context=call.parent_span_context,
        policy=call.policy_name,
        attribution=attribution,
        error=call.error,
        error_text=error_text,
        thread_name=call.thread_name,
        truncated=call.truncated,
        slow_threshold_ms=call.slow_threshold_ms,
        unsampled_p50_ms=call.unsampled_p50_ms,
        cold=call.cold,
        device_active=device_active,
        compile_us=compile_us,
        compiled_labels=compiled_labels(per_scope[0], limit),
        batch=call.batch,
    )


def _attribute(
    index: _Index,
    call: CallRecord,
    marks: list[EventView | None],
    intervals: Sequence[tuple[int, int]] | None,
    all_threads: bool,
) -> tuple[Attribution, list[list[EventView]]]:
    """The attribution rule (see the module docstring) and each scope's ops, inclusive."""
    root, root_mark = call.scopes[0], marks[0]
    home = root_mark.thread if root_mark is not None else None
    elsewhere = any(m is not None and m.thread != home for m in marks[1:])
    exact = root_mark is not None and (elsewhere or not all_threads)
    own: list[list[EventView]] = []
    memo: dict[int, list[tuple[int, int]]] = {}  # each task's merged steps, once
    for i, (rec, mark) in enumerate(zip(call.scopes, marks, strict=True)):
        span = (mark.start_ns, mark.end_ns) if mark is not None else (rec.start_ns, rec.end_ns)
        steps = steps_of(call, i, intervals, memo)
        if mark is None and rec.thread != root.thread:
            own.append([])  # it ran on a thread the profiler did not record
        elif exact:
            own.append(_events_in(index, span, mark.thread if mark else home, steps, home))
        else:
            own.append(_events_in(index, span, None, steps, home))
    if len(own) == 1:  # the root alone: nothing to merge
        per_scope = [_with_device(index, own[0])]
    else:
        # scopes are numbered in entry order, so a child always comes after its parent
        inclusive: list[dict[int, EventView]] = [{id(v): v for v in evs} for evs in own]
        for i in range(len(own) - 1, 0, -1):
            inclusive[call.scopes[i].parent].update(inclusive[i])
        per_scope = [_with_device(index, list(found.values())) for found in inclusive]
    if not exact or call.interleaved:
        return "window", per_scope
    return ("task" if intervals is not None else "thread"), per_scope


def _bounded_attrs(attrs: dict[str, Any], limit: int, max_count: int) -> dict[str, AttrValue]:
    """Bound user attributes by count, size and type (OTLP fails a batch on an int it cannot
    carry): bools, floats (nan, inf too) and int64 ints stay; the rest is a bounded string."""
    out: dict[str, AttrValue] = {}
    for key, value in list(attrs.items())[:max_count]:
        name = clean(as_label(key), limit)  # (a str() that raises: the type's name)
        if not name:  # an empty key: OTel's SDK would drop it with a warning on every span
            continue
        if isinstance(value, (bool, float)) or (
            isinstance(value, int) and -(2**63) <= value < 2**63
        ):
            out[name] = value
        else:
            out[name] = clean(as_label(value), limit)
    return out


def _error_text(error: BaseException | None, limit: int) -> ErrorText | None:
    return ErrorText.of(error, limit) if error is not None else None


def _clean_code(code: CodeInfo | None, limit: int) -> CodeInfo | None:
    if code is None:
        return None
    path = clean(code.file_path, limit, keep_end=True)
    return CodeInfo(
        function=clean(code.function, limit), file_path=path, line_number=code.line_number
    )
