"""A FastAPI inference service instrumented with profkit and OpenTelemetry.

Run it (from the repository root)::

    PROFKIT_SAMPLE_EVERY=10 python -m uvicorn examples.fastapi_service.app:app --port 8000
    PROFKIT_SAMPLE_EVERY=10 python examples/fastapi_service/app.py --port 8000

Every request gets an HTTP server span from opentelemetry-instrumentation-fastapi; the
sampled ones also get profkit's ``predict`` span (and ``preprocess`` / ``inference`` /
``postprocess`` children) inside it. Where spans go is decided by the environment:

* ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set: OTLP, over
  gRPC or ``http/protobuf`` as ``OTEL_EXPORTER_OTLP_PROTOCOL`` says (gRPC by default).
* ``EXAMPLE_SPANS_JSONL=path``: also append every span to ``path``, one JSON object a line.
* neither: spans print on stdout, one JSON line each (``ConsoleSpanExporter``).

profkit's own settings come from ``PROFKIT_*`` variables (``PROFKIT_SAMPLE_EVERY``,
``PROFKIT_EXPORTERS``, ...); by default one request in 100 is profiled and exported as spans
and structlog events.
"""

import argparse
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Annotated, Any

import torch
from fastapi import FastAPI
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from pydantic import BaseModel, Field

import profkit

FEATURES = 64
CLASSES = 10


def build_model() -> torch.nn.Module:
    """A small MLP classifier with fixed random weights: built in code, nothing to download."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, CLASSES),
    ).eval()


def _otlp_processor() -> SpanProcessor:
    """OTLP from the standard ``OTEL_EXPORTER_OTLP_*`` variables (endpoint, protocol, headers).

    profkit's processor is OTel's ``BatchSpanProcessor`` whose exporter also counts failed
    exports into ``profkit.stats()``.
    """
    from profkit.exporters.otlp import otlp_span_processor

    return otlp_span_processor()


def _one_line(span: ReadableSpan) -> str:
    return str(span.to_json(indent=None)) + "\n"


def span_processors() -> list[SpanProcessor]:
    """Where spans go, from the environment (see the module docstring)."""
    processors: list[SpanProcessor] = []
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    ):
        processors.append(_otlp_processor())
    spans_file = os.environ.get("EXAMPLE_SPANS_JSONL")
    if spans_file:
        out = open(spans_file, "a", encoding="utf-8")  # noqa: SIM115 - open for the process
        processors.append(SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=_one_line)))
    if not processors:  # one JSON line per span (the SDK's default indents each over 30 lines)
        processors.append(SimpleSpanProcessor(ConsoleSpanExporter(formatter=_one_line)))
    return processors


def build_tracer_provider() -> TracerProvider:
    """A TracerProvider named after the service, with the processors the environment asks for."""
    service = os.environ.get("OTEL_SERVICE_NAME", "profkit-fastapi-example")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    for processor in span_processors():
        provider.add_span_processor(processor)
    return provider


MODEL = build_model()
PROVIDER = build_tracer_provider()


class PredictRequest(BaseModel):
    """A batch of feature rows."""

    inputs: list[Annotated[list[float], Field(min_length=FEATURES, max_length=FEATURES)]] = Field(
        min_length=1, max_length=256
    )


class PredictResponse(BaseModel):
    """The predicted class and its probability, per row."""

    classes: list[int]
    scores: list[float]


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # profkit's spans use the same provider as the HTTP spans; PROFKIT_* fill the rest
    profkit.configure(tracer_provider=PROVIDER)
    try:
        yield
    finally:
        profkit.shutdown(timeout=5.0)  # exports what was sampled before the process ends
        PROVIDER.shutdown()


app = FastAPI(title="profkit example", lifespan=lifespan)


@app.post("/predict")
@profkit.profiled("predict", attributes={"model": "mlp"})
def predict(request: PredictRequest) -> PredictResponse:
    # a sync endpoint: FastAPI runs it on its thread pool, inside the request's span
    with profkit.region("preprocess", rows=len(request.inputs)):
        batch = torch.tensor(request.inputs, dtype=torch.float32)
        batch = (batch - batch.mean(dim=1, keepdim=True)) / (batch.std(dim=1, keepdim=True) + 1e-6)
    with profkit.region("inference"), torch.inference_mode():
        logits = MODEL(batch)
    with profkit.region("postprocess"):
        scores, classes = logits.softmax(dim=1).max(dim=1)
        return PredictResponse(
            classes=classes.tolist(), scores=[round(s, 4) for s in scores.tolist()]
        )


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.get("/profkit/stats")
def profkit_stats() -> dict[str, Any]:
    """profkit's counters: root calls, sampled, exported, dropped, skipped_busy, errors."""
    return profkit.stats()


@app.post("/profkit/trigger")
def profkit_trigger(n: int = 1) -> dict[str, int]:
    """Profile the next ``n`` requests whatever the sampler says."""
    profkit.trigger(n)
    return {"triggered": n}


FastAPIInstrumentor.instrument_app(app, tracer_provider=PROVIDER, exclude_spans=["receive", "send"])


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
