"""Fan-out: one summary to every exporter, spans first, all called by the export worker.

The span step runs before any exporter: it makes the spans and returns the summary with
each call's trace and span ids, which every exporter then receives (so log events carry the
call's span id whatever the order of ``exporters``). The worker calls the span step and
then each exporter itself, in order, under the deadline guard (:mod:`.steps`): no thread
per exporter, so a sampled call is touched by two threads, its own and the worker. A hung
exporter is still cut off at ``export_timeout`` and refuses windows while it is stuck.
``flush`` and ``shutdown`` call every exporter at once, each on a runner thread of its own
started on the first of them (:mod:`.runner`), and share the caller's one deadline.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from .._config import ProfkitConfigWarning
from .._deadline import Deadline
from .._errors import guard
from .._model import CallSummary, WindowSummary
from .._stats import Stats
from ..exporters import Exporter
from ..exporters.otel import SpanExporter
from .adapt import build_exporters, flushes
from .runner import Runner as _Runner
from .steps import Abandoned, DeadlineGuard, Progress, Step, Worker, gated

__all__ = ["Abandoned", "Fanout", "Progress", "Worker", "build_exporters"]

#: an exporter's shutdown() is called even after the deadline passed, and waited for this long
_MIN_SHUTDOWN_S = 0.01


_NO_PROVIDER = (
    "profkit: exporters includes 'otel' but no TracerProvider is set, so no span is recorded "
    "and every sampled call is dropped (span_not_recording); set one with "
    "opentelemetry.trace.set_tracer_provider() or pass configure(tracer_provider=...)"
)
"""``"otel"`` alone and no provider: nothing can be delivered (said once per session)."""


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
        self._spans = Step(spans, stats) if spans is not None else None
        #: the span step's flush (the provider's) on a thread of its own, ungated: one that
        #: hangs on a dead collector then holds up no later window's spans (a provider is
        #: thread-safe)
        self._span_flush = _Runner(spans, stats, "otel-flush") if spans is not None else None
        self._steps = [Step(e, stats) for e in exporters]
        self._warned_no_provider = False
        #: windows given to the exporters, and how many of them the last good flush covered
        self._exported = self._flushed = 0
        self._shutdown_lock = threading.RLock()  # (a signal handler's shutdown: re-entered)
        self._shut: bool | None = None  # the first shutdown's answer
        self.guard = DeadlineGuard(stats, export_timeout)  # the worker's exporter call

    def _all(self) -> list[Step]:
        return ([self._spans] if self._spans is not None else []) + self._steps

    def export(
        self, summary: WindowSummary, worker: Worker, progress: Progress | None = None
    ) -> tuple[int, str | None, bool]:
        """:meth:`_export` (from ``progress``: a window an abandoned worker left), then tell
        ``on_delivered`` which calls were delivered. Raises :class:`Abandoned` on a worker
        abandoned meanwhile (a fresh one goes on with the window)."""
        progress = progress or Progress(summary)
        worker.progress = progress
        done = False
        try:
            result = self._export(progress, worker)
            done = True
        finally:  # counted once its spans and exports are done: a flush after this covers it
            if done or not worker.abandoned:
                self._exported += 1
                worker.progress = None
        if self._on_delivered is not None and result[0]:
            calls = progress.summary.calls
            if result[0] < len(calls):  # spans only: the calls with a recording span
                calls = tuple(c for c in calls if c.span_id)
            with guard(self.stats, "metrics"):
                self._on_delivered(calls)
        return result

    def _export(self, progress: Progress, worker: Worker) -> tuple[int, str | None, bool]:
        """Spans first, then every exporter in order: (calls delivered, why the others were
        not, whether every exporter and the span step took every call).

        A call is delivered when every exporter took it and it reached at least one place:
        a recording span, or an exporter (log events, console, yours). A failing exporter
        fails the window's calls (the last failure is the reason), as before. With no
        exporter and no span step at all a call is delivered nowhere ("no_exporter").
        """
        steps = self._all()
        while progress.next < len(steps):
            step = steps[progress.next]
            if step is self._spans:
                spans = step.exporter
                assert isinstance(spans, SpanExporter)
                ok, result = self._call(
                    worker, step, functools.partial(spans.emit, progress.summary)
                )
                if ok:
                    progress.summary = result  # calls now carry their span's trace and span ids
                    progress.spans_ok = all(c.span_id for c in result.calls)
                    progress.why_not = spans.why_not_recording
                    if spans.default_provider and self._steps:
                        # no provider given and none set (the first run): the span step
                        # waits for one, quietly, while another exporter delivers
                        progress.spans_ok = True
                    elif not progress.spans_ok and spans.default_provider:
                        self._warn_no_provider()
            else:
                fn = functools.partial(step.exporter.export, progress.summary)
                ok, result = self._call(worker, step, fn)
            progress.next += 1
            if not ok:
                progress.failure = result
        summary, why_not = progress.summary, progress.why_not
        if progress.failure is not None:
            return 0, progress.failure, False
        if self._steps:
            missing = sum(1 for c in summary.calls if not c.span_id)
            made = self._spans.exporter if self._spans is not None else None
            waiting = isinstance(made, SpanExporter) and made.default_provider
            if made is not None and missing and not waiting:  # not as spans: say why
                self.stats.error(why_not, None, missing)
            return len(summary.calls), None, progress.spans_ok
        if self._spans is None:
            return 0, "no_exporter", False
        return sum(1 for c in summary.calls if c.span_id), why_not, progress.spans_ok

    def _warn_no_provider(self) -> None:
        """Spans went to the API's default no-op provider: say so once per session."""
        if not self._warned_no_provider:
            self._warned_no_provider = True
            warnings.warn(_NO_PROVIDER, ProfkitConfigWarning, stacklevel=2)

    def _call(self, worker: Worker, step: Step, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """``fn`` (``step``'s export) under the guard: (True, its result), or (False, the
        drop reason) when it failed, timed out, or the exporter is busy."""
        return self._ended(step, self.guard.call(worker, step, fn))

    def _ended(self, step: Step, outcome: tuple[bool, Any]) -> tuple[bool, Any]:
        finished, result = outcome
        if finished and not isinstance(result, BaseException):
            return True, result
        reason = f"{'export_error' if finished else 'export_timeout'}:{step.name}"
        self.stats.error(reason, result)
        return False, reason

    def _flushers(self) -> list[tuple[_Runner, threading.Lock | None]]:
        """Each runner that flushes, with the gate it takes (the span step's flush: none)."""
        out: list[tuple[_Runner, threading.Lock | None]] = []
        if self._span_flush is not None:
            out.append((self._span_flush, None))
        return out + [(s.runner, s.gate) for s in self._steps if flushes(s.exporter)]

    def flush(self, deadline: Deadline) -> bool:
        """Flush every exporter at once within the one deadline; True when all succeeded (at
        once when no window went out since the last good flush). A failure is counted:
        ``flush_error:<name>`` (raised), ``flush_timeout:<name>``, ``flush_failed:<name>``."""
        exported = self._exported
        if exported == self._flushed:
            return True
        ok = self._settle("flush", deadline, self._flushers(), "force_flush")
        if ok:
            self._flushed = max(self._flushed, exported)
        return ok

    def shutdown(self, deadline: Deadline) -> bool:
        """Shut every exporter down at once within the one deadline; runner threads then
        exit. True when each returned in time without raising (``shutdown_<kind>:<name>``).
        Once: a second shutdown (a session shut down again, or at once from two threads:
        ``configure()`` retiring it) waits for the first and gives its answer."""
        with self._shutdown_lock:
            if self._shut is None:
                steps = [(s.runner, s.gate) for s in self._all()]
                ok = self._settle("shutdown", deadline, steps, "shutdown", _MIN_SHUTDOWN_S)
                for step in self._all():
                    step.runner.close()
                if self._span_flush is not None:
                    self._span_flush.close()
                self._shut = ok
            return self._shut

    def _settle(
        self,
        what: str,
        deadline: Deadline,
        runners: Sequence[tuple[_Runner, threading.Lock | None]],
        method: str,
        least: float = 0,
    ) -> bool:
        """Call ``method`` of every runner's exporter at once with the time left as it starts
        (at most ``MAX_GIVEN_S``: a number it can use), once its gate is free, then wait for
        each against ``deadline``."""
        jobs = []
        for runner, gate in runners:
            if deadline.passed and not least:
                jobs.append((runner, (False, TimeoutError(f"no time left for {runner.name!r}"))))
                continue
            fn = getattr(runner.exporter, method)  # given the time left as it starts
            if gate is not None:
                fn = functools.partial(gated, gate, fn)
            jobs.append((runner, runner.submit(fn, what == "flush", deadline)))
        ok = True
        for runner, job in jobs:
            wait = deadline.wait_arg()  # (a shutdown: at least a moment each, for fast ones)
            finished, result = runner.wait(job, None if wait is None else max(wait, least))
            if not finished or isinstance(result, BaseException) or result is False:
                ok = False
                kind = "timeout" if not finished else "failed" if result is False else "error"
                error = result if isinstance(result, BaseException) else None
                self.stats.error(f"{what}_{kind}:{runner.name}", error)
        return ok

    def at_fork_reinit(self) -> None:
        """In a forked child: no worker nor runner thread survived the fork; new steps
        (their threads start lazily; a lock another thread held at the fork is a new one)."""
        self._shutdown_lock = threading.RLock()
        self.guard = DeadlineGuard(self.stats, self._timeout)
        if self._spans is not None:
            self._spans = Step(self._spans.exporter, self.stats)
            self._span_flush = _Runner(self._spans.exporter, self.stats, "otel-flush")
        self._steps = [Step(s.exporter, self.stats) for s in self._steps]
