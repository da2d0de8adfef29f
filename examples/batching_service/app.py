"""Batched inference with FastAPI: one forward serves many requests, each trace shows its share.

Run it (from the repository root)::

    PROFKIT_SAMPLE_EVERY=20 python -m uvicorn examples.batching_service.app:app --port 8000
    curl -s 127.0.0.1:8000/predict -H 'content-type: application/json' \\
        -d '{"inputs": [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5,
             0.5, 0.5]}'
    curl -s 127.0.0.1:8000/generate -H 'content-type: application/json' \\
        -d '{"prompt": [3, 1, 4], "max_new_tokens": 8}'

Two batchers, as inference servers run them:

* ``POST /predict``: an asyncio **micro-batcher** (:class:`MicroBatcher`). Each request takes
  ``profkit.batch_member()`` in its own span and queues its input; the batcher collects up to
  ``EXAMPLE_MAX_BATCH`` inputs (8) or waits at most ``EXAMPLE_MAX_WAIT_MS`` (5 ms), then runs
  one forward in ``profkit.batch("predict_batch", members)``.
* ``POST /generate``: a **continuous-batching** decoder loop (:class:`DecoderLoop`). A toy
  decoder generates tokens for every active sequence at once, one step at a time; sequences
  join and leave between steps, so the batch changes every step. Each step runs in
  ``profkit.batch("decode_step", members, weights=tokens)``: a sequence's share is its
  context length over the batch's.

Both run their forwards on one model thread (a single-thread executor), off the event loop.
A sampled batch exports a span ``predict_batch`` / ``decode_step`` that links every request's
span, and in each request's trace a span of the same name with its share
(``profkit.batch.share``) and the op rows scaled by it. Spans go over OTLP when
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, else print on stdout (one JSON line each); profkit's
settings come from ``PROFKIT_*``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import torch
from fastapi import FastAPI
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from pydantic import BaseModel, Field

import profkit

FEATURES = 16
CLASSES = 4
VOCAB = 64
HIDDEN = 64
MAX_BATCH = int(os.environ.get("EXAMPLE_MAX_BATCH", "8"))
MAX_WAIT_S = float(os.environ.get("EXAMPLE_MAX_WAIT_MS", "5")) / 1000.0


def build_classifier() -> torch.nn.Module:
    """A small MLP with fixed random weights: built in code, nothing to download."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 128), torch.nn.ReLU(), torch.nn.Linear(128, CLASSES)
    ).eval()


class ToyDecoder(torch.nn.Module):
    """Embedding -> GRU cell -> projection: one token per sequence in, next-token logits out."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.cell = torch.nn.GRUCell(HIDDEN, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(
        self, tokens: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        state = self.cell(self.embed(tokens), state)
        return self.head(state), state


class MicroBatcher:
    """Collects requests for at most ``max_wait_s`` (or ``max_batch`` of them), runs one forward.

    It starts on the first request (so the app needs no lifespan hook) and runs the forward
    on ``model_thread``, in ``profkit.batch``: a root call of its own, profiled one batch in
    N (by its label) or when a request asked for a profile.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        model_thread: concurrent.futures.Executor,
        max_batch: int = MAX_BATCH,
        max_wait_s: float = MAX_WAIT_S,
    ) -> None:
        self.model = model
        self.model_thread = model_thread
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.batches = 0
        self._queue: asyncio.Queue[tuple[list[float], profkit.BatchMember, asyncio.Future[Any]]]
        self._task: asyncio.Task[None] | None = None

    async def submit(self, row: list[float]) -> tuple[int, float]:
        """One request's input; returns its class and score once its batch ran."""
        if self._task is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.create_task(self._run())
        future: asyncio.Future[tuple[int, float]] = asyncio.get_running_loop().create_future()
        await self._queue.put((row, profkit.batch_member(), future))  # in the request's span
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            items = [await self._queue.get()]
            deadline = loop.time() + self.max_wait_s
            while len(items) < self.max_batch:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    items.append(await asyncio.wait_for(self._queue.get(), left))
                except asyncio.TimeoutError:
                    break
            try:
                results = await loop.run_in_executor(self.model_thread, self._forward, items)
            except Exception as exc:  # the batch failed: so do its requests, not the batcher
                for *_, future in items:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (*_, future), result in zip(items, results, strict=True):
                if not future.done():  # its client may have gone
                    future.set_result(result)

    def _forward(self, items: list[Any]) -> list[tuple[int, float]]:
        """One forward for the whole batch, on the model thread."""
        self.batches += 1
        members = [member for _, member, _ in items]
        with profkit.batch("predict_batch", members), torch.inference_mode():
            logits = self.model(torch.tensor([row for row, _, _ in items]))
            scores, classes = logits.softmax(dim=1).max(dim=1)
        return [(int(c), round(float(s), 4)) for c, s in zip(classes, scores, strict=True)]


@dataclass
class Generation:
    """One /generate request in the decoder loop."""

    tokens: list[int]
    max_new_tokens: int
    member: profkit.BatchMember
    future: asyncio.Future[list[int]]
    state: torch.Tensor = field(default_factory=lambda: torch.zeros(HIDDEN))
    new: int = 0


class DecoderLoop:
    """Continuous batching: every step runs all active sequences; they join and leave freely.

    Each step is ``profkit.batch("decode_step", members, weights=context lengths)``, so a
    sequence's share grows with its context, and its trace gets one span per sampled step.
    """

    def __init__(
        self, model: ToyDecoder, model_thread: concurrent.futures.Executor, max_batch: int = 16
    ) -> None:
        self.model = model
        self.model_thread = model_thread
        self.max_batch = max_batch
        self.steps = 0
        self._waiting: asyncio.Queue[Generation]
        self._task: asyncio.Task[None] | None = None

    async def generate(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        if self._task is None:
            self._waiting = asyncio.Queue()
            self._task = asyncio.create_task(self._run())
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        await self._waiting.put(
            Generation(list(prompt), max_new_tokens, profkit.batch_member(), future)
        )
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        active: list[Generation] = []
        while True:
            if not active:
                active.append(await self._waiting.get())
            while len(active) < self.max_batch and not self._waiting.empty():
                active.append(self._waiting.get_nowait())
            try:
                await loop.run_in_executor(self.model_thread, self._step, active)
            except Exception as exc:
                for seq in active:
                    if not seq.future.done():
                        seq.future.set_exception(exc)
                active = []
                continue
            for seq in [s for s in active if s.new >= s.max_new_tokens]:
                active.remove(seq)
                if not seq.future.done():
                    seq.future.set_result(seq.tokens)

    def _step(self, active: list[Generation]) -> None:
        """One decode step for every active sequence, on the model thread."""
        self.steps += 1
        members = [s.member for s in active]
        weights = [len(s.tokens) for s in active]  # tokens of context: what a step costs each
        with profkit.batch("decode_step", members, weights=weights), torch.inference_mode():
            tokens = torch.tensor([s.tokens[-1] for s in active])
            logits, state = self.model(tokens, torch.stack([s.state for s in active]))
            chosen = logits.argmax(dim=1)
        for seq, token, row in zip(active, chosen.tolist(), state, strict=True):
            seq.tokens.append(int(token))
            seq.state = row
            seq.new += 1


class PredictRequest(BaseModel):
    """One feature row."""

    inputs: Annotated[list[float], Field(min_length=FEATURES, max_length=FEATURES)]


class GenerateRequest(BaseModel):
    """A prompt of token ids and how many tokens to add."""

    prompt: Annotated[list[Annotated[int, Field(ge=0, lt=VOCAB)]], Field(min_length=1)]
    max_new_tokens: int = Field(default=8, ge=1, le=64)


def _one_line(span: ReadableSpan) -> str:
    return str(span.to_json(indent=None)) + "\n"


def build_tracer_provider() -> TracerProvider:
    """OTLP from the standard ``OTEL_EXPORTER_OTLP_*`` variables, else spans on stdout."""
    service = os.environ.get("OTEL_SERVICE_NAME", "profkit-batching-example")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from profkit.exporters.otlp import otlp_span_processor

        provider.add_span_processor(otlp_span_processor())
    else:
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(formatter=_one_line)))
    return provider


def build_app(
    tracer_provider: TracerProvider | None = None, *, own_profkit: bool = True
) -> FastAPI:
    """The service. ``own_profkit``: configure profkit at startup (from ``PROFKIT_*``) and shut
    it down at the end; a test that configured profkit itself passes False."""
    provider = tracer_provider or build_tracer_provider()
    model_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="model")
    batcher = MicroBatcher(build_classifier(), model_thread)
    decoder = DecoderLoop(ToyDecoder().eval(), model_thread)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if own_profkit:
            profkit.configure(tracer_provider=provider)
        try:
            yield
        finally:
            if own_profkit:
                profkit.shutdown(timeout=5.0)  # exports what was sampled before the end
                provider.shutdown()

    app = FastAPI(title="profkit batching example", lifespan=lifespan)
    app.state.batcher = batcher
    app.state.decoder = decoder

    @app.post("/predict")
    async def predict(request: PredictRequest) -> dict[str, Any]:
        label, score = await batcher.submit(request.inputs)
        return {"class": label, "score": score}

    @app.post("/generate")
    async def generate(request: GenerateRequest) -> dict[str, Any]:
        t0 = time.perf_counter()
        tokens = await decoder.generate(request.prompt, request.max_new_tokens)
        return {"tokens": tokens, "ms": round((time.perf_counter() - t0) * 1000, 3)}

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/profkit/stats")
    def profkit_stats() -> dict[str, Any]:
        return {**profkit.stats(), "batches": batcher.batches, "decode_steps": decoder.steps}

    FastAPIInstrumentor.instrument_app(
        app, tracer_provider=provider, exclude_spans=["receive", "send"]
    )
    return app


app = build_app()
