"""An exporter for Ray Serve's own tracing that keeps none of Ray Serve's spans.

``serve.start(tracing_config=TracingConfig(enabled=True,
exporter_import_path="examples.ray_serve.serve_tracing:no_serve_spans"))``: Ray Serve's
context and sampling decision still reach every replica (profkit's spans there go to the
TracerProvider of ``examples.ray_serve.app.providers``). A module of its own: Ray Serve's
proxy imports it too, and needs neither torch nor the model for that.
"""

from __future__ import annotations

from typing import Any


def no_serve_spans() -> list[Any]:
    """No span processor: return some (OTLP's) to keep Ray Serve's spans as well."""
    return []
