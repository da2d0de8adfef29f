"""uvicorn serving an instrumented FastAPI app whose span export takes 0.2 s a span, stopped
by SIGTERM with most spans still queued (issue 38, case 4).

Argument: a folder. The script writes ``port`` there once it serves; the span exporter
appends one line per span to ``spans`` (each after 0.2 s); the app's own lifespan shutdown
writes ``stats``. uvicorn then re-raises SIGTERM: the process dies without Python's exit
hooks, whatever is still queued with it.
"""

import contextlib
import json
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import torch
import uvicorn
from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

import profkit
from profkit.integrations.fastapi import instrument_app

out = Path(sys.argv[1])


class SlowFileExporter:
    """One line per profkit span in ``spans``, each after 0.2 s (a slow collector)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        ours = [
            s
            for s in spans
            if s.instrumentation_scope and s.instrumentation_scope.name == "profkit"
        ]
        for span in ours:
            if (out / "hold").exists():
                time.sleep(0.2)
            with (out / "spans").open("a") as fh:
                fh.write(f"{span.name}\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(SlowFileExporter()))  # type: ignore[arg-type]
trace.set_tracer_provider(provider)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    (out / "stats").write_text(json.dumps(profkit.stats()))


app = FastAPI(lifespan=lifespan)


@app.get("/work")
def work() -> dict[str, float]:
    return {"sum": float(torch.ones(8).sum())}


instrument_app(app)
profkit.configure(
    sample_every=1, max_per_minute=None, exporters=("otel",), queue_size=100, max_overhead=None
)
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
server = uvicorn.Server(config)
(out / "port").write_text(str(sock.getsockname()[1]))
server.run(sockets=[sock])
