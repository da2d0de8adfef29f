"""Processing on the export worker: one stopped window to one summary.

Read the window's events (:meth:`Window.read`), build the per-call summaries
(:mod:`profkit._summary.builder`), write the Chrome trace file when asked, diagnose each call
(:mod:`profkit._summary.diagnosis`). A stage record (``capture_slow``) has no events: its
summary is its regions (:mod:`profkit._summary.stages`), with no diagnosis. Nothing here
runs on a request's thread.
"""

from __future__ import annotations

import dataclasses

from .._config import Config
from .._errors import guard
from .._model import CallSummary, Diagnosis, WindowSummary
from .._records import StageWindow, StoppedWindow
from .._stats import Stats
from .._summary.builder import build_calls
from .._summary.diagnosis import Thresholds, diagnose
from .._summary.events import Unreadable
from .._summary.stages import stage_summary
from .._text import clean
from ..exporters.chrome import TraceFileWriter

__all__ = ["Processor"]


class Processor:
    """Turns the stopped windows of one session into :class:`WindowSummary` objects."""

    def __init__(self, config: Config, stats: Stats) -> None:
        self.config = config
        self.stats = stats
        self._thresholds = Thresholds.from_config(config)
        self._trace_files = (
            TraceFileWriter(
                config.trace_dir,
                compress=config.trace_gzip,
                max_files=config.trace_max_files,
                max_bytes=config.trace_max_bytes,
                strip_values=config.record_shapes,  # torch records values only with shapes
            )
            if config.trace_dir
            else None
        )

    def summarise(self, win: StoppedWindow) -> WindowSummary | str:
        """The window's summary, or the reason its calls are dropped."""
        if isinstance(win, StageWindow):  # a slow call no window watched: no events to read
            cfg = self.config
            return stage_summary(win, cfg.max_attribute_length, cfg.max_attributes)
        try:
            read = win.read()
        except Unreadable as exc:
            return exc.reason
        cfg = self.config
        # the profiler's per-op recording on the window's thread: profkit's cost too, unless
        # every call was charged what it cost on its own thread (profkit._overhead)
        if not (win.calls and all(call.cpu_charged for call in win.calls)):
            self.stats.cpu.charge(read.recording_s)
        calls = build_calls(
            win.id,
            win.calls,
            read.events,
            read.trace_start_ns,
            top_k=cfg.top_k,
            by_shapes=cfg.record_shapes,
            all_threads=cfg.all_threads,
            limit=cfg.max_attribute_length,
            max_attributes=cfg.max_attributes,
        )
        trace_path = None
        if self._trace_files is not None:
            with guard(self.stats, "trace_file"):
                path = self._trace_files.write(win.write_chrome_trace, win.id)
                trace_path = clean(path, cfg.max_attribute_length, keep_end=True)
        if read.cut:  # the earliest max_events events only
            calls = [
                c if c.truncated else dataclasses.replace(c, truncated="max_events") for c in calls
            ]
        done = tuple(self._finish(c, trace_path, read.raw_count) for c in calls)
        return WindowSummary(win.id, done, read.raw_count, trace_path)

    def _finish(self, call: CallSummary, trace_path: str | None, events: int) -> CallSummary:
        diagnosis = None
        with guard(self.stats, "diagnosis"):
            diagnosis = _bounded(diagnose(call, self._thresholds), self.config.max_attribute_length)
        return dataclasses.replace(
            call, trace_path=trace_path, events_total=events, diagnosis=diagnosis
        )


def _bounded(diagnosis: Diagnosis, limit: int) -> Diagnosis:
    """The diagnosis with its texts (they quote labels and op names) cut at ``limit``."""
    return dataclasses.replace(
        diagnosis,
        reason=clean(diagnosis.reason, limit),
        amdahl=[(clean(what, limit), f, s) for what, f, s in diagnosis.amdahl],
    )
