"""Off-sample cost of profkit inside a Ray Serve replica's batched method.

The same deployment class twice, driven the way a replica drives it (``asyncio`` tasks, one
per request, each awaiting the batched method; Ray Serve's own ``serve.batch`` queue forms
the batches of 8), in one process and one run, rounds interleaved in a shuffled order:

* ``serve.batch``: the method under ``@serve.batch``, no profkit;
* ``ray_serve.batch``: the class under ``@ray_serve.replica`` (each method in its request's
  trace) and the method under ``@ray_serve.batch`` (a ``batch_member()`` per request, the
  body in ``profkit.batch(...)``), profkit configured (spans and logs through real
  exporters) and off-sample: 1 batch in 10^9 (the first, which falls in the warm-up).

Two bodies: ``noop`` (the inputs back: what profkit adds, in µs per request, against Ray
Serve's own queue) and ``encoder`` (the example's TransformerEncoder classifier, 2 layers,
d_model 32, on the batch's 8 x 16 tokens). CPU time of this thread per request (the
replica's event loop does all of it). Ray Serve's replica context is stubbed (``serve.batch``
asks for one); no cluster runs.

    .venv/bin/python bench/ray_serve.py [--quick] [--json]

Needs ``profkit[ray]``. Exit status 0 whatever the numbers.
"""

from __future__ import annotations

import asyncio
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _util import (
    emit,
    fmt_spread,
    interleaved,
    machine,
    parse_args,
    quiet_exporter_settings,
    spread,
)

BATCH = 8
SEQ = 16


def _stub_replica_context() -> None:
    from ray import serve

    config = types.SimpleNamespace(max_ongoing_requests=1000)
    ctx = types.SimpleNamespace(_deployment_config=config, deployment="bench", app_name="bench")
    serve.get_replica_context = lambda: ctx


def _classes(body: Any) -> dict[str, Any]:
    """The plain and the instrumented deployment class around the same batch body."""
    from ray import serve

    from profkit.integrations import ray_serve

    class Plain:
        @serve.batch(max_batch_size=BATCH, batch_wait_timeout_s=1.0)
        async def forward(self, inputs: list[Any]) -> list[Any]:
            return body(inputs)

    @ray_serve.replica(sample_every=10**9, cold_calls=0, setup=quiet_exporter_settings)
    class Profiled:
        @ray_serve.batch(label="forward", max_batch_size=BATCH, batch_wait_timeout_s=1.0)
        async def forward(self, inputs: list[Any]) -> list[Any]:
            return body(inputs)

    return {"serve.batch": Plain(), "ray_serve.batch": Profiled()}


def _bodies() -> dict[str, Any]:
    import torch

    from examples.ray_serve.app import TinyClassifier

    torch.set_num_threads(1)
    model = TinyClassifier().eval()

    def encoder(inputs: list[Any]) -> list[int]:
        with torch.inference_mode():
            return [int(c) for c in model(torch.stack(inputs)).argmax(dim=1)]

    return {"noop": lambda inputs: inputs, "encoder": encoder}


def _round(loop: asyncio.AbstractEventLoop, obj: Any, item: Any, batches: int) -> float:
    """CPU ns per request of ``batches`` full batches, each request its own task."""

    async def one_batch() -> None:
        await asyncio.gather(*(obj.forward(item) for _ in range(BATCH)))

    async def run() -> None:
        for _ in range(batches):
            await one_batch()

    t0 = time.thread_time_ns()
    loop.run_until_complete(run())
    return (time.thread_time_ns() - t0) / (batches * BATCH)


def measure(quick: bool) -> dict[str, Any]:
    import torch

    import profkit

    _stub_replica_context()
    rounds, batches = (5, 20) if quick else (30, 100)
    loop = asyncio.new_event_loop()
    rows = {}
    item = torch.randint(0, 64, (SEQ,))
    try:
        for name, body in _bodies().items():
            variants = _classes(body)
            fns = {
                v: (lambda n, obj=obj: _round(loop, obj, item, n)) for v, obj in variants.items()
            }
            per_round = interleaved(fns, rounds=rounds, n=batches)
            base, cand = per_round["serve.batch"], per_round["ray_serve.batch"]
            rows[name] = {
                "serve_batch_us": spread([v / 1e3 for v in base]),
                "ray_serve_batch_us": spread([v / 1e3 for v in cand]),
                "added_us": spread([(c - b) / 1e3 for c, b in zip(cand, base, strict=True)]),
                "ratio": spread([c / b for c, b in zip(cand, base, strict=True)]),
            }
        stats = profkit.stats()
    finally:
        for task in asyncio.all_tasks(loop):  # Ray Serve's batch queues, waiting
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
        profkit.shutdown(2.0)
    return {
        "machine": machine(),
        "rounds": rounds,
        "requests_per_round": batches * BATCH,
        "sampled": stats["sampled"],
        "rows": rows,
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"Ray Serve batched method, CPU µs per request (median [IQR] of {result['rounds']} "
        f"interleaved rounds of {result['requests_per_round']} requests; batches of {BATCH}; "
        f"profkit sampled {result['sampled']})",
        f"{'body':<8} {'serve.batch':>20} {'ray_serve.batch':>20} {'added':>20} {'ratio':>20}",
    ]
    for name, row in result["rows"].items():
        lines.append(
            f"{name:<8} {fmt_spread(row['serve_batch_us']):>20} "
            f"{fmt_spread(row['ray_serve_batch_us']):>20} {fmt_spread(row['added_us']):>20} "
            f"{fmt_spread(row['ratio'], 3):>20}"
        )
    return "\n".join(lines)


def main() -> None:
    args = parse_args(__doc__.split("\n")[0])
    emit(measure(args.quick), args.json, render)


if __name__ == "__main__":
    main()
