"""What the fresh-interpreter scripts share: a profiled ``f`` and ``report(**values)``.

Each script in this folder is one test body that needs an interpreter of its own (exit-time,
fork and signal behaviour); ``tests/fresh_interpreter.py`` runs it and reads its last
report back. Importing this module configures nothing.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from collections.abc import Sequence

import torch

import profkit

__all__ = ["SlowExporter", "f", "reap", "report", "report_spans_at_exit"]


@profkit.profiled("f")
def f() -> float:
    """A profiled root call that returns 6.0."""
    return float(torch.ones(3).add_(1).sum())


def report(**values: object) -> None:
    """One JSON line on stdout, which the test reads back (the last one wins)."""
    print("REPORT " + json.dumps(values), flush=True)


def reap(pid: int, seconds: float) -> int | None:
    """A forked child's exit status, or None when it was killed after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.1)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


class SlowExporter:
    """An OpenTelemetry span exporter that counts the spans it got, ``seconds_per_span``
    each; after its shutdown it takes nothing (as the SDK's own exporters)."""

    def __init__(self, seconds_per_span: float) -> None:
        self.seconds_per_span = seconds_per_span
        self.spans = 0
        self.closed = False

    def export(self, spans: Sequence[object]) -> object:
        from opentelemetry.sdk.trace.export import SpanExportResult

        if self.closed:
            return SpanExportResult.FAILURE
        time.sleep(self.seconds_per_span * len(spans))
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.closed = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def report_spans_at_exit(exporter: SlowExporter) -> None:
    """Report the spans ``exporter`` got and profkit's counters from the first exit hook
    registered, which runs after every other one: call it before ``profkit.configure()``."""
    atexit.register(lambda: report(delivered=exporter.spans, stats=profkit.stats()))
