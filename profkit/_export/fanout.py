"""Fan-out: one summary to every exporter, spans first, each exporter on its own runner.

The span step runs before any exporter: it makes the spans and returns the summary with
each call's trace and span ids, which every exporter then receives at once (so log events
carry the call's span id whatever the order of ``exporters``). Each exporter runs on a
daemon thread of its own, so one that hangs is cut off by ``export_timeout`` (and skipped
while it is still stuck) and a slow one adds its time to none of the others'; the worker
waits for all of them (one window at a time). ``flush`` and ``shutdown`` share the caller's
one deadline across all exporters.
"""

from __future__ import annotations

import functools
import inspect
import queue
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from .. import _compat
from .._config import Config, ProfkitConfigWarning
from .._deadline import Deadline
from .._errors import guard
from .._model import CallSummary, WindowSummary
from .._stats import Stats
from ..exporters import Exporter
from ..exporters.console import ConsoleExporter, JsonLinesExporter
from ..exporters.logs import LogExporter
from ..exporters.otel import SpanExporter

__all__ = ["Fanout", "build_exporters"]

#: an exporter's shutdown() is called even after the deadline passed, and waited for this long
_MIN_SHUTDOWN_S = 0.01


class _Adapted(Exporter):
    """An object with ``export()`` that does not subclass :class:`Exporter` (duck-typed).

    Its optional ``force_flush`` and ``shutdown`` are looked up once, here.
    """

    def __init__(self, target: Any) -> None:
        self.target = target
        self.name = str(getattr(target, "name", "") or type(target).__name__)
        self._flush = getattr(target, "force_flush", None)
        self.flushes = self._flush is not None
        self._flush_arg = _timeout_arg(self._flush)
        self._stop = getattr(target, "shutdown", None)
        self._stop_arg = _timeout_arg(self._stop)

    def export(self, summary: WindowSummary) -> None:
        self.target.export(summary)

    def force_flush(self, timeout: float = 5.0) -> bool:
        if self._flush is None:
            return True
        return self._flush(*self._flush_arg(timeout)) is not False

    def shutdown(self, timeout: float = 5.0) -> None:
        if self._stop is not None:
            self._stop(*self._stop_arg(timeout))


def _flushes(exporter: Exporter) -> bool:
    """Whether ``exporter`` has a ``force_flush`` of its own (else there is nothing to flush)."""
    if isinstance(exporter, _Adapted):
        return exporter.flushes
    return type(exporter).force_flush is not Exporter.force_flush


def _timeout_arg(fn: Callable[..., Any] | None) -> Callable[[float], tuple[Any, ...]]:
    """How to pass a timeout in seconds to ``fn``: not at all (no parameter), as seconds,
    or as milliseconds when its parameter says so (OpenTelemetry's ``timeout_millis``)."""
    try:
        params = list(inspect.signature(fn).parameters) if fn is not None else []
    except (TypeError, ValueError):
        params = []
    if not params:
        return lambda timeout: ()
    if "millis" in params[0]:
        return lambda timeout: (int(min(timeout, 3600.0) * 1000),)
    return lambda timeout: (timeout,)


def build_exporters(config: Config) -> tuple[SpanExporter | None, list[Exporter]]:
    """The span step ("otel" in ``exporters``) and the other exporters, in order."""
    spans: SpanExporter | None = None
    out: list[Exporter] = []
    for name in config.exporters:
        if name == "otel":
            spans = SpanExporter(
                config.tracer_provider,
                watch=_compat.watch_provider_shutdown,
                shut_down=_compat.provider_shut_down,
            )
        elif name == "log":
            out.append(LogExporter(config.logger))
        elif name == "console":
            out.append(ConsoleExporter())
        elif name == "json":
            out.append(JsonLinesExporter())
    out.extend(e if isinstance(e, Exporter) else _Adapted(e) for e in config.extra_exporters)
    return spans, out


class _Runner:
    """A daemon thread that runs one exporter's calls, so a hang can be timed out.

    The thread starts on the first call: a forked child (a DataLoader worker, a pre-fork
    server's worker) that never exports never starts one. After :meth:`close` it exits as
    soon as the call it is running (if any) returns.
    """

    def __init__(self, exporter: Exporter, stats: Stats, thread: str = "") -> None:
        self.exporter = exporter
        self.stats = stats  # its CPU time per call is profkit's: charged to stats.cpu
        self.name = exporter.name or type(exporter).__name__
        self._thread_name = f"profkit-{thread or self.name}"
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.busy = threading.Event()
        #: the job running (or queued) is a flush: an export may queue behind it
        self._flushing = False
        self._thread: threading.Thread | None = None
        self._closed = False

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, done, box = job
            cpu0 = time.thread_time()
            try:
                box.append(fn())
            except BaseException as exc:
                box.append(exc)
            finally:
                try:
                    self.stats.cpu.charge(time.thread_time() - cpu0)  # before the caller goes on
                finally:
                    self._flushing = False
                    if self._jobs.empty():  # (an export queued behind a flush: still busy)
                        self.busy.clear()
                    done.set()

    def call(
        self, fn: Callable[[], Any], timeout: float | None, flush: bool = False
    ) -> tuple[bool, Any]:
        """Run ``fn`` on the runner: (finished in time, result or exception)."""
        if timeout is not None and timeout <= 0:
            return False, TimeoutError(f"no time left for exporter {self.name!r}")
        return self.wait(self.submit(fn, flush), timeout)

    def submit(self, fn: Callable[[], Any], flush: bool = False) -> Any:
        """Start ``fn`` on the runner; :meth:`wait` for what this returns. While it runs a
        flush an export queues behind it (a flush is no hang); else a busy runner refuses."""
        if self._closed:  # e.g. force_flush() on a session that was shut down
            return True, RuntimeError(f"exporter {self.name!r} was shut down")
        if self.busy.is_set() and (flush or not self._flushing):
            return False, TimeoutError(f"exporter {self.name!r} still busy with an earlier call")
        self._flushing = self._flushing or flush
        done = threading.Event()
        box: list[Any] = []
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._thread_name, daemon=True)
            self._thread.start()
        self.busy.set()
        self._jobs.put((fn, done, box))
        return done, box

    def wait(self, job: Any, timeout: float | None) -> tuple[bool, Any]:
        """(finished in time, result or exception) of a :meth:`submit`."""
        done, box = job
        if isinstance(done, bool):  # refused: (finished, why)
            return done, box
        if not done.wait(timeout):
            return False, TimeoutError(f"exporter {self.name!r} took longer than {timeout}s")
        return True, box[0]

    def close(self) -> None:
        self._closed = True
        if self._thread is not None:
            self._jobs.put(None)


class Fanout:
    """Owns the exporters of a session: export one summary, flush, shut down."""

    def __init__(
        self,
        stats: Stats,
        spans: SpanExporter | None,
        exporters: Sequence[Exporter],
        export_timeout: float,
        on_delivered: Callable[[Sequence[CallSummary]], None] | None = None,
    ) -> None:
        self.stats = stats
        #: told which calls were delivered (``metrics``: their op rows and exemplars)
        self._on_delivered = on_delivered
        self._timeout = export_timeout
        self._spans = _Runner(spans, stats) if spans is not None else None
        #: the span step's flush (the provider's) on a thread of its own: one that hangs on a
        #: dead collector then holds up no later window's spans (a provider is thread-safe)
        self._span_flush = _Runner(spans, stats, "otel-flush") if spans is not None else None
        self._runners = [_Runner(e, stats) for e in exporters]
        self._warned_no_provider = False
        #: windows given to the exporters, and how many of them the last good flush covered
        self._exported = self._flushed = 0

    def _all(self) -> list[_Runner]:
        return ([self._spans] if self._spans is not None else []) + self._runners

    def _flushers(self) -> list[_Runner]:
        return ([self._span_flush] if self._span_flush is not None else []) + self._runners

    def export(self, summary: WindowSummary) -> tuple[int, str | None, bool]:
        """:meth:`_export`, then tell ``on_delivered`` which calls were delivered."""
        try:
            result, summary = self._export(summary)
        finally:  # counted once its spans and exports are done: a flush after this covers it
            self._exported += 1
        if self._on_delivered is not None and result[0]:
            calls = summary.calls
            if result[0] < len(calls):  # spans only: the calls with a recording span
                calls = tuple(c for c in calls if c.span_id)
            with guard(self.stats, "metrics"):
                self._on_delivered(calls)
        return result

    def _export(self, summary: WindowSummary) -> tuple[tuple[int, str | None, bool], WindowSummary]:
        """Spans first, then every exporter: (calls delivered, why the others were not,
        whether every exporter and the span step took every call).

        A call is delivered when every exporter took it and it reached at least one place:
        a recording span, or an exporter (log events, console, yours). A failing exporter
        fails the window's calls (the last failure is the reason), as before. With no
        exporter and no span step at all a call is delivered nowhere ("no_exporter").
        """
        failure = None
        spans_ok = True
        why_not = "span_not_recording"
        if self._spans is not None:
            spans = self._spans.exporter
            assert isinstance(spans, SpanExporter)
            ok, result = self._run(self._spans, functools.partial(spans.emit, summary))
            if ok:
                summary = result  # calls now carry their span's trace and span ids
                spans_ok = all(c.span_id for c in summary.calls)
                why_not = spans.why_not_recording
                if not spans_ok and spans.default_provider:
                    self._warn_no_provider()
            else:
                failure = result
        if failure is not None:
            spans_ok = False
        # every exporter at once: a slow one adds its time to none of the others'
        jobs = [(r, r.submit(functools.partial(r.exporter.export, summary))) for r in self._runners]
        deadline = Deadline(self._timeout)
        for runner, job in jobs:
            ok, result = self._ended(runner, runner.wait(job, deadline.wait_arg()))
            if not ok:
                failure = result
        if failure is not None:
            return (0, failure, False), summary
        if self._runners:
            missing = sum(1 for c in summary.calls if not c.span_id)
            if self._spans is not None and missing:  # delivered, but not as spans: say why
                self.stats.error(why_not, None, missing)
            return (len(summary.calls), None, spans_ok), summary
        if self._spans is None:
            return (0, "no_exporter", False), summary
        return (sum(1 for c in summary.calls if c.span_id), why_not, spans_ok), summary

    def _warn_no_provider(self) -> None:
        """Spans went to the API's default no-op provider: say so once per session."""
        if not self._warned_no_provider:
            self._warned_no_provider = True
            warnings.warn(
                "profkit: exporters includes 'otel' but no TracerProvider is set, so no span "
                "is recorded and every sampled call is dropped (span_not_recording); set one "
                "with opentelemetry.trace.set_tracer_provider() or pass "
                "configure(tracer_provider=...)",
                ProfkitConfigWarning,
                stacklevel=2,
            )

    def _run(self, runner: _Runner, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """(True, ``fn``'s result), or (False, the drop reason) when it failed or timed out."""
        return self._ended(runner, runner.call(fn, self._timeout))

    def _ended(self, runner: _Runner, outcome: tuple[bool, Any]) -> tuple[bool, Any]:
        finished, result = outcome
        if finished and not isinstance(result, BaseException):
            return True, result
        reason = f"{'export_error' if finished else 'export_timeout'}:{runner.name}"
        self.stats.error(reason, result)
        return False, reason

    def flush(self, deadline: Deadline) -> bool:
        """Flush every exporter within the one deadline; True when all succeeded (at once
        when no window went out since the last good flush). A failure is counted:
        ``flush_error:<name>`` (raised), ``flush_timeout:<name>``, ``flush_failed:<name>``."""
        exported = self._exported
        if exported == self._flushed:
            return True
        ok = True
        for runner in self._flushers():
            if not _flushes(runner.exporter):
                continue  # nothing buffered: even one still stuck in export() has no flush
            flush = functools.partial(runner.exporter.force_flush, deadline.left())
            finished, result = runner.call(flush, deadline.wait_arg(), flush=True)
            if not finished or isinstance(result, BaseException) or result is False:
                ok = False
                kind = "timeout" if not finished else "failed" if result is False else "error"
                error = result if isinstance(result, BaseException) else None
                self.stats.error(f"flush_{kind}:{runner.name}", error)
        if ok:
            self._flushed = exported
        return ok

    def shutdown(self, deadline: Deadline) -> None:
        """Shut every exporter down within the one deadline; runner threads then exit."""
        for runner in self._all():
            wait = deadline.wait_arg()  # at least a moment each, as a courtesy to fast ones
            wait = None if wait is None else max(wait, _MIN_SHUTDOWN_S)
            runner.call(functools.partial(runner.exporter.shutdown, deadline.left()), wait)
            runner.close()
        if self._span_flush is not None:
            self._span_flush.close()

    def at_fork_reinit(self) -> None:
        """In a forked child: the runner threads did not survive the fork; new ones, lazily."""
        if self._spans is not None:
            self._spans = _Runner(self._spans.exporter, self.stats)
            self._span_flush = _Runner(self._spans.exporter, self.stats, "otel-flush")
        self._runners = [_Runner(r.exporter, self.stats) for r in self._runners]
