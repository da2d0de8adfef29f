"""A 3 s sampled stream on an event loop that also serves small requests.

A heartbeat task sleeps 5 ms at a time and records, for its worst beat, how far past its
5 ms it woke (wall clock) and how much CPU the loop's thread spent meanwhile: what profkit
ran on the loop (a profiler stop, a hand-off) shows in the CPU time, which other processes'
load on the machine does not inflate.
"""

import asyncio
import time

import psutil
import torch
from _fresh import report

import profkit
from profkit.testing import CaptureExporter

cap = CaptureExporter()
# the first root call (the stream) is sampled, the loop's other requests are not
profkit.configure(sample_every=10**9, exporters=(), extra_exporters=(cap,))
x = torch.ones(16, 16)
model = torch.nn.Sequential(
    torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
).eval()
batch = torch.randn(8, 64)
done = asyncio.Event()


@profkit.profiled("stream")
async def stream() -> None:
    for _ in range(300):  # about 3 s, ops in every step
        x.mm(x)
        await asyncio.sleep(0.01)


@profkit.profiled("request")
async def request() -> None:
    """The loop's other requests: small model calls."""
    with torch.no_grad():
        model(batch)
    await asyncio.sleep(0)


async def other() -> None:
    while not done.is_set():
        await request()


async def heartbeat() -> tuple[float, float]:
    """The worst beat's (wall seconds late, loop-thread CPU seconds)."""
    worst_wall = worst_cpu = 0.0
    while not done.is_set():
        t0, c0 = time.perf_counter(), time.thread_time()
        await asyncio.sleep(0.005)
        worst_wall = max(worst_wall, time.perf_counter() - t0 - 0.005)
        worst_cpu = max(worst_cpu, time.thread_time() - c0)
    return worst_wall, worst_cpu


async def main() -> tuple[tuple[float, float], int]:
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


(stall, stall_cpu), grew = asyncio.run(main())
profkit.force_flush(20)
streams = [c for c in cap.calls if c.label == "stream"]
report(
    stall=stall,
    stall_cpu=stall_cpu,
    grew=grew,
    truncated=[c.truncated for c in streams],
    ops=[c.root.op_count for c in streams],
    stats=profkit.stats(),
)
