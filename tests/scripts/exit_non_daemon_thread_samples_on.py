"""The main thread returns while a non-daemon thread goes on sampling (a worker that serves
until its queue is done): its calls end after the interpreter began to exit.

Arguments: ``simple`` or ``batch`` (the span processor), and ``calls`` (8 calls after the
main thread returned) or ``window`` (``window=2``: one call before, its window left open on
the thread, closed as the thread ends). The TracerProvider is made after
``configure()``, so its own exit hook runs before profkit's; the span exporter is slow, so
the worker's last calls are still queued in profkit when the worker ends. The report is
written by the first exit hook registered, which runs last.
"""

import sys
import threading
import time

from _fresh import SlowExporter, f, report_spans_at_exit

import profkit

kind, mode = sys.argv[1], sys.argv[2]


exporter = SlowExporter(0.03)
report_spans_at_exit(exporter)  # first exit hook registered: it runs last
profkit.configure(
    sample_every=1,
    cold_calls=0,
    max_per_minute=None,
    exporters=("otel",),
    window=2 if mode == "window" else 1,
    max_window_s=600.0,
)

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor  # noqa: E402

provider = TracerProvider()
processor = SimpleSpanProcessor if kind == "simple" else BatchSpanProcessor
provider.add_span_processor(processor(exporter))  # type: ignore[arg-type]
trace.set_tracer_provider(provider)


def worker() -> None:
    if mode == "window":
        f()  # a window of 2 calls, left open on this thread with one
    threading.main_thread().join()  # the interpreter began to exit (profkit flushed)
    for _ in range(8 if mode == "calls" else 0):
        f()


thread = threading.Thread(target=worker, name="worker")  # not a daemon: exit waits for it
thread.start()
if mode == "window":
    while profkit.stats()["sampled"] < 1:  # its window is open before the main thread returns
        time.sleep(0.01)
# no profkit.shutdown(): the main thread returns, the exit hooks run
