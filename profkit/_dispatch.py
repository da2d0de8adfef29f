"""The export worker's steps for one stopped window: parse, summarise, diagnose, export.

Each exporter runs on its own daemon thread so that one which hangs is cut off by
``export_timeout`` (and skipped while it is still stuck) without holding up the others.
"""

from __future__ import annotations

import dataclasses
import functools
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ._config import Config
from ._errors import Stats, guard
from ._model import CallSummary, WindowSummary
from ._raw import read_cpu_events
from ._summary import build_calls
from ._window import Window
from .exporters import Exporter, build_exporters
from .exporters.chrome import TraceFileWriter

__all__ = ["Dispatcher"]


class _Runner:
    """A daemon thread that runs one exporter's calls, so a hang can be timed out.

    The thread starts on the first call: a forked child (a DataLoader worker, a pre-fork
    server's worker) that never exports never starts one.
    """

    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter
        self.name = getattr(exporter, "name", type(exporter).__name__)
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.busy = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name=f"profkit-{self.name}", daemon=True
            )
            self._thread.start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, done, box = job
            try:
                box.append(fn())
            except BaseException as exc:
                box.append(exc)
            finally:
                self.busy.clear()
                done.set()

    def call(self, fn: Callable[[], Any], timeout: float) -> tuple[bool, Any]:
        """Run ``fn`` on the runner: (finished in time, result or exception)."""
        if self._closed:  # e.g. force_flush() on a session that was shut down
            return True, RuntimeError(f"exporter {self.name!r} was shut down")
        if self.busy.is_set():
            return False, TimeoutError(f"exporter {self.name!r} still busy with an earlier call")
        done = threading.Event()
        box: list[Any] = []
        self._ensure_thread()
        self.busy.set()
        self._jobs.put((fn, done, box))
        if not done.wait(timeout):
            return False, TimeoutError(f"exporter {self.name!r} took longer than {timeout}s")
        return True, box[0]

    def close(self) -> None:
        self._closed = True
        if self._thread is not None:
            self._jobs.put(None)


class Dispatcher:
    """Owns the exporters of a session and runs the worker's steps for each window."""

    def __init__(self, config: Config, stats: Stats, exporters: Sequence[Exporter] | None) -> None:
        self.config = config
        self.stats = stats
        chosen = list(exporters) if exporters is not None else build_exporters(config)
        self._runners = [_Runner(e) for e in chosen]
        self._trace_files = TraceFileWriter(config) if config.trace_dir else None
        self.last_failure: str | None = None

    @property
    def exporters(self) -> list[Exporter]:
        return [r.exporter for r in self._runners]

    def process(self, win: Window) -> bool:
        """Summarise and export one window; True when every exporter took every call."""
        self.last_failure = None
        summary = self.summarise(win)
        if summary is None:
            return False
        if not summary.calls:
            return True
        return self.export(summary)

    def summarise(self, win: Window) -> WindowSummary | None:
        prof = win.prof
        if prof is None:
            self.last_failure = "no_profile"
            return None
        cfg = self.config
        kineto = prof.profiler.kineto_results if prof.profiler is not None else None
        raw = kineto.events() if kineto is not None else []
        raw_count = len(raw)
        if raw_count > cfg.max_events:
            self.last_failure = "too_many_events"
            return None
        trace_start = kineto.trace_start_ns() if kineto is not None else win.started_ns
        events: Sequence[Any] | None = None
        if not cfg.profile_memory:  # memory records need torch's own parser
            events = read_cpu_events(raw, trace_start, cfg.record_shapes)
        if events is None:
            events = list(prof.events())  # type: ignore[no-untyped-call]
        calls = build_calls(
            win.id,
            win.calls,
            events,
            trace_start,
            top_k=cfg.top_k,
            by_shapes=cfg.record_shapes,
            all_threads=cfg.all_threads,
            limit=cfg.max_attribute_length,
            max_attributes=cfg.max_attributes,
        )
        trace_path = None
        if self._trace_files is not None:
            with guard(self.stats, "trace_file"):
                trace_path = self._trace_files.write(prof, win.id)
        calls = [self._finish(c, trace_path, raw_count) for c in calls]
        return WindowSummary(win.id, tuple(calls), raw_count, 0, trace_path)

    def _finish(self, call: CallSummary, trace_path: str | None, events: int) -> CallSummary:
        diagnosis = None
        with guard(self.stats, "diagnosis"):
            from ._diagnosis import Thresholds, diagnose

            diagnosis = diagnose(call, Thresholds.from_config(self.config))
        return dataclasses.replace(
            call, trace_path=trace_path, events_total=events, diagnosis=diagnosis
        )

    def export(self, summary: WindowSummary) -> bool:
        ok = True
        for runner in self._runners:
            finished, result = runner.call(
                functools.partial(runner.exporter.export, summary), self.config.export_timeout
            )
            if not finished:
                self._fail(runner, "export_timeout", result)
                ok = False
            elif isinstance(result, BaseException):
                self._fail(runner, "export_error", result)
                ok = False
            elif isinstance(result, WindowSummary):
                summary = result  # the span exporter adds span ids that the log events carry
        return ok

    def _fail(self, runner: _Runner, kind: str, exc: BaseException) -> None:
        reason = f"{kind}:{runner.name}"
        self.last_failure = reason
        self.stats.error(reason, exc)

    def after_fork(self, stats: Stats) -> None:
        """In a forked child: the runner threads did not survive the fork; start new ones."""
        self.stats = stats
        self._runners = [_Runner(r.exporter) for r in self._runners]
        if self._trace_files is not None:
            self._trace_files = TraceFileWriter(self.config)

    def flush(self, timeout: float) -> bool:
        ok = True
        for runner in self._runners:
            flush = getattr(runner.exporter, "force_flush", None)
            if flush is None:
                continue
            finished, result = runner.call(functools.partial(flush, timeout), timeout)
            if not finished or isinstance(result, BaseException) or result is False:
                ok = False
        return ok

    def shutdown(self, timeout: float) -> None:
        for runner in self._runners:
            stop = getattr(runner.exporter, "shutdown", None)
            if stop is not None:
                runner.call(stop, max(0.01, timeout))
            runner.close()
