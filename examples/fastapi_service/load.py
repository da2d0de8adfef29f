"""A bounded load generator for the example service: N requests, C at a time, over loopback.

Run (with the service up)::

    python examples/fastapi_service/load.py --requests 200 --concurrency 8

It refuses any host but a loopback one and at most 100 000 requests: it is a demo driver,
not a benchmark tool. It prints one line: requests, errors, latency percentiles, throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import random
import sys
import time
from urllib.parse import urlsplit

import httpx

MAX_REQUESTS = 100_000
FEATURES = 64


def is_loopback(url: str) -> bool:
    """True for http(s) URLs whose host is localhost or a loopback address."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted values, nearest rank."""
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * len(sorted_values)) - 1))
    return sorted_values[index]


async def run(url: str, requests: int, concurrency: int, batch: int, seed: int) -> int:
    """Send the requests; print the summary line; return the number of failed requests."""
    rng = random.Random(seed)
    payloads = [
        {"inputs": [[rng.gauss(0.0, 1.0) for _ in range(FEATURES)] for _ in range(batch)]}
        for _ in range(min(requests, 16))
    ]
    latencies: list[float] = []
    errors = 0
    next_index = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors, next_index
        while next_index < requests:
            i = next_index
            next_index += 1
            t0 = time.perf_counter()
            try:
                response = await client.post("/predict", json=payloads[i % len(payloads)])
                response.raise_for_status()
                latencies.append(time.perf_counter() - t0)
            except httpx.HTTPError:
                errors += 1

    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    print(
        f"requests={requests} concurrency={concurrency} ok={len(latencies)} errors={errors} "
        f"p50={percentile(latencies, 0.5) * 1000:.1f}ms "
        f"p95={percentile(latencies, 0.95) * 1000:.1f}ms "
        f"rate={requests / elapsed:.1f}/s"
    )
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Bounded loopback load for the example service.")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("-n", "--requests", type=int, default=200)
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8, help="rows per request (1..256)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not is_loopback(args.url):
        parser.error(f"--url must be a loopback address, got {args.url!r}")
    if not 1 <= args.requests <= MAX_REQUESTS:
        parser.error(f"--requests must be in 1..{MAX_REQUESTS}")
    if not 1 <= args.concurrency <= 64:
        parser.error("--concurrency must be in 1..64")
    if not 1 <= args.batch <= 256:
        parser.error("--batch must be in 1..256")
    errors = asyncio.run(run(args.url, args.requests, args.concurrency, args.batch, args.seed))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
