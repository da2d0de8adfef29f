"""Serving patterns: streams that hop threads, long-open windows, signal timeouts, the user's
own profiler mid-window, shutdowns with hung exporters. Each risky case runs in a fresh
interpreter (as tests/test_exit.py does): a profiler left running crashes the exit.
"""

from __future__ import annotations

import threading
import time

import pytest
from fresh_interpreter import run_fresh

import profkit
from profkit.testing import capture

pytestmark = pytest.mark.timeout(240)


def test_streams_through_iterate_in_threadpool_leave_no_profiler_behind() -> None:
    """60 concurrent sampled streams via Starlette's threadpool: no thread keeps a profiler."""
    rc, report, err = run_fresh(
        """
        import asyncio, anyio
        from starlette.concurrency import iterate_in_threadpool
        cap = CaptureExporter()
        profkit.configure(sample_every=1, exporters=(), extra_exporters=(cap,))

        @profkit.profiled("stream")
        def tokens(n):
            for i in range(n):
                with profkit.region("token"):
                    torch.ones(64, 64).mm(torch.ones(64, 64))
                yield i

        async def consume():
            return [t async for t in iterate_in_threadpool(tokens(8))]

        async def main():
            out = await asyncio.gather(*(consume() for _ in range(60)))
            # every worker thread of the pool (40 by default) answers once, at the same time
            barrier = threading.Barrier(40)
            def probe():
                barrier.wait(30)
                return bool(torch._C._autograd._profiler_enabled())
            probes = await asyncio.gather(*(anyio.to_thread.run_sync(probe) for _ in range(40)))
            return out, probes

        out, probes = asyncio.run(main())
        flushed = profkit.force_flush(20)
        calls = [(c.root.op_count, c.truncated) for c in cap.calls]
        report(out=out, probes=probes, flushed=flushed, calls=calls, stats=profkit.stats(),
               flag=torch.autograd.profiler._is_profiler_enabled)
        """
    )
    assert 0 == rc, err[-3000:]
    assert [list(range(8))] * 60 == report["out"]
    assert [False] * 40 == report["probes"]  # no pool thread has a profiler on
    assert report["flag"] is False
    assert report["flushed"]
    assert report["calls"], "some streams were sampled"
    for ops, truncated in report["calls"]:
        assert ops > 0 or truncated, "an exported call has ops or says why not"
    assert all(truncated == "first_step" for _, truncated in report["calls"])
    assert "Profiler is already enabled" not in err


def test_long_open_stream_is_cut_short_without_stalling_the_loop() -> None:
    """A 3 s sampled stream on a busy loop: stopped at max_window_s, loop stall < 0.5 s."""
    rc, report, err = run_fresh(
        """
        import asyncio, psutil
        cap = CaptureExporter()
        # the first root call (the stream) is sampled, the loop's other requests are not
        profkit.configure(sample_every=10**9, exporters=(), extra_exporters=(cap,))
        x = torch.ones(16, 16)

        @profkit.profiled("stream")
        async def stream():
            for _ in range(300):          # about 3 s, ops in every step
                x.mm(x)
                await asyncio.sleep(0.01)

        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10)).eval()
        batch = torch.randn(8, 64)

        @profkit.profiled("request")
        async def request():             # the loop's other requests: small model calls
            with torch.no_grad():
                model(batch)
            await asyncio.sleep(0)

        async def other():
            while not done.is_set():
                await request()

        async def heartbeat():
            worst = 0.0
            while not done.is_set():
                t0 = time.perf_counter()
                await asyncio.sleep(0.005)
                worst = max(worst, time.perf_counter() - t0 - 0.005)
            return worst

        async def main():
            global done
            done = asyncio.Event()
            rss0 = psutil.Process().memory_info().rss
            sampled = asyncio.ensure_future(stream())
            await asyncio.sleep(0)
            beat = asyncio.ensure_future(heartbeat())
            workers = [asyncio.ensure_future(other()) for _ in range(4)]
            await sampled
            rss1 = psutil.Process().memory_info().rss
            done.set()
            await asyncio.gather(*workers)
            return await beat, rss1 - rss0

        stall, grew = asyncio.run(main())
        profkit.force_flush(20)
        streams = [c for c in cap.calls if c.label == "stream"]
        report(stall=stall, grew=grew, truncated=[c.truncated for c in streams],
               ops=[c.root.op_count for c in streams], stats=profkit.stats())
        """
    )
    assert 0 == rc, err[-3000:]
    assert report["stall"] < 0.5, report
    assert report["grew"] < 150 * 1024 * 1024, report
    assert 1 == len(report["truncated"])
    assert report["truncated"][0] in ("max_window_s", "busy_thread")
    assert report["ops"][0] > 0


def test_signal_timeouts_always_reach_the_caller_and_sampling_goes_on() -> None:
    """1,500 calls hit by random SIGALRM timeouts: each timeout raised, then 50 clean samples."""
    rc, report, err = run_fresh(
        """
        import random, signal

        class RequestTimeout(Exception):
            pass

        fired = 0
        def on_alarm(signum, frame):
            global fired
            fired += 1
            raise RequestTimeout("timed out")

        signal.signal(signal.SIGALRM, on_alarm)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10)).eval()
        x = torch.randn(32, 64)

        @profkit.profiled("handler")
        def handler():
            with profkit.region("forward"), torch.no_grad():
                out = model(x)
            with profkit.region("post"):
                return float(out.sum())

        cap = CaptureExporter()
        # every call profiled (no rate cap; a queue the worker never finds full: no backlog)
        profkit.configure(sample_every=1, max_per_minute=None, queue_size=2000,
                          exporters=(), extra_exporters=(cap,))
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
        state = dict(fired=fired, caught=caught,
                     sampled=after["sampled"] - before["sampled"],
                     exported=after["exported"] - before["exported"],
                     frame=repr(profkit._scope.FRAME.get()),
                     enabled=bool(torch._C._autograd._profiler_enabled()),
                     flag=torch.autograd.profiler._is_profiler_enabled)
        profkit.shutdown(10)
        report(shut=True, **state)
        """
    )
    assert 0 == rc, err[-3000:]
    assert report["fired"] > 500  # the timers did hit
    assert report["fired"] == report["caught"]  # every timeout reached the caller
    assert 50 == report["sampled"]
    assert 50 == report["exported"]
    assert "None" == report["frame"]
    assert report["enabled"] is False
    assert report["flag"] is False
    assert report["shut"]


def test_users_profiler_started_mid_window_on_another_thread() -> None:
    """The user's torch profiler waits for profkit's window on another thread: no crash."""
    rc, report, err = run_fresh(
        """
        cap = CaptureExporter()
        profkit.configure(sample_every=1, exporters=(), extra_exporters=(cap,))
        inside = threading.Event()

        @profkit.profiled("long")
        def long_call():
            inside.set()
            for _ in range(400):              # about 2 s, with a checkpoint per step
                with profkit.region("step"):
                    torch.ones(32, 32).mm(torch.ones(32, 32))
                time.sleep(0.005)

        worker = threading.Thread(target=long_call)
        worker.start()
        assert inside.wait(30)
        time.sleep(0.05)
        t0 = time.perf_counter()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            started = time.perf_counter() - t0
            torch.ones(8, 8).add_(1)
        names = [e.name for e in prof.events()]
        worker.join()
        profkit.force_flush(20)
        report(started=started, user_ops=names.count("aten::add_"),
               truncated=[c.truncated for c in cap.calls], stats=profkit.stats())
        """
    )
    assert 0 == rc, err[-3000:]
    assert 1 == report["user_ops"]  # the user's profiler kept its events
    assert report["started"] < 1.0  # the window stopped at its next checkpoint
    assert ["foreign_profiler"] == report["truncated"]


def test_users_profiler_inside_a_sampled_call_drops_it_with_a_reason() -> None:
    """The user's profiler nested in a sampled call empties profkit's window: dropped, why."""

    @profkit.profiled("outer")
    def outer() -> float:
        with torch_profiler() as prof:
            value = float(torch_ones().add_(1).sum())
        assert prof.events()  # the user's own profile is intact
        return value

    with capture(sample_every=1) as cap:
        assert 18.0 == outer()
    assert [] == cap.calls
    assert {"foreign_profiler": 1} == cap.stats["dropped_reasons"]
    assert 0 == cap.stats["exported"]


def torch_profiler() -> object:
    import torch

    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])


def torch_ones() -> object:
    import torch

    return torch.ones(3, 3)


class _Hung(profkit.exporters.Exporter):
    """An exporter whose every call hangs for ``hang`` seconds."""

    name = "hung"

    def __init__(self, hang: float) -> None:
        self.hang = hang

    def export(self, summary: object) -> None:
        time.sleep(self.hang)

    def force_flush(self, timeout: float = 5.0) -> bool:
        time.sleep(self.hang)
        return True

    def shutdown(self, timeout: float = 5.0) -> None:
        time.sleep(self.hang)


def _profkit_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("profkit-")}


def test_no_thread_outlives_shutdowns_with_hung_exporters() -> None:
    """Six configure/shutdown cycles with hung exporters: every profkit thread then exits."""

    @profkit.profiled("call")
    def call() -> int:
        return 1

    hang = 1.0
    before = _profkit_threads()
    for _ in range(6):
        profkit.configure(sample_every=1, exporters=(), extra_exporters=(_Hung(hang),))
        assert 1 == call()
        assert not profkit.shutdown(timeout=0.2)
    deadline = time.monotonic() + hang + 3.0
    while _profkit_threads() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [] == sorted(t.name for t in _profkit_threads() - before)
