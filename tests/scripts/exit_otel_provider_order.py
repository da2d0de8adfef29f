"""Exit without shutdown() while spans are still queued: every call counted exported arrived.

Arguments: ``before`` or ``after`` (configure() before or after the TracerProvider is made:
the provider's own exit hook then runs first or last), and ``simple`` or ``batch`` (its span
processor). The exporter is slow, so a backlog is left at exit. The report is written by
the first exit hook registered, which runs last.
"""

import sys

from _fresh import SlowExporter, f, report_spans_at_exit

import profkit

order, kind = sys.argv[1], sys.argv[2]


exporter = SlowExporter(0.01)
report_spans_at_exit(exporter)  # first exit hook registered: it runs last


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
