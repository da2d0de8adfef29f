"""The FastAPI service the end-to-end benchmark drives (started by ``bench/e2e.py``).

``POST /predict`` with ``{"rows": 32}`` runs the MLP (Linear 64-128-10) on a batch of that many
rows and returns the predicted classes. ``BENCH_PROFKIT`` picks the variant:

* ``off``: the same handler with profkit's decorator and regions replaced by no-ops (profkit is
  not even imported): the baseline;
* ``N``, ``N/M`` or ``N@B`` (also ``N/M@B``): ``profkit.configure(sample_every=N,
  max_per_minute=M, max_overhead=B)`` (no cap and no budget unless given); ``defaults``:
  no sampling settings at all (1-in-100, at most 60 windows a minute); all with exporters
  that do real work without printing: spans through an SDK ``TracerProvider`` and a
  ``BatchSpanProcessor`` into an in-memory sink, structlog events rendered as JSON and
  discarded.

``GET /stats`` returns ``profkit.stats()`` (none in ``off`` mode) and, under ``"gc"``, the
duration of every full garbage collection the process ran.

    BENCH_PROFKIT=100 python -m uvicorn e2e_server:app --app-dir bench --port 8000
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI
from pydantic import BaseModel

#: "base:<mode>" is the same mode served by the profkit that PYTHONPATH points to (e2e.py
#: --base: an older commit's tree), which may lack newer settings
MODE = os.environ.get("BENCH_PROFKIT", "off").removeprefix("base:")

if MODE == "off":

    def profiled(name: str) -> Callable[[Any], Any]:
        return lambda fn: fn

    def region(name: str) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

else:
    import profkit

    PROFKIT_FROM = profkit.__file__

    profiled = profkit.profiled
    region = profkit.region

_GC_PAUSES: list[float] = []  # ms of each full (generation 2) collection, in order
_GC_START = [0.0]


def _time_full_collections(phase: str, info: dict[str, Any]) -> None:
    """Records the full collections: each holds the GIL (every request) while it runs."""
    if info["generation"] != 2:
        return
    if phase == "start":
        _GC_START[0] = time.perf_counter()
    else:
        _GC_PAUSES.append((time.perf_counter() - _GC_START[0]) * 1000)


gc.callbacks.append(_time_full_collections)
torch.set_num_threads(1)  # one intra-op thread: the server shares 2 cores with its load
torch.manual_seed(0)
MODEL = torch.nn.Sequential(
    torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
).eval()
INPUT = torch.randn(256, 64)


class PredictRequest(BaseModel):
    rows: int = 32


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    if MODE != "off":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _util import quiet_exporter_settings

        if MODE == "defaults":
            profkit.configure(**quiet_exporter_settings())
        else:
            rest, _, budget = MODE.partition("@")
            every, _, cap = rest.partition("/")
            extra = {"max_overhead": float(budget)} if budget else {}
            profkit.configure(
                sample_every=int(every),
                max_per_minute=float(cap) if cap else None,
                **extra,
                **quiet_exporter_settings(),
            )
    try:
        yield
    finally:
        if MODE != "off":
            profkit.shutdown(5.0)


app = FastAPI(lifespan=lifespan)


@app.post("/predict")
@profiled("predict")
async def predict(request: PredictRequest) -> dict[str, Any]:
    with region("preprocess"):
        batch = INPUT[: max(1, min(request.rows, len(INPUT)))]
    with region("forward"), torch.inference_mode():
        logits = MODEL(batch)
    with region("postprocess"):
        classes = logits.argmax(dim=1).tolist()
    return {"classes": classes}


@app.get("/stats")
async def stats() -> dict[str, Any]:
    gc_stats = {"full_pauses_ms": list(_GC_PAUSES)}
    if MODE == "off":
        return {"gc": gc_stats}
    profkit.force_flush(5.0)
    return {**profkit.stats(), "gc": gc_stats, "profkit_from": PROFKIT_FROM}
