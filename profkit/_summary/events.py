"""The events the summary reads: profkit's own raw event, the view of any event on the
epoch clock, and what a stopped window's read gives (or why it cannot be read). No torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = ["LOADER_RANGES", "EventView", "RawEvent", "Unreadable", "WindowEvents"]

#: torch's ranges around a data loader's ``__next__``: their self time (fetching rows in
#: Python, waiting for worker processes) is input, not op time; the ops inside are their own
LOADER_RANGES = ("enumerate(DataLoader)#", "enumerate(DataPipe)#")


def _range(ev: Any) -> tuple[float, float]:
    return ev.time_range.start, ev.time_range.end


class EventView:
    """The fields of one profiler event that the summary needs, on the epoch clock."""

    __slots__ = ("device", "end_ns", "ev", "id", "linked", "name", "start_ns", "thread", "user")

    def __init__(self, ev: Any, trace_start_ns: int) -> None:
        self.ev = ev
        self.name: str = ev.name
        self.thread: int = ev.thread
        span = _range(ev)
        self.start_ns = trace_start_ns + round(span[0] * 1000)
        self.end_ns = trace_start_ns + round(span[1] * 1000)
        self.device = str(getattr(ev, "device_type", "DeviceType.CPU")) != "DeviceType.CPU"
        self.user = bool(getattr(ev, "is_user_annotation", False))
        self.id: int = getattr(ev, "id", -1)
        self.linked: int = getattr(ev, "linked_correlation_id", 0) or 0


class RawEvent:
    """One CPU profiler event as profkit's reader gives it; the summary reads it as it is.

    It carries the fields of :class:`profkit._summary.builder.EventView` (times in epoch ns on the
    ``time.time_ns()`` clock, as kineto reports them) and the ``FunctionEvent`` fields the
    op rows add up (µs), so the summary needs no wrapper object per event. ``self`` time is
    set by the reader once the events are nested.
    """

    __slots__ = (
        "cpu_time_total",
        "end_ns",
        "flops",
        "input_shapes",
        "is_async",
        "name",
        "self_cpu_time_total",
        "start_ns",
        "thread",
        "user",
    )

    # what a CPU event without memory profiling has (EventView and FunctionEvent names)
    device = False
    device_type = "DeviceType.CPU"
    id = -1
    linked = 0
    linked_correlation_id = 0
    self_device_time_total = 0.0
    device_time_total = 0.0
    self_cpu_memory_usage = 0
    self_device_memory_usage = 0

    def __init__(
        self,
        name: str,
        thread: int,
        start_ns: int,
        end_ns: int,
        is_async: bool,
        user: bool,
        flops: int = 0,
        input_shapes: Any = None,
    ) -> None:
        self.name = name
        self.thread = thread
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.is_async = is_async
        self.user = user
        self.flops = flops
        self.input_shapes = input_shapes
        self.cpu_time_total: float = (end_ns - start_ns) / 1000
        self.self_cpu_time_total: float = 0.0 if is_async else self.cpu_time_total

    @property
    def ev(self) -> RawEvent:
        """The event an ``EventView`` wraps: this one is its own view."""
        return self

    @property
    def is_user_annotation(self) -> bool:
        return self.user


class Unreadable(Exception):
    """A stopped window whose events cannot be summarised; ``reason`` is the drop reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class WindowEvents(NamedTuple):
    """A stopped window's events, ready for the summary builder."""

    raw_count: int
    """Raw profiler events in the window (before filtering)."""
    trace_start_ns: int
    """The trace start on the ``time.time_ns()`` clock: event times are µs after it."""
    events: Sequence[Any]
    """``RawEvent``s from profkit's reader, or torch's ``FunctionEvent``s."""
    cut: bool = False
    """More than ``max_events`` were recorded: only the earliest ``max_events`` are here."""
    recording_s: float = 0.0
    """CPU seconds the profiler's per-op recording cost the recorded thread (an estimate)."""
