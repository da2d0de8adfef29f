"""A stopped window's events, read on the export worker (:meth:`profkit._capture.window.
Window.read`): profkit's reader for CPU profiles, torch's parser for the rest."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._summary.events import Unreadable, WindowEvents
from .._summary.raw import earliest_ops, without_frames
from .profiler import cpu_only

__all__ = ["read_events"]


def read_events(
    win: Any, per_event: float, read_cpu_events: Callable[..., list[Any] | None]
) -> WindowEvents:
    """The events of the stopped window ``win`` (see ``Window.read``); ``per_event``: the
    CPU seconds recording added per event (the budget's estimate); ``read_cpu_events``:
    profkit's reader (:func:`profkit._summary.raw.read_cpu_events`, as the window module
    holds it)."""
    prof, cfg = win.prof, win.config
    if prof is None:
        raise Unreadable("no_profile")
    if win.clobbered:  # torch gives the outer profiler no events once another started
        raise Unreadable("foreign_profiler")
    kineto = prof.profiler.kineto_results if prof.profiler is not None else None
    raw = kineto.events() if kineto is not None else []
    if win.resumed_ns:  # a resident session's: what its earlier windows recorded stays out
        raw = [k for k in raw if k.start_ns() >= win.resumed_ns]
    count = len(raw)  # (torch's parser reads with_stack's Python frames: not left out)
    raw, cut = earliest_ops(raw, cfg.with_stack and not cfg.profile_memory, cfg.max_events)
    trace_start = kineto.trace_start_ns() if kineto is not None else win.started_ns
    events: Sequence[Any] | None = None
    if not cfg.profile_memory:  # memory records need torch's own parser
        events = read_cpu_events(
            raw,
            cfg.record_shapes,
            with_flops=cfg.with_flops,
            cpu_only=cpu_only(cfg.activities),
            marks={s.label for c in win.calls for s in c.scopes},
        )
    if events is None:
        if count > cfg.max_events:  # torch's parser would read every event
            raise Unreadable("too_many_events")
        events = without_frames(prof.events(), cfg.with_stack)
    return WindowEvents(count, trace_start, events, cut, count * per_event)
