"""How slow a label's first calls are in a fresh process: the measurements behind the
``cold_calls`` default (docs/configuration.md, "Cold calls").

Each workload runs in a FRESH interpreter, without profkit, and times its first ``--calls``
calls with ``perf_counter``:

* ``conv``: Conv2d 3-16-16 on 4x3x64x64, eager (cuDNN/oneDNN kernel selection, allocator);
* ``matmul``: Linear 256-1024-256 on 64 rows, eager;
* ``compile``: ``torch.compile`` of Linear 64-128-10 (the first call compiles);
* ``fastapi``: the conv model behind a FastAPI route served by uvicorn, each request timed
  inside the handler.

    .venv/bin/python bench/cold_calls.py [--calls N] [--json]

Exit status 0 whatever the numbers (a benchmark reports; it does not gate).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKLOADS = ("conv", "matmul", "compile", "fastapi")


def _times(fn: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _conv() -> Any:
    import torch

    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3)
    ).eval(), torch.randn(4, 3, 64, 64)


def child(kind: str, calls: int) -> list[float]:
    """One fresh process: the first ``calls`` calls of ``kind``, in ms."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)  # a shared machine's timings: one core's, not the scheduler's
    if kind == "fastapi":
        return _fastapi(calls)
    if kind == "conv":
        model, x = _conv()
    else:
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
        ).eval()
        x = torch.randn(64, 256)
        if kind == "compile":
            model = torch.compile(
                torch.nn.Sequential(
                    torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
                ).eval()
            )
            x = torch.randn(32, 64)
    with torch.no_grad():
        return _times(lambda: model(x), calls)


def _fastapi(calls: int) -> list[float]:
    import httpx
    import torch
    from fastapi import FastAPI

    sys.path.insert(0, str(HERE.parent / "tests"))
    from live_server import serve

    model, x = _conv()
    app = FastAPI()

    @app.get("/predict")
    def predict() -> dict[str, float]:
        t0 = time.perf_counter()
        with torch.no_grad():
            model(x)
        return {"ms": (time.perf_counter() - t0) * 1e3}

    with serve(app) as url, httpx.Client() as client:
        return [float(client.get(url + "/predict").json()["ms"]) for _ in range(calls)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=WORKLOADS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.calls)))
        return
    rows: dict[str, list[float]] = {}
    for kind in WORKLOADS:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", kind, "--calls", str(args.calls)],
            capture_output=True,
            text=True,
            check=False,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[")]
        rows[kind] = json.loads(lines[-1]) if lines else []
    if args.json:
        print(json.dumps(rows))
        return
    print("| workload | call 0 | call 1 | call 2 | calls 3+ (median) |")
    print("|---|---|---|---|---|")
    for kind, ms in rows.items():
        if len(ms) < 4:
            print(f"| {kind} | failed | | | |")
            continue
        rest = statistics.median(ms[3:])
        print(f"| {kind} | {ms[0]:.2f} ms | {ms[1]:.2f} ms | {ms[2]:.2f} ms | {rest:.2f} ms |")


if __name__ == "__main__":
    main()
