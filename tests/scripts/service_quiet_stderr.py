"""#25: a service using profkit (FastAPI under uvicorn, instrument_app, a TracerProvider, the
default exporters) writes nothing on stderr: no kineto ``USDT ... profiler_start`` lines,
unless the user set ``KINETO_LOG_LEVEL``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import torch
from _fresh import report
from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

import profkit
from profkit.integrations.fastapi import instrument_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from live_server import serve

trace.set_tracer_provider(TracerProvider())
app = FastAPI()


@app.get("/predict")
def predict() -> dict[str, float]:
    return {"y": float(torch.ones(8, 8).matmul(torch.ones(8, 8)).sum())}


instrument_app(app)
profkit.configure(sample_every=2, cold_calls=0)  # every other call, from the first
with serve(app) as url, httpx.Client(base_url=url) as client:
    codes = [client.get("/predict").status_code for _ in range(10)]
flushed = profkit.force_flush(10.0)
stats = profkit.stats()
profkit.shutdown()
report(
    codes=sorted(set(codes)),
    flushed=flushed,
    exported=stats["exported"],
    kineto_env=os.environ.get("KINETO_LOG_LEVEL"),
)
