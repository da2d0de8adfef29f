"""profkit.integrations.fastapi: every route handler a labelled root call, served for real.

The app runs under uvicorn on a loopback port (tests/live_server.py) and is driven with
httpx, so sync handlers run on FastAPI's thread pool, async ones on the event loop and
streamed bodies through Starlette's iteration, as in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import torch
from fastapi import APIRouter, FastAPI
from fastapi.responses import StreamingResponse
from live_server import serve

import profkit
from profkit.integrations.fastapi import instrument_app
from profkit.testing import Capture, capture

pytestmark = pytest.mark.timeout(120)


def build_app() -> FastAPI:
    """Sync, async, path-parameter, generator-streamed and StreamingResponse routes."""
    app = FastAPI()

    @app.get("/sync")
    def sync_route() -> dict[str, float]:
        with profkit.region("model"):
            return {"sum": float(torch.ones(8).sum())}

    @app.get("/async/{n}")
    async def async_route(n: int) -> dict[str, float]:
        await asyncio.sleep(0)
        return {"sum": float(torch.arange(n, dtype=torch.float32).sum())}

    @app.get("/lines")
    def lines_route() -> Iterator[dict[str, float]]:
        for i in range(3):  # FastAPI streams a generator endpoint as JSON lines
            yield {"mean": float(torch.full((4,), float(i)).mean())}

    @app.get("/stream")
    def stream_route() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            for i in range(3):
                yield f"{i}\n".encode()

        _ = torch.zeros(2) + 1  # the handler's own work, before the body streams
        return StreamingResponse(chunks(), media_type="text/plain")

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _get_all(url: str, paths: list[str]) -> list[tuple[int, str]]:
    with httpx.Client(base_url=url, timeout=30.0) as client:
        return [(r.status_code, r.text) for r in (client.get(p) for p in paths)]


def _run(app: FastAPI, paths: list[str]) -> tuple[Capture, list[tuple[int, str]]]:
    with capture(sample_every=1) as cap, serve(app) as url:
        responses = _get_all(url, paths)
        assert profkit.force_flush(30.0)
    return cap, responses


def _ops(cap: Capture, label: str) -> set[str]:
    (call,) = [c for c in cap.calls if c.label == label]
    return {row.name for row in call.root.ops}


def test_sync_and_async_routes_are_root_calls_labelled_by_path_template() -> None:
    """A sync and an async route: one sampled root call each, label = the path template."""
    app = build_app()
    assert 4 == instrument_app(app, exclude=["/healthz"])
    cap, responses = _run(app, ["/sync", "/async/4", "/healthz"])
    assert [(200, '{"sum":8.0}'), (200, '{"sum":6.0}'), (200, '{"status":"ok"}')] == responses
    assert ["/async/{n}", "/sync"] == sorted(c.label for c in cap.calls)
    assert {"aten::ones", "aten::sum"} <= _ops(cap, "/sync")
    assert {"aten::arange", "aten::sum"} <= _ops(cap, "/async/{n}")
    (sync_call,) = [c for c in cap.calls if c.label == "/sync"]
    assert ["/sync", "model"] == [s.label for s in sync_call.scopes]
    assert "/sync" == sync_call.root.attributes["http.route"]


def test_streaming_routes_pass_their_bodies_through() -> None:
    """A generator endpoint and a StreamingResponse: bodies unchanged, both labelled."""
    app = build_app()
    instrument_app(app)
    cap, responses = _run(app, ["/lines", "/stream"])
    lines = [json.loads(line) for line in responses[0][1].splitlines()]
    assert [(200, [0.0, 1.0, 2.0]), (200, "0\n1\n2\n")] == [
        (responses[0][0], [line["mean"] for line in lines]),
        responses[1],
    ]
    assert ["/lines", "/stream"] == sorted(c.label for c in cap.calls)
    assert {"aten::full", "aten::mean"} <= _ops(cap, "/lines")  # the generator's own work
    assert "aten::add" in _ops(cap, "/stream")  # the handler's, before the body streams


def test_included_routers_are_labelled_with_their_prefix() -> None:
    """Routes of an included router get the full path template as their label."""
    app = FastAPI()
    router = APIRouter(prefix="/v1")

    @router.get("/items/{item_id}")
    def item(item_id: int) -> dict[str, int]:
        return {"id": int(torch.tensor(item_id).item())}

    app.include_router(router)
    instrument_app(app)
    cap, responses = _run(app, ["/v1/items/7"])
    assert ([(200, '{"id":7}')], ["/v1/items/{item_id}"]) == (
        responses,
        [c.label for c in cap.calls],
    )


def test_instrumenting_twice_labels_only_new_routes() -> None:
    """A second call wraps nothing twice, and picks up routes added since."""
    app = build_app()
    first = instrument_app(app)

    @app.get("/late")
    def late() -> dict[str, bool]:
        return {"late": True}

    second = instrument_app(app)
    cap, responses = _run(app, ["/sync", "/late"])
    assert (5, 1, [200, 200]) == (first, second, [status for status, _ in responses])
    (sync_call,) = [c for c in cap.calls if c.label == "/sync"]
    assert ["/sync", "model"] == [s.label for s in sync_call.scopes]  # no second /sync scope


def test_extra_attributes_reach_every_route() -> None:
    """``attributes=`` lands on each route's root scope, next to ``http.route``."""
    app = build_app()
    instrument_app(app, attributes={"model": "mlp"})
    cap, _ = _run(app, ["/async/3"])
    expected = {"http.route": "/async/{n}", "model": "mlp"}
    assert expected == dict(cap.calls[0].root.attributes)


def test_wrong_decorator_order_warns() -> None:
    """@profiled above @app.get profiles nothing (FastAPI keeps the undecorated function):
    a ProfkitConfigWarning says so, naming the route, at the handler's line (#25)."""
    app = FastAPI()

    with pytest.warns(profkit.ProfkitConfigWarning, match="above the route decorator of '/x'"):

        @profkit.profiled("wrong-order")
        @app.get("/x")
        def handler() -> dict[str, int]:
            return {"x": 1}

    with capture(sample_every=1) as cap, serve(app) as url:
        assert [(200, '{"x":1}')] == _get_all(url, ["/x"])
    assert 0 == cap.stats["root_calls"]


def test_the_order_check_never_raises_into_decorating_code() -> None:
    """A value whose type has no string ``__module__`` (a dynamic type, a proxy) among the
    decorating code's locals: the wrong-order check passes over it, decorating works."""
    app = FastAPI()
    odd = type("Odd", (), {"__module__": None})()  # noqa: F841  # a local the check reads

    @app.get("/x")
    @profkit.profiled("odd-neighbour")
    def handler() -> dict[str, int]:
        return {"x": 1}

    with capture(sample_every=1) as cap:
        assert {"x": 1} == handler()
    assert ["odd-neighbour"] == [c.label for c in cap.calls]


def test_the_right_decorator_order_does_not_warn() -> None:
    """@app.get above @profiled: the route calls the wrapper, no warning (filterwarnings=error)."""
    app = FastAPI()

    @app.get("/x")
    @profkit.profiled("right-order")
    def handler() -> dict[str, int]:
        return {"x": 1}

    with capture(sample_every=1) as cap, serve(app) as url:
        assert [(200, '{"x":1}')] == _get_all(url, ["/x"])
    assert ["right-order"] == [c.label for c in cap.calls]


MODULE_APP = FastAPI()


@MODULE_APP.get("/module")
def module_route() -> dict[str, int]:
    """A route of an app that lives in a module's globals."""
    return {"x": 1}


def test_instrument_app_on_a_module_level_app_does_not_warn() -> None:
    """instrument_app wraps endpoints itself: the wrong-order check (which finds the app in
    the endpoint's module) stays quiet (filterwarnings=error), and the route is labelled."""
    assert 1 == instrument_app(MODULE_APP)
    with capture(sample_every=1) as cap, serve(MODULE_APP) as url:
        assert [(200, '{"x":1}')] == _get_all(url, ["/module"])
    assert ["/module"] == [c.label for c in cap.calls]


def test_instrument_app_before_the_routes_warns_once_and_labels_them_at_startup() -> None:
    """instrument_app(app) on an app with no routes yet warns once; the routes added after it
    are labelled when the application starts (its lifespan) (#25)."""
    app = FastAPI()
    with pytest.warns(profkit.ProfkitConfigWarning, match="found no routes"):
        assert 0 == instrument_app(app)
    assert 0 == instrument_app(app)  # once: no second warning (filterwarnings=error)

    @app.get("/later")
    def later() -> dict[str, float]:
        return {"sum": float(torch.ones(4).sum())}

    with capture(sample_every=1) as cap, serve(app, lifespan="on") as url:
        assert [(200, '{"sum":4.0}')] == _get_all(url, ["/later"])
        assert profkit.force_flush(30.0)
    assert ["/later"] == [c.label for c in cap.calls]


@contextlib.contextmanager
def _sigterm_server(
    tmp_path: Path, script: str
) -> Iterator[tuple[subprocess.Popen[str], httpx.Client, str]]:
    """``tests/scripts/<script> tmp_path`` serving: (its process, a client that has had one
    answer, the ``/work`` URL); killed on the way out if it still runs."""
    path = Path(__file__).parent / "scripts" / script
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).parent.parent), env.get("PYTHONPATH", "")) if p
    )
    proc = subprocess.Popen(
        [sys.executable, str(path), str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port_file = tmp_path / "port"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text():
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port_file.read_text()}/work"
        with httpx.Client(timeout=10) as client:
            for _ in range(60):  # a server socket bound but not yet listening refuses
                with contextlib.suppress(httpx.ConnectError):
                    client.get(url)
                    break
                time.sleep(0.05)
            yield proc, client, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.slow
def test_sigterm_under_uvicorn_exports_or_counts_every_sampled_call(tmp_path: Path) -> None:
    """uvicorn's graceful shutdown runs the app's lifespan: profkit flushes there, first."""
    with _sigterm_server(tmp_path, "serving_sigterm_flush.py") as (proc, client, url):
        (tmp_path / "hold").touch()  # the span exporter waits: windows queue up
        for _ in range(10):
            assert 200 == client.get(url).status_code
        client.close()
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        (tmp_path / "hold").unlink()  # the exporter goes on, during the shutdown
        _, err = proc.communicate(timeout=60)
    assert (tmp_path / "stats").exists(), err[-2000:]
    stats = json.loads((tmp_path / "stats").read_text())
    spans = (tmp_path / "spans").read_text().splitlines()
    assert stats["sampled"] >= 10, stats
    assert stats["sampled"] == stats["exported"] + stats["dropped"], stats
    assert stats["exported"] == spans.count("/work"), (stats, len(spans))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigterm_with_slow_span_export_counts_what_it_could_not_deliver(tmp_path: Path) -> None:
    """40 sampled calls, 0.2 s a span, SIGTERM: the shutdown flush delivers what it can in
    its time; the rest are counted dropped and one line on stderr says how many and why."""
    with _sigterm_server(tmp_path, "serving_sigterm_slow_spans.py") as (proc, client, url):
        (tmp_path / "hold").touch()  # from now on each span takes 0.2 s
        for _ in range(40):
            assert 200 == client.get(url).status_code
        client.close()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    stats = json.loads((tmp_path / "stats").read_text())
    delivered = (tmp_path / "spans").read_text().splitlines().count("/work")
    lines = [line for line in err.splitlines() if line.startswith("profkit: ")]
    assert 1 == len(lines), err[-3000:]
    lost = int(lines[0].split()[1])
    assert "shutdown" in lines[0]
    assert 41 == stats["sampled"]
    assert stats["sampled"] == delivered + lost + stats["dropped"], (delivered, lost, stats)
    assert 0 < lost


def test_what_the_shutdown_flush_left_is_counted_and_said_then_export_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An exporter slower than the shutdown flush: after the app's shutdown the calls not
    exported are counted dropped ("shutdown") and one stderr line says so; the process lives
    on and a fresh worker exports later calls."""
    import profkit.integrations.fastapi as integration

    monkeypatch.setattr(integration, "SHUTDOWN_FLUSH_S", 0.3)
    monkeypatch.setattr(integration, "WRITE_OFF_GRACE_S", 5.0)  # (in export: ends in time)
    delivered: list[int] = []

    class Slow:
        name = "slow"

        def export(self, summary: profkit.WindowSummary) -> None:
            time.sleep(0.2)
            delivered.append(len(summary.calls))

    app = FastAPI()

    @app.get("/predict")
    def predict() -> dict[str, float]:
        return {"sum": float(torch.ones(4).sum())}

    assert 1 == instrument_app(app)
    profkit.configure(
        sample_every=1, cold_calls=0, exporters=(), extra_exporters=(Slow(),), queue_size=64
    )
    with serve(app, lifespan="on") as url:
        assert [(200, '{"sum":4.0}')] * 10 == _get_all(url, ["/predict"] * 10)
    stats = profkit.stats()
    lost = stats["dropped_reasons"].get("shutdown", 0)
    assert 0 < lost
    assert stats["sampled"] == sum(delivered) + lost == stats["exported"] + stats["dropped"]
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("profkit: ")]
    said = f"profkit: {lost} sampled calls not exported when the application shut down"
    assert [said] == [x[: len(said)] for x in lines]
    before = sum(delivered)
    with serve(app, lifespan="on") as url:
        assert [(200, '{"sum":4.0}')] == _get_all(url, ["/predict"])
        assert profkit.force_flush(10.0) is False  # (the calls lost at the first shutdown)
    assert before + 1 == sum(delivered)


def test_the_apps_own_shutdown_still_says_false_after_the_integrations_flush() -> None:
    """instrument_app flushes ahead of the app's shutdown code; that flush leaves the answer
    to the app's own ``profkit.shutdown()``, which says False for windows an exporter failed
    (it said True: the hidden flush had answered for them)."""

    class Failing:
        name = "failing"

        def export(self, summary: object) -> None:
            raise ConnectionError("collector down")

    answers: list[bool] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        answers.append(profkit.shutdown(10.0))  # the app's own, as in getting-started

    app = FastAPI(lifespan=lifespan)

    @app.get("/predict")
    def predict() -> dict[str, float]:
        return {"sum": float(torch.ones(4).sum())}

    assert 1 == instrument_app(app)
    profkit.configure(sample_every=1, cold_calls=0, exporters=(), extra_exporters=(Failing(),))
    with serve(app, lifespan="on") as url:
        assert [(200, '{"sum":4.0}')] * 2 == _get_all(url, ["/predict"] * 2)
    assert answers == [False]
    assert profkit.stats()["dropped_reasons"] == {"export_error:failing": 2}


def test_the_shutdown_flush_exports_a_window_waiting_on_the_event_loop() -> None:
    """``window=3`` and async handlers: the fourth call's window waits on the event loop's
    thread for more calls when uvicorn shuts down. The integration's flush (ahead of the
    app's shutdown code, before uvicorn re-raises SIGTERM) exports it; it was left pending,
    to die with the process, neither exported nor counted."""
    from profkit.testing import CaptureExporter

    seen: list[dict[str, object]] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        seen.append(dict(profkit.stats()))  # the app's own shutdown code: no flush of its own

    app = FastAPI(lifespan=lifespan)

    @app.get("/predict")
    async def predict() -> dict[str, float]:
        return {"sum": float(torch.ones(4).sum())}

    assert 1 == instrument_app(app)
    exporter = CaptureExporter()
    profkit.configure(
        sample_every=1,
        cold_calls=0,
        window=3,
        max_window_s=60.0,
        max_per_minute=None,
        exporters=(),
        extra_exporters=(exporter,),
    )
    with serve(app, lifespan="on") as url:
        assert [(200, '{"sum":4.0}')] * 4 == _get_all(url, ["/predict"] * 4)
    (stats,) = seen
    assert (4, 4, 0) == (stats["sampled"], stats["exported"], stats["dropped"])
    assert 4 == len(exporter.calls)
