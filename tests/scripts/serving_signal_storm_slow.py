"""SIGALRM storms under capture_slow: random timeouts land anywhere in a mix of fast and slow
calls (the decision, a speculative window, the verdict, the window's stop, the hand-off).
Does every timeout reach the caller, and does every sampled call end as exactly one outcome?

Arguments: the seed, the timeouts per storm, how the handler is installed (a function, a
``functools.partial`` or a callable object: all valid handlers; ``mixed``: each storm the
next of them), the number of storms. Each
storm is a session of its own (configure ... shutdown); the report holds one row per storm.
"""

import functools
import random
import signal
import sys
import time
from collections import Counter
from types import FrameType

import torch
from _fresh import report

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


rows = []
for storm in range(storms):
    signal.signal(signal.SIGALRM, handlers[kinds[storm % len(kinds)]])
    cap = CaptureExporter()
    profkit.configure(
        sample_every=7,  # the sampler picks too: sampled and speculative windows interleave
        capture_slow=True,
        max_per_minute=None,
        queue_size=5000,
        exporters=(),
        extra_exporters=(cap,),
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
                handler(rng.random() < 0.15)
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
            lost_at=lost_at,
            frame=repr(profkit._label.scope.FRAME.get()),
            enabled=bool(torch._C._autograd._profiler_enabled()),
            shut=profkit.shutdown(10) or True,
        )
    )
report(rows=rows)
