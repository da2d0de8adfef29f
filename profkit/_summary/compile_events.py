"""torch.compile's own events in a window: told apart from the model's ops (no torch).

A call that compiles a graph (the first call of a ``torch.compile``d model, or a recompile)
records the compiler at work: dynamo tracing the model with fake tensors, guard building,
the backend's passes and code generation. Hundreds of events, all nested in one outermost
event per compile (``dynamo`` on torch 2.13; ``_compile.compile_inner (dynamo_timed)`` on
older versions). They are not the model's ops: each outermost compile event becomes one
``torch.compile`` row of the scope's op table, and what ran inside it on its thread is left
out of the rows and of the op count.

A compiled graph that runs shows as ``Torch-Compiled Region: <compile id>``, with the ops it
runs (as torch reports them) inside it; the labels dynamo traced into that compile id
(:data:`profkit._records.COMPILED`) are the call's ``compiled_labels``.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from .._model import OpRow
from .._text import clean
from .compiled import COMPILED
from .events import EventView

__all__ = ["COMPILE_ROW", "compile_row", "compiled_labels", "fold_compiles", "is_compile_event"]

#: the op row that stands for torch.compile's own work (dynamo, inductor) in a scope
COMPILE_ROW = "torch.compile"
#: events that enclose a compile's work (the outermost of them is the one that counts)
_PHASES = frozenset({"dynamo", "entire_frame_compile", "backend_compile", "inductor_compile"})
_TIMED = " (dynamo_timed)"
#: a compiled graph running: "Torch-Compiled Region: <compile id>"
_COMPILED_REGION = "Torch-Compiled Region: "


def is_compile_event(name: str) -> bool:
    """Whether an event is one of torch.compile's phases (dynamo's ``dynamo_timed`` ones)."""
    return name in _PHASES or name.endswith(_TIMED)


def fold_compiles(
    ops: list[EventView], compiles: list[EventView]
) -> tuple[list[EventView], set[int]]:
    """``ops`` less what ran inside an outermost compile event on its thread, and the ids of
    those outermost events (kept in ``ops``: each becomes a ``torch.compile`` row)."""
    outer: dict[int, list[EventView]] = defaultdict(list)
    for c in sorted(compiles, key=lambda v: (v.start_ns, -v.end_ns)):
        spans = outer[c.thread]
        if not spans or c.end_ns > spans[-1].end_ns:
            spans.append(c)
    starts = {thread: [c.start_ns for c in spans] for thread, spans in outer.items()}
    kept = {id(c) for spans in outer.values() for c in spans}

    def compile_work(v: EventView) -> bool:
        spans = outer.get(v.thread)
        if not spans or id(v) in kept:
            return False
        i = bisect.bisect_right(starts[v.thread], v.start_ns) - 1
        return i >= 0 and v.end_ns <= spans[i].end_ns

    return [v for v in ops if not compile_work(v)], kept


def compile_row(compiles: list[EventView]) -> OpRow:
    """One row for a scope's compiles: how many, and their whole time (µs) as self time."""
    us = sum(c.end_ns - c.start_ns for c in compiles) / 1000.0
    return OpRow(name=COMPILE_ROW, count=len(compiles), self_cpu_us=us, cpu_us=us)


def compiled_labels(evs: list[EventView], limit: int) -> tuple[str, ...]:
    """The profkit labels traced into the compiled graphs that ran among ``evs``, sorted."""
    ids = {v.name[len(_COMPILED_REGION) :] for v in evs if v.name.startswith(_COMPILED_REGION)}
    return tuple(sorted({clean(label, limit) for i in ids for label in COMPILED.labels(i)}))
