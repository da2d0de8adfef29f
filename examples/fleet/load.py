"""Load for the fleet example: POST /predict from a few client threads, then say who answered.

    python -m examples.fleet.load --url http://127.0.0.1:8000 --requests 600 --clients 4

Prints how many requests each worker (pid) served, so that the fleet's sum in Prometheus
(``sum(profkit_call_duration_seconds_count)``) can be checked against it.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import sys
from collections.abc import Sequence

import httpx


def run(url: str, requests: int, clients: int) -> collections.Counter[int]:
    """Send ``requests`` POSTs over ``clients`` connections; requests served per worker pid."""
    served: collections.Counter[int] = collections.Counter()

    def one_client(n: int) -> collections.Counter[int]:
        mine: collections.Counter[int] = collections.Counter()
        with httpx.Client(base_url=url, timeout=30.0) as client:
            for _ in range(n):
                response = client.post("/predict")
                response.raise_for_status()
                mine[int(response.json()["pid"])] += 1
        return mine

    shares = [requests // clients + (i < requests % clients) for i in range(clients)]
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for counts in pool.map(one_client, [n for n in shares if n]):
            served.update(counts)
    return served


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args(argv)
    served = run(args.url, args.requests, args.clients)
    for pid, n in sorted(served.items()):
        print(f"worker {pid}: {n} requests")
    print(f"total: {sum(served.values())} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
