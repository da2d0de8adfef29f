"""``python -m profkit demo``: a small model served through a decorated handler, sampled 1-in-N.

Each sampled call is printed as a readable table (or, with ``--json``, as JSON lines), with
its regions, its diagnosis and its top operators. No collector is needed: spans are made by a
local OpenTelemetry SDK provider so the output carries real trace and span ids.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    import torch
    from opentelemetry.sdk.trace import TracerProvider

    import profkit

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    ).eval()
    provider = TracerProvider()
    tracer = provider.get_tracer("profkit-demo")

    @profkit.profiled("predict", attributes={"model": "mlp-256-512-10"})
    def predict(rows: list[list[float]]) -> list[int]:
        with profkit.region("preprocess"):
            batch = torch.tensor(rows, dtype=torch.float32)
        with profkit.region("inference"), torch.no_grad():
            logits = model(batch)
        with profkit.region("postprocess"):
            return [int(i) for i in logits.argmax(dim=1)]

    profkit.configure(
        sample_every=args.every,
        exporters=("otel", "json" if args.json else "console"),
        tracer_provider=provider,
    )
    if not args.json:
        print(f"profkit demo: {args.calls} requests, 1 in {args.every} profiled\n", file=sys.stderr)
    rows = torch.randn(args.batch, 256).tolist()
    t0 = time.perf_counter()
    for i in range(args.calls):
        with tracer.start_as_current_span("GET /predict", attributes={"request.id": i}):
            predict(rows)
    elapsed = time.perf_counter() - t0
    ok = profkit.force_flush(10.0)
    stats = profkit.stats()
    profkit.shutdown(5.0)
    if not args.json:
        print(
            f"served {args.calls} requests in {elapsed:.2f} s; "
            f"sampled {stats['sampled']}, exported {stats['exported']}, "
            f"dropped {stats['dropped']}, errors {stats['errors']}",
            file=sys.stderr,
        )
    return 0 if ok and stats["errors"] == 0 else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m profkit")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="serve a small model, profile 1 request in N, print summaries"
    )
    demo.add_argument("--calls", type=int, default=300, help="requests to serve (default 300)")
    demo.add_argument("--every", type=int, default=50, help="profile 1 request in N (default 50)")
    demo.add_argument("--batch", type=int, default=16, help="rows per request (default 16)")
    demo.add_argument("--json", action="store_true", help="JSON lines on stdout instead of tables")
    args = parser.parse_args(argv)
    return _demo(args)


if __name__ == "__main__":
    raise SystemExit(main())
