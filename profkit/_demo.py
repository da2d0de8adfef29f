"""``python -m profkit demo`` (``./scripts/demo``): a small text classifier served over HTTP,
profiled.

What it does is :data:`DESCRIPTION` (also its ``--help``). The model is
:func:`build_model`: a 2-layer ``torch.nn.TransformerEncoder`` topic classifier with random
weights (nothing downloaded); its handler (:func:`predict_texts`) tokenises by hashing words
(``preprocess``), runs the model (``inference``) and picks the labels (``postprocess``). The
service is :func:`build_app`: OpenTelemetry's FastAPI instrumentation makes a SERVER span per
request and :func:`profkit.integrations.fastapi.instrument_app` makes each request a root
call. The request count is bounded, and the server listens on loopback only.
"""

import argparse
import random
import re
import socket
import sys
import threading
import time
import zlib
from typing import IO, Any

DESCRIPTION = """\
Serve a small text classifier (a 2-layer transformer encoder with random weights: embedding,
encoder, mean pooling, a linear head over 4 topics) with FastAPI under uvicorn on 127.0.0.1 (a
free port), send it a bounded number of requests of --batch texts each from the demo's own
client, and print each sampled call on stdout as it is exported: the SERVER span of its
request, then its readable summary (with --json, one JSON line instead). --no-server calls
the same handler in a plain loop instead: no server, no HTTP, no request spans. torch runs
one intra-op thread (the model is small, and the client shares the cores), so the times are
the model's. Progress and counters go to stderr. No collector is needed: spans are made by a
local OpenTelemetry SDK provider.
"""

MODEL_NAME = "text-transformer-2x64"
LABELS = ("world", "sports", "business", "science")
#: hash buckets of the tokeniser-free vocabulary (0 pads, 1 starts a text)
VOCAB = 8192
#: the most tokens a text keeps (the first one is the start token)
TOKENS = 32
D_MODEL, HEADS, LAYERS = 64, 4, 2
#: torch's intra-op threads in the demo
THREADS = 1
#: the most texts per demo request (a demo of a light handler, not a memory test)
MAX_BATCH = 1024
_WORD = re.compile(r"[a-z0-9']+")
_WORDS = (  # noqa: SIM905 - one string of words reads better than 37 quoted ones
    "the a of in on after with markets shares bank rates profit quarter trade startup "
    "inflation team match season coach goal striker league tournament final election "
    "minister parliament summit talks storm telescope orbit genome vaccine probe study"
).split()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options."""
    parser.add_argument("--calls", type=int, default=300, help="requests to send (default 300)")
    parser.add_argument("--every", type=int, default=50, help="profile 1 request in N (default 50)")
    parser.add_argument(
        "--batch", type=int, default=16, help=f"texts per request (default 16, at most {MAX_BATCH})"
    )
    parser.add_argument("--json", action="store_true", help="JSON lines on stdout, not tables")
    parser.add_argument(
        "--no-server", action="store_true", help="a plain loop of calls, no HTTP server"
    )


def build_model() -> Any:
    """The text classifier, with fixed random weights (built in code: nothing to download).

    Token and position embeddings, a 2-layer ``TransformerEncoder`` (4 heads, feed-forward 4x
    wide), the mean of the encoded tokens (padding left out) and a linear head over
    :data:`LABELS`. ``forward(ids, pad)`` takes token ids and their padding mask.
    """
    import torch
    from torch import nn

    class TextClassifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, D_MODEL, padding_idx=0)
            self.position = nn.Embedding(TOKENS, D_MODEL)
            layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, 4 * D_MODEL, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
            self.head = nn.Linear(D_MODEL, len(LABELS))

        def forward(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids) + self.position.weight[: ids.shape[1]]
            x = self.encoder(x, src_key_padding_mask=pad)
            keep = (~pad).unsqueeze(-1).to(x.dtype)
            out: torch.Tensor = self.head((x * keep).sum(1) / keep.sum(1).clamp(min=1.0))
            return out

    torch.manual_seed(0)
    return TextClassifier().eval()


def token_ids(text: str) -> list[int]:
    """A text's token ids without a tokeniser: a start token, then each word's hash bucket."""
    words = _WORD.findall(text.lower())[: TOKENS - 1]
    return [1] + [2 + zlib.crc32(word.encode()) % (VOCAB - 2) for word in words]


def sample_texts(count: int, seed: int = 1) -> list[str]:
    """``count`` made-up headlines of 8 to 30 words (the same ones for the same seed)."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(_WORDS, k=rng.randint(8, 30))) for _ in range(count)]


def predict_texts(model: Any, texts: list[str]) -> list[dict[str, Any]]:
    """The handler's body: three labelled stages around the model; a label and score a text."""
    import torch

    import profkit

    if not texts:
        return []
    with profkit.region("preprocess"):
        rows = [token_ids(text) for text in texts]
        width = max(map(len, rows))
        ids = torch.tensor([row + [0] * (width - len(row)) for row in rows], dtype=torch.long)
        pad = ids == 0
    with profkit.region("inference"), torch.inference_mode():
        logits = model(ids, pad)
    with profkit.region("postprocess"):
        scores, best = logits.softmax(dim=-1).max(dim=-1)
        pairs = zip(best.tolist(), scores.tolist(), strict=True)
        return [{"label": LABELS[i], "score": round(score, 4)} for i, score in pairs]


def _say(message: str) -> None:
    """A progress line: stderr, so that stdout holds only the summaries (and the counters)."""
    print(message, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 when every request succeeded and every sample was exported."""
    if args.calls < 1 or args.every < 1 or args.batch < 1:
        print("--calls, --every and --batch must be >= 1", file=sys.stderr)
        return 2
    if args.batch > MAX_BATCH:  # the texts are made in memory (and sent as JSON) per request
        print(f"--batch must be <= {MAX_BATCH}", file=sys.stderr)
        return 2
    import torch

    # a small model: one intra-op thread (torch's default, one per core, competes with the
    # server, the client and the export thread for the same cores: a matmul then reads 10x)
    torch.set_num_threads(THREADS)
    return _loop(args) if args.no_server else _serve(args)


# -- the printed output ---------------------------------------------------------------------


def _printer(args: argparse.Namespace, servers: dict[int, str], out: IO[str]) -> Any:
    """The exporter that prints each sampled call (a table, or a JSON line)."""
    from .exporters import Exporter
    from .exporters.console import JsonLinesExporter, render_call

    if args.json:
        return JsonLinesExporter(out)

    class DemoPrinter(Exporter):
        """The SERVER span a call sits under, then its readable summary."""

        name = "demo"

        def export(self, summary: Any) -> None:
            for call in summary.calls:
                out.write(_under(call, servers) + "\n" + render_call(call) + "\n\n")
            out.flush()

    return DemoPrinter()


def _under(call: Any, servers: dict[int, str]) -> str:
    """``── in SERVER span 'POST /predict' (trace …)``: where the call's span sits."""
    parent = call.parent_span_context
    if parent is None:
        return "── no request span (--no-server: a plain loop)"
    name = servers.get(parent.span_id)
    where = f"SERVER span {name!r}" if name else "span"
    return f"── in {where} {parent.span_id:016x}, trace {parent.trace_id:032x}"


def _server_spans(servers: dict[int, str]) -> Any:
    """A span processor that records the name of every SERVER span by span id as it starts."""
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.trace import SpanKind

    class ServerSpans(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            if span.kind is SpanKind.SERVER:
                servers[span.context.span_id] = span.name

    return ServerSpans()


def _configure(args: argparse.Namespace, provider: Any, servers: dict[int, str]) -> None:
    import profkit

    profkit.configure(
        sample_every=args.every,
        exporters=("otel",),
        extra_exporters=(_printer(args, servers, sys.stdout),),
        tracer_provider=provider,
    )


def _finish(done: str, failed: int) -> int:
    """Flush, print what was done and the counters, shut down; the exit status."""
    import profkit

    ok = profkit.force_flush(10.0)
    stats = profkit.stats()
    profkit.shutdown(5.0)
    _say(
        f"{done}; sampled {stats['sampled']}, exported {stats['exported']}, "
        f"dropped {stats['dropped']}, errors {stats['errors']}",
    )
    return 0 if ok and failed == 0 and stats["errors"] == 0 else 1


# -- --no-server: the plain loop ------------------------------------------------------------


def _loop(args: argparse.Namespace) -> int:
    from opentelemetry.sdk.trace import TracerProvider

    import profkit

    model = build_model()

    @profkit.profiled("predict", attributes={"model": MODEL_NAME})
    def predict(texts: list[str]) -> list[dict[str, Any]]:
        return predict_texts(model, texts)

    _configure(args, TracerProvider(), {})
    _say(
        f"profkit demo --no-server: {args.calls} calls of the handler in a plain loop (no "
        f"server, no request spans), 1 in {args.every} profiled, torch threads {THREADS}"
    )
    texts = sample_texts(args.batch)
    t0 = time.perf_counter()
    for _ in range(args.calls):
        predict(texts)
    return _finish(f"ran {args.calls} calls in {time.perf_counter() - t0:.2f} s", 0)


# -- the service ----------------------------------------------------------------------------


def build_app(model: Any, provider: Any) -> Any:
    """The FastAPI app: ``POST /predict`` (labelled by instrument_app) and ``GET /healthz``."""
    from fastapi import FastAPI
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    from pydantic import BaseModel

    from .integrations.fastapi import instrument_app

    class Batch(BaseModel):
        texts: list[str]

    app = FastAPI(title="profkit demo")

    @app.post("/predict")
    def predict(batch: Batch) -> dict[str, list[dict[str, Any]]]:
        return {"predictions": predict_texts(model, batch.texts)}

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    instrument_app(app, exclude=["/healthz"], attributes={"model": MODEL_NAME})
    FastAPIInstrumentor.instrument_app(
        app, tracer_provider=provider, exclude_spans=["receive", "send"]
    )
    return app


def _serve(args: argparse.Namespace) -> int:
    try:
        import httpx
        import uvicorn
    except ImportError as exc:
        print(
            f"the demo service needs {exc.name}: pip install 'profkit[demo]' "
            "(or run ./scripts/demo, or --no-server)",
            file=sys.stderr,
        )
        return 2
    from opentelemetry.sdk.trace import TracerProvider

    servers: dict[int, str] = {}
    provider = TracerProvider()
    provider.add_span_processor(_server_spans(servers))
    app = build_app(build_model(), provider)
    _configure(args, provider, servers)
    sock = socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms delayed-ACK stalls
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    if _fresh():
        config.reset_contextvars = True
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        if not _wait_up(server, 30.0):
            _say("the demo server did not start")
            return 1
        _say(
            f"profkit demo: serving on {url}; sending {args.calls} requests, "
            f"1 in {args.every} profiled, torch threads {THREADS}"
        )
        t0 = time.perf_counter()
        failed = _drive(httpx, url, args)
        elapsed = time.perf_counter() - t0
    finally:
        server.should_exit = True
        thread.join(10.0)
        sock.close()
    return _finish(f"served {args.calls} requests ({failed} failed) in {elapsed:.2f} s", failed)


def _fresh() -> bool:
    """Whether uvicorn (0.45+) can start each request from an empty context.

    Without ``reset_contextvars``, once a request body over 64 KiB has arrived on a
    keep-alive connection, later requests on it inherit that request's context (CPython
    #140947, uvicorn #2167): their SERVER spans, and profkit's spans under them, land in the
    first request's trace.
    """
    import inspect

    import uvicorn

    return "reset_contextvars" in inspect.signature(uvicorn.Config).parameters


def _wait_up(server: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    return bool(server.started)


def _drive(httpx: Any, url: str, args: argparse.Namespace) -> int:
    """Send ``args.calls`` requests one after another; the number that failed."""
    body = {"texts": sample_texts(args.batch)}
    failed = 0
    with httpx.Client(base_url=url, timeout=30.0) as client:
        for _ in range(args.calls):
            try:
                ok = client.post("/predict", json=body).status_code == 200
            except httpx.HTTPError:
                ok = False
            failed += 0 if ok else 1
    return failed
