"""An exception raised at every point, in turn, where a signal's handler can run in a sampled
call's scopes, decision, profiler start and stop (profkit's code and torch's profiler
front-ends): what a request timeout does when it lands there. After each one, does the
process still profile its next calls, without a crash, and does every interruption reach the
caller?

A profile function counts those points in the watched files and raises at the k-th; k runs
from 1 until the calls stop reaching k. Argument: ``sync`` (a
``@profiled`` handler with nested regions), ``slow`` (the same under ``capture_slow``, its
speculative windows) or ``batch`` (a ``profkit.batch`` of four requests; not at the first
instruction of its ``__exit__``: the one case docs/reliability.md leaves open).
"""

import contextvars
import faulthandler
import gc
import os
import signal
import sys
import tempfile
import time
from collections import Counter

import torch
from _fresh import report

import profkit
from profkit._capture.slot import SLOT
from profkit.testing import CaptureExporter

WATCHED = (
    "torch/profiler/profiler.py",
    "torch/autograd/profiler.py",
    "profkit/_capture/",
    "profkit/_compat.py",
    "profkit/_label/",
    "profkit/_targeting/",
    "profkit/_records.py",
    "profkit/_session.py",
    "profkit/_errors.py",
    "profkit/_export/pipeline.py",
)


class Injected(Exception):
    pass


def on_alarm(signum: int, frame: object) -> None:
    """The application's SIGALRM handler (installed): the tracer calls it where a signal
    would land, so profkit tells its exception apart as it would a real signal's."""
    raise Injected(signum)


class Injector:
    """A profile function (``sys.setprofile``) that raises, through the installed SIGALRM
    handler, at the ``k``-th point of the watched code where a signal can land (0: never).

    CPython runs a signal's Python handler where it checks for pending work: as a function
    starts (its first instruction) and as a call completes. So the points are the start of
    each watched function (``call``) and the return of each C function a watched frame calls
    (``c_return``: the exception then comes from that call, as a signal's would).
    """

    def __init__(self, k: int) -> None:
        self.k, self.seen, self.where = k, 0, ""

    def __call__(self, frame, event, arg):  # type: ignore[no-untyped-def]
        if event not in ("call", "c_return"):
            return
        name = frame.f_code.co_filename
        if not any(w in name for w in WATCHED):
            return
        if event == "call" and frame.f_code.co_name == "__exit__" and mode in ("batch", "region"):
            return  # the one open case (docs/reliability.md): a root context manager's exit
        self.seen += 1
        if self.seen == self.k:
            code = frame.f_code
            where = "start" if event == "call" else getattr(arg, "__name__", "?")
            self.where = f"{name.rsplit('/', 2)[-1]}:{frame.f_lineno} {code.co_name} {where}"
            # the handler installed now: while profkit holds signals (around torch's start
            # and stop), its note-taker, which delivers the exception as the hold ends
            signal.getsignal(signal.SIGALRM)(signal.SIGALRM, frame)


mode = sys.argv[1]
# torch's C++ warnings go to fd 2: a file there, to tell which interruption left a warning
_stderr = os.fdopen(os.dup(2), "w")  # the real one: a crash's traceback goes there
faulthandler.enable(_stderr)
_err = tempfile.TemporaryFile()  # noqa: SIM115  (for the process's life)
os.dup2(_err.fileno(), 2)


def stderr_size() -> int:
    return os.fstat(2).st_size


signal.signal(signal.SIGALRM, on_alarm)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
x = torch.randn(8, 16)


#: the last interruption's exception, kept (as a server's error log or ``sys.last_exc`` may
#: keep one) until the next call's window records: its traceback's frames go then, with
#: whatever they held. A profiler range held there and ended under the next window's
#: session crashed torch 2.13 (SIGSEGV: a range outliving its session, 186adbd's storms)
kept: list[BaseException] = []


@profkit.profiled("handler")
def profiled_handler() -> float:
    with profkit.region("forward"), torch.no_grad():
        kept.clear()
        gc.collect(1)  # the young generations: what a collection may free at any time
        out = model(x)
    with profkit.region("post"):
        return float(out.sum())


def batched_handler() -> float:
    """Four requests' inputs in one forward (``profkit.batch``), each its own member."""
    members = [contextvars.copy_context().run(profkit.batch_member) for _ in range(4)]
    with profkit.batch("batch", members), torch.no_grad():
        kept.clear()
        gc.collect(1)  # the young generations: what a collection may free at any time
        return float(model(x).sum())


def region_handler() -> float:
    """A root ``region()`` (a sampled root: its event-loop check runs too)."""
    with profkit.region("handler"), torch.no_grad():
        kept.clear()
        gc.collect(1)  # the young generations: what a collection may free at any time
        return float(model(x).sum())


handler = {"batch": batched_handler, "region": region_handler}.get(mode, profiled_handler)


cap = CaptureExporter()
profkit.configure(
    sample_every=10**9 if mode == "slow" else 1,
    capture_slow=mode == "slow",
    max_per_minute=None,
    max_overhead=1.0,  # speculation unbudgeted (None: 1% for speculative windows)
    queue_size=100_000,
    exporters=(),
    extra_exporters=(cap,),
)
expected = handler()
for _ in range(200):  # the label's baseline (capture_slow judges against it)
    handler()
profkit.force_flush(20)
k, lost, wrong, failed_after, landed = 0, [], 0, [], Counter()
missed = 0
left_on: list[str] = []
frame_left: list[str] = []
slot_left: list[str] = []
slow_flush: list[str] = []
odd_drops: list[str] = []
dropped_before: dict[str, int] = {}
noisy_after: list[str] = []
while True:
    k += 1
    inj = Injector(k)
    raised = False
    sys.setprofile(inj)
    try:
        handler()
    except Injected as exc:
        raised = True
        kept.append(exc)
    finally:
        sys.setprofile(None)
    if inj.seen < k:  # the call ran out of points before the k-th
        missed += 1
        if missed > 300:  # (speculative windows come and go: not at the first miss)
            break
        continue
    missed = 0
    landed[inj.where.split(" ")[0].split(":")[0]] += 1
    if profkit._label.scope.FRAME.get() is not None:
        frame_left.append(inj.where)
    if not raised:
        lost.append(inj.where)
    if torch._C._autograd._profiler_enabled():
        left_on.append(inj.where)
    if SLOT.claimed:
        slot_left.append(f"{inj.where} claims={SLOT._claims} held={SLOT.held is not None}")
    warned, before = stderr_size(), len(cap.calls)
    for _ in range(2):  # the next calls: still profiled, still right
        if handler() != expected:
            wrong += 1
    t0 = time.monotonic()
    profkit.force_flush(20)  # (False after a call the exception cost its profile: a drop)
    if time.monotonic() - t0 > 5.0:  # a window no one counts: the flush waits it out
        slow_flush.append(f"{inj.where} {time.monotonic() - t0:.1f}s")
    now = profkit.stats()["dropped_reasons"]
    for reason, n in now.items():
        if reason != "interrupted" and n > dropped_before.get(reason, 0):
            odd_drops.append(f"{inj.where} {reason}")
    dropped_before = dict(now)
    if mode != "slow" and len(cap.calls) < before + 2:  # both of the next calls exported
        failed_after.append(inj.where)
    if stderr_size() > warned:
        noisy_after.append(inj.where)
flushed = profkit.force_flush(30)
s = profkit.stats()
report(
    positions=sum(landed.values()),
    landed=dict(landed),
    lost=lost,
    left_on=left_on,
    frame_left=frame_left,
    noisy_after=noisy_after,
    failed_after=failed_after,
    slow_flush=slow_flush,
    slot_left=slot_left,
    odd_drops=odd_drops,
    wrong=wrong,
    flushed=flushed,
    sampled=s["sampled"],
    outcomes=s["exported"] + s["dropped"] + s["skipped_busy"] + s["skipped_foreign"],
    exported=s["exported"],
    errors=dict(s["error_reasons"]),
    dropped=dict(s["dropped_reasons"]),
    frame=repr(profkit._label.scope.FRAME.get()),
    enabled=bool(torch._C._autograd._profiler_enabled()),
    shut=profkit.shutdown(10) or True,
)
