"""Real in-process OTLP trace receivers for tests, over gRPC and HTTP/protobuf.

Both receivers bind to ``127.0.0.1:0``, decode every ``ExportTraceServiceRequest`` they get into
flat :class:`ReceivedSpan` records and let a test block until enough spans have arrived, e.g.
``with GrpcReceiver() as rx: ...; spans = rx.wait_for(2, timeout=5)``.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterable
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

ExportRequest = trace_service_pb2.ExportTraceServiceRequest
ExportResponse = trace_service_pb2.ExportTraceServiceResponse
_R = TypeVar("_R", bound="_Receiver")


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived on the wire, with ids as lowercase hex strings."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int
    status_message: str
    resource_attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...] = ()
    """(trace id, span id) of each link, as lowercase hex."""


def decode_value(value: AnyValue) -> Any:
    """Turn an OTLP ``AnyValue`` into the matching Python value (arrays become lists)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [decode_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return decode_attributes(value.kvlist_value.values)
    return getattr(value, kind)


def decode_attributes(attributes: Iterable[KeyValue]) -> dict[str, Any]:
    """Turn a repeated ``KeyValue`` field into a plain dict."""
    return {kv.key: decode_value(kv.value) for kv in attributes}


def decode_request(request: ExportRequest) -> list[ReceivedSpan]:
    """Flatten every span of an ``ExportTraceServiceRequest`` into :class:`ReceivedSpan` s."""
    return [
        ReceivedSpan(
            name=span.name,
            trace_id=span.trace_id.hex(),
            span_id=span.span_id.hex(),
            parent_span_id=span.parent_span_id.hex(),
            start_ns=span.start_time_unix_nano,
            end_ns=span.end_time_unix_nano,
            attributes=decode_attributes(span.attributes),
            status_code=int(span.status.code),
            status_message=span.status.message,
            resource_attributes=decode_attributes(rs.resource.attributes),
            links=tuple((li.trace_id.hex(), li.span_id.hex()) for li in span.links),
        )
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]


class _Receiver:
    """Thread-safe span store shared by both transports."""

    endpoint: str

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._spans: list[ReceivedSpan] = []
        self._requests = 0

    def _record(self, request: ExportRequest) -> None:
        spans = decode_request(request)
        with self._cond:
            self._requests += 1
            self._spans.extend(spans)
            self._cond.notify_all()

    @property
    def requests(self) -> int:
        """Number of export requests received so far."""
        with self._cond:
            return self._requests

    def spans(self) -> list[ReceivedSpan]:
        """A snapshot of every span received so far, in arrival order."""
        with self._cond:
            return list(self._spans)

    def wait_for(self, n: int, timeout: float = 10.0) -> list[ReceivedSpan]:
        """Block until at least ``n`` spans arrived; return them or raise ``TimeoutError``."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._spans) >= n, timeout):
                raise TimeoutError(f"got {len(self._spans)} spans, wanted {n}, in {timeout}s")
            return list(self._spans)

    def start(self) -> None:  # pragma: no cover - overridden
        """Start serving."""
        raise NotImplementedError

    def stop(self, grace: float = 0) -> None:  # pragma: no cover - overridden
        """Stop serving and release the port."""
        raise NotImplementedError

    def __enter__(self: _R) -> _R:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: GrpcReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: ExportRequest, context: grpc.ServicerContext) -> ExportResponse:
        self._receiver._record(request)
        return ExportResponse()


class GrpcReceiver(_Receiver):
    """OTLP/gRPC trace receiver; ``endpoint`` is ``"127.0.0.1:PORT"`` (use ``insecure=True``)."""

    def __init__(self, max_workers: int = 4) -> None:
        super().__init__()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the gRPC server."""
        self._server.start()

    def stop(self, grace: float = 0) -> None:
        """Stop the gRPC server, waiting up to ``grace`` seconds for in-flight RPCs."""
        self._server.stop(grace).wait()


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, receiver: HttpReceiver) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.receiver = receiver


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/traces":
            return self._reply(404, b"", "text/plain")
        if self.headers.get_content_type() != "application/x-protobuf":
            return self._reply(415, b"", "text/plain")
        if self.headers.get("Content-Encoding", "").lower() == "gzip":
            body = gzip.decompress(body)
        self.server.receiver._record(ExportRequest.FromString(body))
        self._reply(200, ExportResponse().SerializeToString(), "application/x-protobuf")

    def _reply(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""


class HttpReceiver(_Receiver):
    """OTLP/HTTP protobuf trace receiver; ``endpoint`` is ``"http://127.0.0.1:PORT/v1/traces"``."""

    def __init__(self) -> None:
        super().__init__()
        self._server = _HttpServer(self)
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}/v1/traces"
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="otlp-http-receiver", daemon=True
        )
        self._thread.start()

    def stop(self, grace: float = 0) -> None:
        """Stop serving and close the socket; ``grace`` is accepted for interface parity."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()
