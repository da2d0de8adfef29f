"""A span waterfall in a real trace UI: one sampled call sent to Arize Phoenix, shot in
headless Chromium (``scripts/screenshots`` runs it).

Usage: ``python scripts/_phoenix_shot.py PHOENIX_BIN CHROMIUM OUT.png``. Phoenix runs from its
own virtualenv (``scripts/setup-phoenix``) on free loopback ports in a temporary folder.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind

import profkit
from profkit.exporters.otlp import otlp_span_processor

PROJECT = "UHJvamVjdDox"  # Phoenix's GraphQL id of its first project, "default" (Project:1)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _send(base: str) -> str:
    """One sampled demo call under a SERVER span, exported to Phoenix; its trace id."""
    from profkit._demo import MODEL_NAME, build_model, predict_texts, sample_texts

    provider = TracerProvider(resource=Resource.create({"service.name": "profkit-demo"}))
    provider.add_span_processor(otlp_span_processor("http/protobuf", endpoint=f"{base}/v1/traces"))
    tracer = provider.get_tracer("profkit-demo")
    model = build_model()

    @profkit.profiled("predict", attributes={"model": MODEL_NAME})
    def predict(texts: list[str]) -> list[dict[str, Any]]:
        return predict_texts(model, texts)

    profkit.configure(sample_every=1, exporters=("otel",), tracer_provider=provider)
    texts = sample_texts(16)
    for _ in range(3):
        predict(texts)  # warm: the picture is of a warm call
    profkit.trigger(1)
    with tracer.start_as_current_span("POST /predict", kind=SpanKind.SERVER) as span:
        predict(texts)
    profkit.force_flush(10.0)
    profkit.shutdown()
    provider.shutdown()
    return f"{span.get_span_context().trace_id:032x}"


def main(phoenix: str, chromium: str, out: str) -> int:
    work = Path(tempfile.mkdtemp())
    port, grpc = _port(), _port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        PHOENIX_HOST="127.0.0.1",
        PHOENIX_PORT=str(port),
        PHOENIX_GRPC_PORT=str(grpc),
        PHOENIX_WORKING_DIR=str(work),
        PHOENIX_TELEMETRY_ENABLED="false",
    )
    base = f"http://127.0.0.1:{port}"
    with open(work / "phoenix.log", "wb") as log:
        server = subprocess.Popen([phoenix, "serve"], env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{base}/healthz") as r:
                if r.status == 200:
                    break
            time.sleep(0.5)
        trace_id = _send(base)
        time.sleep(3)  # Phoenix stores spans asynchronously
        url = f"{base}/projects/{PROJECT}/traces/{trace_id}"
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--window-size=1400,800",
                "--virtual-time-budget=20000",
                f"--screenshot={out}",
                url,
            ],
            capture_output=True,
            timeout=120,
            check=True,
        )
    finally:
        server.terminate()
        server.wait(20)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
