"""``python -m profkit demo`` (``./scripts/demo``): a small model served over HTTP, profiled.

What it does is :data:`DESCRIPTION` (also its ``--help``). The service is
:func:`build_app`: OpenTelemetry's FastAPI instrumentation makes a SERVER span per request
and :func:`profkit.integrations.fastapi.instrument_app` makes each request a root call.
The request count is bounded, and the server listens on loopback only.
"""

import argparse
import socket
import sys
import threading
import time
from typing import IO, Any

DESCRIPTION = """\
Serve a small model with FastAPI under uvicorn on 127.0.0.1 (a free port), send it a bounded
number of requests from the demo's own client, and print each sampled call on stdout as it
is exported: the SERVER span of its request, then its readable summary (with --json, one
JSON line instead). --no-server calls the same handler in a plain loop instead: no server,
no HTTP, no request spans. torch runs one intra-op thread (the model is tiny, and the client
shares the cores), so the times are the model's. Progress and counters go to stderr. No
collector is needed: spans are made by a local OpenTelemetry SDK provider.
"""

FEATURES = 256
MODEL_NAME = "mlp-256-512-10"
#: torch's intra-op threads in the demo
THREADS = 1
#: the most rows per demo request (a demo of a light handler, not a memory test)
MAX_BATCH = 4096


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options."""
    parser.add_argument("--calls", type=int, default=300, help="requests to send (default 300)")
    parser.add_argument("--every", type=int, default=50, help="profile 1 request in N (default 50)")
    parser.add_argument(
        "--batch", type=int, default=16, help=f"rows per request (default 16, at most {MAX_BATCH})"
    )
    parser.add_argument("--json", action="store_true", help="JSON lines on stdout, not tables")
    parser.add_argument(
        "--no-server", action="store_true", help="a plain loop of calls, no HTTP server"
    )


def build_model() -> Any:
    """A small MLP with fixed random weights (built in code: nothing to download)."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    ).eval()


def predict_rows(model: Any, rows: list[list[float]]) -> list[int]:
    """The handler's body: three labelled stages around the model."""
    import torch

    import profkit

    with profkit.region("preprocess"):
        batch = torch.tensor(rows, dtype=torch.float32)
    with profkit.region("inference"), torch.inference_mode():
        logits = model(batch)
    with profkit.region("postprocess"):
        return [int(i) for i in logits.argmax(dim=1)]


def _say(message: str) -> None:
    """A progress line: stderr, so that stdout holds only the summaries (and the counters)."""
    print(message, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 when every request succeeded and every sample was exported."""
    if args.calls < 1 or args.every < 1 or args.batch < 1:
        print("--calls, --every and --batch must be >= 1", file=sys.stderr)
        return 2
    if args.batch > MAX_BATCH:  # the rows are made in memory (and sent as JSON) per request
        print(f"--batch must be <= {MAX_BATCH}", file=sys.stderr)
        return 2
    import torch

    # a tiny model: one intra-op thread (torch's default, one per core, competes with the
    # server, the client and the export thread for the same cores: addmm then reads 10x)
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
    import torch
    from opentelemetry.sdk.trace import TracerProvider

    import profkit

    model = build_model()

    @profkit.profiled("predict", attributes={"model": MODEL_NAME})
    def predict(rows: list[list[float]]) -> list[int]:
        return predict_rows(model, rows)

    _configure(args, TracerProvider(), {})
    _say(
        f"profkit demo --no-server: {args.calls} calls of the handler in a plain loop (no "
        f"server, no request spans), 1 in {args.every} profiled, torch threads {THREADS}"
    )
    rows = torch.randn(args.batch, FEATURES).tolist()
    t0 = time.perf_counter()
    for _ in range(args.calls):
        predict(rows)
    return _finish(f"ran {args.calls} calls in {time.perf_counter() - t0:.2f} s", 0)


# -- the service ----------------------------------------------------------------------------


def build_app(model: Any, provider: Any) -> Any:
    """The FastAPI app: ``POST /predict`` (labelled by instrument_app) and ``GET /healthz``."""
    from fastapi import FastAPI
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    from pydantic import BaseModel

    from .integrations.fastapi import instrument_app

    class Batch(BaseModel):
        rows: list[list[float]]

    app = FastAPI(title="profkit demo")

    @app.post("/predict")
    def predict(batch: Batch) -> dict[str, list[int]]:
        return {"classes": predict_rows(model, batch.rows)}

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
    import torch

    torch.manual_seed(1)
    rows = torch.randn(args.batch, FEATURES).tolist()
    body = {"rows": [[round(x, 3) for x in row] for row in rows]}
    failed = 0
    with httpx.Client(base_url=url, timeout=30.0) as client:
        for _ in range(args.calls):
            try:
                ok = client.post("/predict", json=body).status_code == 200
            except httpx.HTTPError:
                ok = False
            failed += 0 if ok else 1
    return failed
