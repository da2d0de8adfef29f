"""Token streaming with FastAPI's ``StreamingResponse``, profiled by profkit.

Run it (from the repository root)::

    PROFKIT_SAMPLE_EVERY=5 python -m uvicorn examples.streaming_service.app:app --port 8000
    curl -N 'http://127.0.0.1:8000/generate?prompt=3,1,4&tokens=16'

A tiny language model (an embedding, a GRU cell and a projection with fixed random weights:
nothing to download) generates tokens greedily, one per step. Two endpoints stream them:

* ``/generate``: a sync generator. Starlette iterates it through ``iterate_in_threadpool``, so
  each step may run on a different worker thread. A thread-local profiler cannot follow it
  there: a sampled stream's window stops at its first yield (the prompt and first token are
  recorded; the span says ``profkit.truncated = "first_step"``) and no thread keeps a
  profiler on. With ``PROFKIT_ALL_THREADS=1`` the whole stream is recorded instead.
* ``/agenerate``: an async generator on the event loop. Its window records while the stream
  runs, bounded by ``max_window_s`` (or by the other requests the loop serves meanwhile).

Spans print on stdout (one JSON line each); profkit's settings come from ``PROFKIT_*``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import torch
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

import profkit

VOCAB = 64
HIDDEN = 128


class TinyLM(torch.nn.Module):
    """Embedding -> GRU cell -> projection: one token in, next-token logits out."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.cell = torch.nn.GRUCell(HIDDEN, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(
        self, token: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        state = self.cell(self.embed(token), state)
        return self.head(state), state


MODEL = TinyLM().eval()


Step = tuple[torch.Tensor, torch.Tensor]


def prefill(prompt: list[int]) -> Step:
    """Run the prompt through the model: the next-token logits and the state."""
    with profkit.region("prefill", prompt_tokens=len(prompt)), torch.inference_mode():
        state = torch.zeros(1, HIDDEN)
        logits = torch.zeros(1, VOCAB)
        for token in prompt:
            logits, state = MODEL(torch.tensor([token]), state)
        return logits, state


def decode_step(step: Step) -> tuple[str, Step]:
    """One greedy token, and the logits and state for the next one.

    Grad mode is thread-local like the profiler: ``inference_mode`` is entered per step and
    never held across a ``yield`` (a sync generator's next step may run on another thread,
    an async generator's loop runs other tasks on this thread in between).
    """
    logits, state = step
    with profkit.region("decode_step"), torch.inference_mode():
        token = logits.argmax(dim=1)
        return f"{int(token)} ", MODEL(token, state)


@profkit.profiled("generate")
def generate(prompt: list[int], tokens: int) -> Iterator[str]:
    """Greedy decoding, one token per step (a sync generator: steps hop threads)."""
    step = prefill(prompt)
    for _ in range(tokens):
        text, step = decode_step(step)
        yield text


@profkit.profiled("agenerate")
async def agenerate(prompt: list[int], tokens: int) -> AsyncIterator[str]:
    """The same decoding as an async generator on the event loop."""
    step = prefill(prompt)
    for _ in range(tokens):
        text, step = decode_step(step)
        yield text
        await asyncio.sleep(0)  # let the loop serve others between tokens


def _one_line(span: ReadableSpan) -> str:
    return str(span.to_json(indent=None)) + "\n"


PROVIDER = TracerProvider(resource=Resource.create({"service.name": "profkit-streaming"}))
PROVIDER.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(formatter=_one_line)))


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    profkit.configure(tracer_provider=PROVIDER)
    try:
        yield
    finally:
        profkit.shutdown(timeout=5.0)
        PROVIDER.shutdown()


app = FastAPI(title="profkit streaming example", lifespan=lifespan)


def _prompt(text: str) -> list[int]:
    return [int(t) % VOCAB for t in text.split(",") if t.strip()] or [0]


@app.get("/generate")
def generate_route(prompt: str = "1,2,3", tokens: int = 16) -> StreamingResponse:
    return StreamingResponse(generate(_prompt(prompt), min(tokens, 256)), media_type="text/plain")


@app.get("/agenerate")
def agenerate_route(prompt: str = "1,2,3", tokens: int = 16) -> StreamingResponse:
    return StreamingResponse(agenerate(_prompt(prompt), min(tokens, 256)), media_type="text/plain")


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.get("/profkit/stats")
def profkit_stats() -> dict[str, Any]:
    """profkit's counters, and whether any torch profiler is on in this process right now."""
    return {**profkit.stats(), "profiler_flag": bool(torch.autograd.profiler._is_profiler_enabled)}


FastAPIInstrumentor.instrument_app(app, tracer_provider=PROVIDER)
