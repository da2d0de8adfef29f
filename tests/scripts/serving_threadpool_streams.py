"""60 concurrent sampled streams stepped on Starlette's threadpool, then a probe of every
pool thread: does any of them still have a profiler on?"""

import asyncio
import threading
from collections.abc import Iterator

import anyio
import torch
from _fresh import report
from starlette.concurrency import iterate_in_threadpool

import profkit
from profkit.testing import CaptureExporter

cap = CaptureExporter()
profkit.configure(sample_every=1, exporters=(), extra_exporters=(cap,))


@profkit.profiled("stream")
def tokens(n: int) -> Iterator[int]:
    for i in range(n):
        with profkit.region("token"):
            torch.ones(64, 64).mm(torch.ones(64, 64))
        yield i


async def consume() -> list[int]:
    return [t async for t in iterate_in_threadpool(tokens(8))]


async def main() -> tuple[list[list[int]], list[bool]]:
    out = await asyncio.gather(*(consume() for _ in range(60)))
    # every worker thread of the pool (40 by default) answers once, at the same time
    barrier = threading.Barrier(40)

    def probe() -> bool:
        barrier.wait(30)
        return bool(torch._C._autograd._profiler_enabled())

    probes = await asyncio.gather(*(anyio.to_thread.run_sync(probe) for _ in range(40)))
    return list(out), list(probes)


out, probes = asyncio.run(main())
flushed = profkit.force_flush(20)
calls = [(c.root.op_count, c.truncated) for c in cap.calls]
report(
    out=out,
    probes=probes,
    flushed=flushed,
    calls=calls,
    stats=profkit.stats(),
    flag=torch.autograd.profiler._is_profiler_enabled,
)
