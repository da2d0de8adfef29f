"""1,500 sampled calls hit by random SIGALRM timeouts, then 50 clean ones: does every
timeout reach the caller, and does sampling go on?"""

import random
import signal
from types import FrameType

import torch
from _fresh import report

import profkit
from profkit.testing import CaptureExporter


class RequestTimeout(Exception):
    pass


fired = 0


def on_alarm(signum: int, frame: FrameType | None) -> None:
    global fired
    fired += 1
    raise RequestTimeout("timed out")


signal.signal(signal.SIGALRM, on_alarm)
model = torch.nn.Sequential(
    torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
).eval()
x = torch.randn(32, 64)


@profkit.profiled("handler")
def handler() -> float:
    with profkit.region("forward"), torch.no_grad():
        out = model(x)
    with profkit.region("post"):
        return float(out.sum())


cap = CaptureExporter()
# every call profiled (no rate cap; a queue the worker never finds full: no backlog)
profkit.configure(
    sample_every=1,
    max_per_minute=None,
    queue_size=2000,
    exporters=(),
    extra_exporters=(cap,),
)
rng = random.Random(7)
caught = 0
for _ in range(1500):
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.00005, 0.0015))
            handler()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except RequestTimeout:
        caught += 1
profkit.force_flush(20)
before = profkit.stats()
for _ in range(50):
    handler()
    profkit.force_flush(20)
after = profkit.stats()
state = dict(
    fired=fired,
    caught=caught,
    sampled=after["sampled"] - before["sampled"],
    exported=after["exported"] - before["exported"],
    frame=repr(profkit._label.scope.FRAME.get()),
    enabled=bool(torch._C._autograd._profiler_enabled()),
    flag=torch.autograd.profiler._is_profiler_enabled,
)
profkit.shutdown(10)
report(shut=True, **state)
