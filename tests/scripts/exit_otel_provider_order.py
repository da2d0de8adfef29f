"""Exit without shutdown() while spans are still queued: every call counted exported arrived.

Arguments: ``before`` or ``after`` (configure() before or after the TracerProvider is made:
the provider's own exit hook then runs first or last), and ``simple`` or ``batch`` (its span
processor). The exporter is slow, so a backlog is left at exit. The report is written by
the first exit hook registered, which runs last.
"""

import atexit
import sys
import time
from collections.abc import Sequence

from _fresh import f, report

import profkit

order, kind = sys.argv[1], sys.argv[2]


class SlowExporter:
    """Counts the spans it got, slowly; after shutdown it takes nothing."""

    def __init__(self) -> None:
        self.spans = 0
        self.closed = False

    def export(self, spans: Sequence[object]) -> object:
        from opentelemetry.sdk.trace.export import SpanExportResult

        if self.closed:
            return SpanExportResult.FAILURE
        time.sleep(0.01 * len(spans))
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.closed = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


exporter = SlowExporter()


def _report() -> None:
    report(delivered=exporter.spans, stats=profkit.stats())


atexit.register(_report)  # first registered: runs after every other exit hook


def make_provider() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider()
    processor = SimpleSpanProcessor if kind == "simple" else BatchSpanProcessor
    provider.add_span_processor(processor(exporter))  # type: ignore[arg-type]
    trace.set_tracer_provider(provider)


if order == "after":
    make_provider()
profkit.configure(sample_every=1, exporters=("otel",))
if order == "before":
    make_provider()
for _ in range(40):
    f()
# no profkit.shutdown(): the exit hooks run
