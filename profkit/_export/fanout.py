"""Fan-out: one summary to every exporter, spans first, each exporter on its own runner.

The span step runs before any exporter: it makes the spans and returns the summary with
each call's trace and span ids, which every exporter then receives at once (so log events
carry the call's span id whatever the order of ``exporters``). Each exporter runs on a
daemon thread of its own, so one that hangs is cut off by ``export_timeout`` (and skipped
while it is still stuck) and a slow one adds its time to none of the others'; the worker
waits for all of them (one window at a time). ``flush`` and ``shutdown`` call every
exporter at once and share the caller's one deadline across them.
"""

from __future__ import annotations

import functools
import inspect
import threading
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
from .runner import Runner as _Runner
from .runner import name_of

__all__ = ["Fanout", "build_exporters"]

#: an exporter's shutdown() is called even after the deadline passed, and waited for this long
_MIN_SHUTDOWN_S = 0.01


class _Adapted(Exporter):
    """An object with ``export()`` that does not subclass :class:`Exporter` (duck-typed), or
    a subclass whose ``force_flush`` / ``shutdown`` take no ``timeout`` seconds first.

    Its optional ``force_flush`` and ``shutdown`` are looked up once, here.
    """

    def __init__(self, target: Any) -> None:
        self.target = target
        self.name = name_of(target)
        self._flush = getattr(target, "force_flush", None)
        inherited = isinstance(target, Exporter) and not _flushes(target)  # (the base's no-op)
        self.flushes = self._flush is not None and not inherited
        self._flush_arg = _timeout_arg(self._flush)
        self._stop = getattr(target, "shutdown", None)
        self._stop_arg = _timeout_arg(self._stop)

    def export(self, summary: WindowSummary) -> Any:
        return self.target.export(summary)

    def force_flush(self, timeout: float = 5.0) -> Any:  # (the runner judges the result)
        if self._flush is None:
            return True
        args, kwargs = self._flush_arg(timeout)
        return self._flush(*args, **kwargs)

    def shutdown(self, timeout: float = 5.0) -> Any:
        if self._stop is not None:
            args, kwargs = self._stop_arg(timeout)
            return self._stop(*args, **kwargs)
        return None


def _flushes(exporter: Exporter) -> bool:
    """Whether ``exporter`` has a ``force_flush`` of its own (else there is nothing to flush)."""
    if isinstance(exporter, _Adapted):
        return exporter.flushes
    return type(exporter).force_flush is not Exporter.force_flush


def _timeout_arg(fn: Callable[..., Any] | None) -> Callable[[float], tuple[Any, Any]]:
    """How to pass a timeout in seconds to ``fn`` as (args, kwargs): not at all (no
    parameter), as seconds, or as milliseconds when its parameter says so (OpenTelemetry's
    ``timeout_millis``), by position or by keyword as its signature takes it."""
    try:
        params = list(inspect.signature(fn).parameters.values()) if fn is not None else []
    except (TypeError, ValueError):
        params = []
    params = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not params:
        return lambda timeout: ((), {})
    first = params[0]
    millis = "millis" in first.name

    def value(timeout: float) -> float | int:
        return int(timeout * 1000) if millis else timeout

    if first.kind is first.KEYWORD_ONLY:  # force_flush(self, *, timeout=...)
        return lambda timeout: ((), {first.name: value(timeout)})
    return lambda timeout: ((value(timeout),), {})


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
    out.extend(e if _takes_seconds(e) else _Adapted(e) for e in config.extra_exporters)
    return spans, out


def _takes_seconds(exporter: Any) -> bool:
    """An :class:`Exporter` whose ``force_flush`` and ``shutdown`` take ``timeout`` seconds
    first, as the base class's (else it is adapted: no parameter, OpenTelemetry's
    ``timeout_millis``, keyword-only)."""
    if not isinstance(exporter, Exporter):
        return False
    for method in ("force_flush", "shutdown"):
        fn = getattr(type(exporter), method)
        if fn is not getattr(Exporter, method):
            try:
                params = list(inspect.signature(fn).parameters.values())[1:]  # (self)
            except (TypeError, ValueError):
                return False
            if not params or params[0].name != "timeout" or params[0].kind not in _POSITIONAL:
                return False
    return True


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


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
        self._shutdown_lock = threading.RLock()  # (a signal handler's shutdown: re-entered)
        self._shut: bool | None = None  # the first shutdown's answer

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
        dormant = False
        if self._spans is not None:
            spans = self._spans.exporter
            assert isinstance(spans, SpanExporter)
            ok, result = self._run(self._spans, functools.partial(spans.emit, summary))
            if ok:
                summary = result  # calls now carry their span's trace and span ids
                spans_ok = all(c.span_id for c in summary.calls)
                why_not = spans.why_not_recording
                # no provider given and none set (the first run): the span step waits for
                # one, quietly, while another exporter delivers (Logfire's console default)
                dormant = spans.default_provider and bool(self._runners)
                if dormant:
                    spans_ok = True
                elif not spans_ok and spans.default_provider:
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
            if self._spans is not None and missing and not dormant:  # not as spans: say why
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
        """Flush every exporter at once within the one deadline; True when all succeeded (at
        once when no window went out since the last good flush). A failure is counted:
        ``flush_error:<name>`` (raised), ``flush_timeout:<name>``, ``flush_failed:<name>``."""
        exported = self._exported
        if exported == self._flushed:
            return True
        runners = [r for r in self._flushers() if _flushes(r.exporter)]  # (else none buffered)
        ok = self._settle("flush", deadline, runners, "force_flush")
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
                ok = self._settle("shutdown", deadline, self._all(), "shutdown", _MIN_SHUTDOWN_S)
                for runner in self._all():
                    runner.close()
                if self._span_flush is not None:
                    self._span_flush.close()
                self._shut = ok
            return self._shut

    def _settle(
        self, what: str, deadline: Deadline, runners: list[_Runner], method: str, least: float = 0
    ) -> bool:
        """Call ``method`` of every runner's exporter at once with the time left as it starts
        (at most ``MAX_GIVEN_S``: a number it can use), then wait for each against
        ``deadline``."""
        jobs = []
        for runner in runners:
            if deadline.passed and not least:
                jobs.append((runner, (False, TimeoutError(f"no time left for {runner.name!r}"))))
                continue
            fn = getattr(runner.exporter, method)  # given the time left as it starts
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
        """In a forked child: the runner threads did not survive the fork; new ones, lazily
        (and a lock another thread held at the fork is a new one)."""
        self._shutdown_lock = threading.RLock()
        if self._spans is not None:
            self._spans = _Runner(self._spans.exporter, self.stats)
            self._span_flush = _Runner(self._spans.exporter, self.stats, "otel-flush")
        self._runners = [_Runner(r.exporter, self.stats) for r in self._runners]
