"""Load for the Ray Serve example: N requests through Ray's HTTP proxy, each in a trace of its own.

Run (with the example serving, ``python -m examples.ray_serve.app``)::

    python examples/ray_serve/load.py --requests 200 --concurrency 16

Each request carries a W3C ``traceparent`` (a new trace id, a sampled parent span id): the
spans profkit exports in the replicas for it are in that trace. Loopback only; it prints
requests, errors, the replicas that answered and the latency percentiles.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

MAX_REQUESTS = 100_000


def post(
    url: str,
    trace_id: str,
    parent_id: str,
    tokens: list[int],
    sampled: bool = True,
    traceparent: bool = True,
) -> dict[str, Any]:
    """One request in trace ``trace_id`` under span ``parent_id`` (a sampled one, or not;
    without ``traceparent``, in no trace); its JSON answer, or an ``{"error": ...}``."""
    headers = {"content-type": "application/json"}
    if traceparent:
        headers["traceparent"] = f"00-{trace_id}-{parent_id}-{'01' if sampled else '00'}"
    request = urllib.request.Request(
        url, data=json.dumps({"tokens": tokens}).encode(), headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer
    except Exception as exc:  # a load driver: report it, go on
        return {"error": repr(exc)}


def send(
    url: str,
    traces: list[tuple[str, str]],
    concurrency: int = 16,
    seed: int = 0,
    unsampled: set[str] | frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """Send one request per ``(trace id, parent span id)``, ``concurrency`` at a time; those
    whose trace id is in ``unsampled`` say their trace is not sampled."""
    rng = random.Random(seed)
    payloads = [[rng.randrange(64) for _ in range(rng.randrange(4, 17))] for _ in traces]
    jobs = [
        (trace_id, parent, tokens, trace_id not in unsampled)
        for (trace_id, parent), tokens in zip(traces, payloads, strict=True)
    ]
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda job: post(url, *job), jobs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000/")
    parser.add_argument("-n", "--requests", type=int, default=200)
    parser.add_argument("-c", "--concurrency", type=int, default=16)
    args = parser.parse_args()
    if urlsplit(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        parser.error("loopback only")
    n = max(1, min(args.requests, MAX_REQUESTS))
    traces = [(secrets.token_hex(16), secrets.token_hex(8)) for _ in range(n)]
    start = time.perf_counter()
    answers = send(args.url, traces, args.concurrency)
    took = time.perf_counter() - start
    errors = sum(1 for a in answers if "error" in a)
    replicas = sorted({a["replica"] for a in answers if "replica" in a})
    print(f"{n} requests in {took:.1f} s, {errors} errors, ingress replicas {replicas}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
