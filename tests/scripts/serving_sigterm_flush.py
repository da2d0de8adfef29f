"""uvicorn serving an instrumented FastAPI app, stopped by SIGTERM with spans still queued.

Argument: a folder. The script writes ``port`` there once it serves; the span exporter
appends one line per span to ``spans`` (held while the test keeps a file ``hold`` there);
the app's own lifespan shutdown (which runs after profkit's flush, and shuts its
TracerProvider down) writes ``stats``. uvicorn then re-raises SIGTERM: the process dies
without Python's exit hooks.
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
    """One line per span in ``spans``; profkit's are held while ``hold`` exists: a backlog."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        ours = any(
            s.instrumentation_scope and s.instrumentation_scope.name == "profkit" for s in spans
        )
        deadline = time.monotonic() + 30  # (FastAPI's own spans, on the event loop, go on)
        while ours and (out / "hold").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        with (out / "spans").open("a") as fh:
            for span in spans:
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
    provider.shutdown()


app = FastAPI(lifespan=lifespan)


@app.get("/work")
def work() -> dict[str, float]:
    return {"sum": float(torch.ones(8).sum())}


instrument_app(app)
profkit.configure(sample_every=1, max_per_minute=None, exporters=("otel",), export_timeout=30.0)
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
server = uvicorn.Server(config)
(out / "port").write_text(str(sock.getsockname()[1]))
server.run(sockets=[sock])
