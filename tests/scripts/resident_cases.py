"""The resident session (``resident=True``) where a fresh interpreter is needed: fork from the
loop's thread and from another thread, exit with the loop still open, the loop's thread
ending, a compiled model. Reports ``ok`` and the figures; exits 0 unless the process crashed.

Forked children end with ``os._exit`` (as multiprocessing's do): a child's normal exit after
a profiler ran in its parent may hang in kineto's teardown (torch upstream, see
``profkit._capture.window.started_before_fork``).
"""

import asyncio
import os
import sys
import threading
import time
from typing import Any

import torch
from _fresh import reap, report

import profkit
from profkit._capture.slot import SLOT

torch.set_num_threads(1)  # (a child forked after OpenMP ran on threads hangs in its barrier)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
x = torch.randn(8, 16)
compiled = torch.compile(model, backend="inductor") if sys.argv[1] == "compiled" else model


#: set while the handler's own body runs (the signal storm's timeouts land only there)
in_body = [False]


@profkit.profiled("predict")
async def predict(slow: bool) -> int:
    in_body[0] = True
    try:
        with torch.no_grad():
            for _ in range(20 if slow else 1):
                compiled(x)
        if slow:
            time.sleep(0.03)
    finally:
        in_body[0] = False
    await asyncio.sleep(0)
    return 1


async def serve(calls: int) -> int:
    return sum([await predict(i % 25 == 24) for i in range(calls)])


def profiler_on() -> bool:
    return bool(torch.autograd.profiler._is_profiler_enabled) or bool(
        torch._C._autograd._profiler_enabled()
    )


def child_checks() -> int:
    """In a forked child: no profiler of the parent's is on, and profkit profiles again."""
    ok = not profiler_on() and SLOT.resident is None and not SLOT.claimed
    got = asyncio.run(serve(30))
    return 0 if ok and got == 30 and profkit.stats()["windows"] > 0 else 3


def fork_and_reap() -> int | None:
    pid = os.fork()
    if pid == 0:
        code = 4
        try:
            code = child_checks()
        finally:
            os._exit(code)
    return reap(pid, 60.0)


profkit.configure(
    sample_every=10**9,
    capture_slow=True,
    slow_ms=15.0,
    max_per_minute=None,
    max_overhead=1.0,  # every speculative window opens
    exporters=(),
    resident=True,
)
case = sys.argv[1]

if case == "fork_loop_thread":

    async def fork_in_loop() -> tuple[bool, int | None]:
        await serve(60)
        kept = SLOT.resident is not None
        return kept, fork_and_reap()

    kept, child = asyncio.run(fork_in_loop())
    report(ok=kept and child == 0, kept=kept, child=child)

elif case == "fork_other_thread":
    loop = asyncio.new_event_loop()
    ready, done = threading.Event(), threading.Event()

    async def serve_until_done() -> None:
        await serve(60)
        ready.set()
        while not done.is_set():
            await asyncio.sleep(0.01)

    thread = threading.Thread(target=loop.run_until_complete, args=(serve_until_done(),))
    thread.start()
    ready.wait(60)
    kept = SLOT.resident is not None
    child = fork_and_reap()
    done.set()
    thread.join(30)
    loop.close()
    report(ok=kept and child == 0, kept=kept, child=child)

elif case == "exit_open_loop":  # the main thread's loop is never closed: exit stops it
    loop = asyncio.new_event_loop()
    loop.run_until_complete(serve(60))
    report(ok=SLOT.resident is not None and profiler_on())

elif case == "thread_ends":  # the loop's thread ends with its loop never closed
    loops: list[asyncio.AbstractEventLoop] = []

    def run() -> None:
        loop = asyncio.new_event_loop()
        loops.append(loop)  # (kept alive: only the thread's end can close it)
        loop.run_until_complete(serve(60))
        kept.append(SLOT.resident is not None)

    kept: list[bool] = []
    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    after = (SLOT.resident, SLOT.claimed, profiler_on())
    report(ok=kept == [True] and after == (None, False, False), kept=kept, after=str(after))

elif case == "signal_storm":  # SIGALRM timeouts landing in the handler's body, as a request
    # timeout does (the profiler's state changes on either side of it)
    import signal

    class Timeout(Exception):
        pass

    raised = [0]

    def on_alarm(signum: int, frame: Any) -> None:
        if in_body[0] and frame is not None and frame.f_code.co_filename == __file__:
            in_body[0] = False
            raised[0] += 1
            raise Timeout

    async def storm() -> tuple[int, int, bool]:
        caught = calls = 0
        kept = False
        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, 0.0007, 0.0007)
        try:
            for i in range(1500):
                calls += 1
                try:
                    await predict(i % 25 == 24)
                except Timeout:
                    caught += 1
                kept = kept or SLOT.resident is not None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        return calls, caught, kept

    calls, caught, kept = asyncio.run(storm())
    after = (SLOT.resident, SLOT.claimed, profiler_on())
    stats = profkit.stats()
    report(
        ok=kept
        and caught == raised[0] > 0
        and stats["root_calls"] == calls
        and stats["errors"] == 0
        and after == (None, False, False),
        caught=caught,
        calls=calls,
        windows=stats["windows"],
        raised=raised[0],
        roots=stats["root_calls"],
        errors=stats["error_reasons"],
        after=str(after),
    )

elif case == "compiled":  # compiled forwards in speculative windows and between them

    async def serve_compiled() -> bool:
        await serve(300)
        seen = []
        for _ in range(20):  # (the last call may have been slow: its window was read)
            await predict(False)
            seen.append(SLOT.resident is not None)
        return any(seen)

    kept = asyncio.run(serve_compiled())
    flushed = profkit.force_flush(60)
    stats = profkit.stats()
    report(
        ok=kept and stats["windows"] > 0 and stats["errors"] == 0,
        kept=kept,
        windows=stats["windows"],
        flushed=flushed,
        errors=stats["error_reasons"],
    )
