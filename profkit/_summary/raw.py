"""A fast reader of CPU-only profiles: kineto's raw events straight to summary input.

``prof.events()`` builds a ``FunctionEvent`` per event at 35-75 µs each; on a busy 2-core
server that CPU (and the GIL it holds) comes straight out of request throughput. For the
common case (CPU activity only, no memory profiling) this module reads kineto's raw events
at a few µs each and rebuilds the one thing the summary needs from torch's tree: self time.
It follows torch's own parser (``torch.autograd.profiler.profile._parse_kineto_results``
and ``EventList._populate_cpu_children``): the same filtered names, the same name rewrite,
the same async rule, the same per-thread nesting, so rows equal ``key_averages()`` (a test
compares them). Anything it does not cover (a device event) makes it return None, and the
caller falls back to ``prof.events()``.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Container, Iterable, Sequence
from typing import Any

import torch

from .events import RawEvent

__all__ = ["UNDECODABLE", "earliest_ops", "read_cpu_events", "without_frames"]

try:  # the same name rewrite torch applies ("ProfilerStep#3" -> "ProfilerStep*")
    from torch.autograd import profiler_util as _torch_util

    _torch_rewrite: Any = getattr(_torch_util, "_rewrite_name", None)
except ImportError:  # pragma: no cover - older or newer torch without it
    _torch_rewrite = None

_CPU: Any = getattr(getattr(torch, "autograd", None), "DeviceType", None)
if _CPU is not None:
    _CPU = _CPU.CPU

_FILTERED = frozenset(
    {
        "[memory]",
        "[OutOfMemory]",
        "profiler::_record_function_enter",
        "profiler::_record_function_enter_new",
        "profiler::_record_function_exit",
        "aten::is_leaf",
        "aten::output_nr",
        "aten::_version",
    }
)


#: the name given to an event whose name torch hands out as invalid UTF-8
UNDECODABLE = "<undecodable name>"

#: each raw name seen: its rewritten name, or None for a name torch filters out
_NAMES: dict[str, str | None] = {}
_NAMES_MAX = 4096
_UNSEEN = object()
_BY_START = operator.attrgetter("start_ns")
_BY_END = operator.attrgetter("end_ns")
_BY_THREAD = operator.attrgetter("thread")


def _rewrite(name: str) -> str | None:
    """torch's filter and name rewrite, memoised: a window repeats the same few names."""
    if name in _FILTERED:
        out = None
    else:
        out = name if _torch_rewrite is None else str(_torch_rewrite(name=name, with_wildcard=True))
    if len(_NAMES) < _NAMES_MAX:
        _NAMES[name] = out
    return out


def earliest_ops(raw: list[Any], with_stack: bool, max_events: int) -> tuple[list[Any], bool]:
    """A window's kineto events to read, and whether they were cut: ``with_stack``'s Python
    frames left out first (torch's Python tracer records every thread's, the export worker's
    too; they are for the trace file, not ops: as rows they would count profkit's and the
    model's Python calls as torch ops), then past ``max_events`` the earliest ``max_events``."""
    if with_stack and raw and hasattr(raw[0], "is_python_function"):
        raw = [k for k in raw if not k.is_python_function()]
    if len(raw) <= max_events:
        return raw, False
    return sorted(raw, key=lambda k: k.start_ns())[:max_events], True


def without_frames(events: Iterable[Any], with_stack: bool) -> list[Any]:
    """torch's parsed ``FunctionEvent``s, ``with_stack``'s Python frames left out."""
    if not with_stack:
        return list(events)
    return [e for e in events if not getattr(e, "is_python_function", False)]


def read_cpu_events(
    raw: Sequence[Any],
    with_shapes: bool,
    *,
    with_flops: bool = True,
    cpu_only: bool = False,
    marks: Container[str] | None = None,
) -> list[RawEvent] | None:
    """Summary input for a CPU-only profile, or None when an event needs torch's full parser.

    Each event costs a handful of calls into torch's bindings, so only what the summary
    reads is asked for: flops only when they were recorded (``with_flops``), the device only
    when a device activity was on (``cpu_only`` False), whether an event is a user range
    only for names that can be a scope's (``marks``, every name when None).
    """
    events: list[RawEvent] = []
    names, hidden = _NAMES, _hidden_check(raw)
    for k in raw:
        try:
            name = k.name()
        except UnicodeDecodeError:  # seen on torch 2.13: a mangled name in a with_stack profile
            name = UNDECODABLE
        out: Any = names.get(name, _UNSEEN)
        if out is _UNSEEN:
            out = _rewrite(name)
        if out is None or (hidden and k.is_hidden_event()):
            continue
        if not cpu_only and k.device_type() != _CPU:
            return None
        thread = k.start_thread_id()
        events.append(
            RawEvent(
                out,
                thread,
                k.start_ns(),
                k.end_ns(),
                k.is_async() or thread != k.end_thread_id(),
                (marks is None or out in marks) and bool(k.is_user_annotation()),
                (k.flops() or 0) if with_flops else 0,
                k.shapes() if with_shapes else None,
            )
        )
    _order(events)
    dropped = _nest(events)
    if dropped:
        gone = {id(ev) for ev in dropped}
        events = [ev for ev in events if id(ev) not in gone]
    return events


def _order(events: list[RawEvent]) -> None:
    """Sort into torch's final order, (start, -end); kineto's is usually that already."""
    starts = [ev.start_ns for ev in events]
    if starts == sorted(starts) and len(set(starts)) == len(starts):
        return  # sorted by start, no two equal: the end never decides
    events.sort(key=_BY_END, reverse=True)  # two stable sorts with C keys: (start, -end)
    events.sort(key=_BY_START)


def _hidden_check(raw: Sequence[Any]) -> bool:
    """Whether these events can say they are hidden (torch builds that have the method)."""
    return bool(raw) and hasattr(raw[0], "is_hidden_event")


def _nest(events: list[RawEvent]) -> list[RawEvent]:
    """Set each event's self time from its children, nesting per thread as torch does.

    An event's children are the events it encloses on its thread (an async event has none
    and is no one's child). As torch's parser does, an only child with its parent's name is
    folded into the parent (the parent takes its children). Returns the folded events.
    Nothing keeps a pointer up the tree: no reference cycle for the collector.
    """
    sync = [ev for ev in events if not ev.is_async]
    sync.sort(key=_BY_THREAD)  # stable: each thread's events stay in (start, -end) order
    dropped: list[RawEvent] = []
    for _, group in itertools.groupby(sync, key=_BY_THREAD):
        # an open event: [event, children, last child's entry, children's total ns, end]
        stack: list[list[Any]] = []
        for ev in group:
            start, end = ev.start_ns, ev.end_ns
            entry = [ev, 0, None, 0, end]
            while stack:
                top = stack[-1]
                if start >= top[4] or end > top[4]:
                    done = stack.pop()
                    if done[1]:  # a leaf's self time is its whole time: nothing to do
                        _close(done, dropped)
                    continue
                top[1] += 1
                top[2] = entry
                top[3] += end - start
                break
            stack.append(entry)
        for done in reversed(stack):
            if done[1]:
                _close(done, dropped)
    return dropped


def _close(entry: list[Any], dropped: list[RawEvent]) -> None:
    """An event's children are all known: fold an only child of the same name, set self time."""
    ev, count, last, child_ns, _ = entry
    if count == 1 and last[0].name == ev.name:
        dropped.append(last[0])
        # the child's children become this event's (kept in its entry: a chain folds up)
        count, last, child_ns = entry[1], entry[2], entry[3] = last[1], last[2], last[3]
    if count:
        ev.self_cpu_time_total = (ev.end_ns - ev.start_ns - child_ns) / 1000
