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
from collections.abc import Sequence
from typing import Any

import torch

from ._records import RawEvent

__all__ = ["UNDECODABLE", "read_cpu_events"]

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

_REWRITTEN: dict[str, str] = {}
_REWRITE_CACHE_MAX = 4096


def _rewrite(name: str) -> str:
    """torch's name rewrite, memoised: a window repeats the same few op names thousands of times."""
    out = _REWRITTEN.get(name)
    if out is None:
        out = name if _torch_rewrite is None else str(_torch_rewrite(name=name, with_wildcard=True))
        if len(_REWRITTEN) < _REWRITE_CACHE_MAX:
            _REWRITTEN[name] = out
    return out


def read_cpu_events(
    raw: Sequence[Any], trace_start_ns: int, with_shapes: bool
) -> list[RawEvent] | None:
    """Summary input for a CPU-only profile, or None when an event needs torch's full parser."""
    events: list[RawEvent] = []
    cpu = _CPU
    for k in raw:
        try:
            name = k.name()
        except UnicodeDecodeError:  # seen on torch 2.13: a mangled name in a with_stack profile
            name = UNDECODABLE
        if name in _FILTERED or _hidden(k):
            continue
        if k.device_type() != cpu:
            return None
        events.append(RawEvent(k, trace_start_ns, _rewrite(name), with_shapes))
    events.sort(key=lambda e: (e.start_us, -e.end_us))  # torch's final order
    _nest(events)
    events = _remove_duplicates(events)
    for ev in events:  # children only point down from here: no cycle for the collector
        ev.parent = None
    return events


def _hidden(k: Any) -> bool:
    hidden = getattr(k, "is_hidden_event", None)
    return bool(hidden()) if hidden is not None else False


def _nest(events: list[RawEvent]) -> None:
    """Per thread, make each event a child of its innermost enclosing event (torch's rule)."""
    sync = sorted((e for e in events if not e.is_async), key=lambda e: e.thread)
    for _, group in itertools.groupby(sync, key=lambda e: e.thread):
        stack: list[RawEvent] = []
        for ev in sorted(group, key=lambda e: (e.start_us, -e.end_us)):
            while stack:
                parent = stack[-1]
                if ev.start_us >= parent.end_us or ev.end_us > parent.end_us:
                    stack.pop()
                else:
                    if parent.children is None:
                        parent.children = []
                    parent.children.append(ev)
                    ev.parent = parent
                    break
            stack.append(ev)


def _remove_duplicates(events: list[RawEvent]) -> list[RawEvent]:
    """Fold an only child that repeats its parent's name into the parent, as torch does."""
    while True:
        dropped: set[int] = set()
        for ev in events:
            parent = ev.parent
            siblings = parent.children if parent is not None else None
            if parent is not None and parent.name == ev.name and siblings and len(siblings) == 1:
                parent.children = ev.children
                for child in ev.children or ():
                    child.parent = parent
                dropped.add(id(ev))
        if not dropped:
            return events
        events = [ev for ev in events if id(ev) not in dropped]
