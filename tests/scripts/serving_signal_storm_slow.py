"""SIGALRM storms under capture_slow: random timeouts land anywhere in a mix of fast and slow
calls (the decision, a speculative window, the verdict, the window's stop, the hand-off).
Does every timeout reach the caller, and does every sampled call end as exactly one outcome?

Arguments: the seed, the timeouts per storm, how the handler is installed (a function, a
``functools.partial`` or a callable object: all valid handlers; ``mixed``: each storm the
next of them), the number of storms, and optionally ``fleet``: ``metrics=True`` on (an
in-memory reader) and one call in four a batch of four requests (``profkit.batch``). Each
storm is a session of its own (configure ... shutdown); the report holds one row per storm.
"""

import contextvars
import functools
import gc
import random
import signal
import sys
import time
from collections import Counter
from types import FrameType

import torch
from _fresh import report
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

import profkit
from profkit.testing import CaptureExporter


class RequestTimeout(Exception):
    pass


fired = 0
#: where the last timeout landed: the interrupted frame and its callers (file:line function)
landed: list[str] = []


def on_alarm(signum: int, frame: FrameType | None, why: str = "timed out") -> None:
    global fired, landed
    fired += 1
    landed = []
    while frame is not None and len(landed) < 8:
        code = frame.f_code
        landed.append(f"{code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    raise RequestTimeout(why)


class Alarm:
    def __call__(self, signum: int, frame: FrameType | None) -> None:
        on_alarm(signum, frame)


seed, timeouts, kind, storms = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
fleet = sys.argv[5:] == ["fleet"]
handlers = {
    "function": on_alarm,
    "partial": functools.partial(on_alarm, why="deadline"),
    "object": Alarm(),
}
kinds = sorted(handlers) if kind == "mixed" else [kind]
torch.set_num_threads(1)
model = torch.nn.Sequential(
    torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
).eval()
x = torch.randn(32, 64)
rng = random.Random(seed)


@profkit.profiled("handler")
def handler(slow: bool) -> float:
    with profkit.region("forward"), torch.no_grad():
        out = model(x)
    if slow:  # a slow dependency: what capture_slow is there to catch
        with profkit.region("dependency"):
            time.sleep(0.004)
    with profkit.region("post"):
        return float(out.sum())


def member(i: int) -> profkit.BatchMember:
    """A request's token, taken in its span. The span is made current in a copied context
    (``attach`` only), not with ``start_as_current_span``: OpenTelemetry's ``detach`` logs
    and swallows any exception raised in it, a timeout too (``Failed to detach context``),
    which no code of profkit's runs in."""
    span = tracer.start_span(f"request {i}")
    otel_context.attach(trace.set_span_in_context(span))
    token = profkit.batch_member()
    span.end()
    return token


def batched() -> None:
    """Four requests' inputs in one forward (each request in a span of its own)."""
    members = [contextvars.copy_context().run(member, i) for i in range(4)]
    with profkit.batch("batch", members), torch.no_grad():
        model(x)


def one_call() -> None:
    if fleet and rng.random() < 0.25:
        batched()
    else:
        handler(rng.random() < 0.15)


tracer_provider = TracerProvider()
tracer = tracer_provider.get_tracer("storm")
reader = InMemoryMetricReader()
meter_provider = MeterProvider(metric_readers=[reader])
rows = []
for storm in range(storms):
    # the previous storm's session (its threads, its pipeline) is collected now, not in a
    # collection during this storm: the standard library's weakref callbacks (threading's
    # WeakSet of threads) would run on this thread then, and a timeout landing in one is
    # printed and lost ("Exception ignored in: _remove"), which no code of profkit's can help
    gc.collect()
    signal.signal(signal.SIGALRM, handlers[kinds[storm % len(kinds)]])
    cap = CaptureExporter()
    profkit.configure(
        sample_every=7,  # the sampler picks too: sampled and speculative windows interleave
        capture_slow=True,
        max_per_minute=None,
        max_overhead=1.0,  # every storm samples: no budget (the storms are profkit's cost)
        queue_size=5000,
        exporters=(),
        extra_exporters=(cap,),
        **({"metrics": True, "meter_provider": meter_provider} if fleet else {}),
    )
    for _ in range(200):  # a baseline for the label, before the storm
        handler(rng.random() < 0.1)
    profkit.force_flush(20)
    fired = caught = calls = 0
    lost_at = []  # where each timeout that did not reach the caller landed
    while fired < timeouts and calls < 20 * timeouts:
        calls += 1
        before, raised = fired, False
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.00003, 0.006))
                one_call()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except RequestTimeout:
            caught += 1
            raised = True
        if fired > before and not raised:
            lost_at.append(landed)
    flushed = profkit.force_flush(30)
    s = profkit.stats()
    policies = Counter(c.policy for c in cap.calls)
    rows.append(
        dict(
            handler=kinds[storm % len(kinds)],
            fired=fired,
            caught=caught,
            calls=calls + 200,
            flushed=flushed,
            root_calls=s["root_calls"],
            sampled=s["sampled"],
            outcomes=s["exported"] + s["dropped"] + s["skipped_busy"] + s["skipped_foreign"],
            exported=s["exported"],
            captured=len(cap.calls),
            speculative=s["speculative"],
            released=s["speculative_released"],
            slow=policies.get("slow", 0),
            dropped=dict(s["dropped_reasons"]),
            errors=dict(s["error_reasons"]),
            batches=sum(1 for c in cap.calls if c.label == "batch"),
            lost_at=lost_at,
            frame=repr(profkit._label.scope.FRAME.get()),
            enabled=bool(torch._C._autograd._profiler_enabled()),
            shut=profkit.shutdown(10) or True,
        )
    )
report(rows=rows)
