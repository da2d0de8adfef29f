"""add_trigger_route: a token-protected ``POST /profkit/trigger``, served for real."""

from __future__ import annotations

import httpx
import pytest
import torch
from fastapi import FastAPI
from live_server import serve

import profkit
from profkit._global import get_session
from profkit.integrations.fastapi import add_trigger_route, instrument_app
from profkit.testing import capture

pytestmark = pytest.mark.timeout(120)

TOKEN = "s3cret-token"
GOOD = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json"}


def build_app() -> FastAPI:
    app = FastAPI()

    @app.get("/a")
    def route_a() -> dict[str, float]:
        return {"sum": float(torch.ones(4).sum())}

    @app.get("/b")
    def route_b() -> dict[str, float]:
        return {"sum": float(torch.ones(8).sum())}

    add_trigger_route(app, token=TOKEN)
    instrument_app(app)  # after: the admin route itself is never a root call
    return app


def test_trigger_route_is_token_protected_and_triggers_the_label() -> None:
    """401 without or with a wrong token, 422 on a bad n; then exactly the asked calls."""
    app = build_app()
    with capture(sample_every=10**9) as cap, serve(app) as url:
        with httpx.Client(base_url=url, timeout=30.0) as client:
            client.get("/a").raise_for_status()  # call 0: the sampler's own pick
            refused = [
                client.post("/profkit/trigger"),
                client.post("/profkit/trigger", headers={"Authorization": "Bearer nope"}),
                client.post("/profkit/trigger", headers={"Authorization": TOKEN}),
                client.post("/profkit/trigger", headers={"Authorization": f"Basic {TOKEN}"}),
                client.post("/profkit/trigger", params={"n": 0}),  # no token: 401 first
                client.post("/profkit/trigger", content=b"{bad", headers=JSON),  # here too
            ]
            bad_n = [
                client.post("/profkit/trigger", params={"n": n}, headers=GOOD).status_code
                for n in (0, -1, 101, "x")
            ] + [
                client.post("/profkit/trigger", json=body, headers=GOOD).status_code
                for body in ({"n": 0}, {"n": True}, {"n": 2.0}, [1])
            ]
            labelled = client.post("/profkit/trigger", json={"n": 1, "label": "/b"}, headers=GOOD)
            for path in ("/a", "/b", "/b"):
                client.get(path).raise_for_status()
            queried = client.post("/profkit/trigger", params={"n": 2}, headers=GOOD)
            for path in ("/a", "/b", "/a"):
                client.get(path).raise_for_status()
        assert profkit.force_flush(30.0)
    assert [401] * 6 == [r.status_code for r in refused]
    assert "Bearer" == refused[1].headers["www-authenticate"]
    assert [422] * 8 == bad_n
    assert (200, {"triggered": 1, "label": "/b", "pending": 1, "capped": False}) == (
        labelled.status_code,
        labelled.json(),
    )
    assert (200, {"triggered": 2, "label": None, "pending": 2, "capped": False}) == (
        queried.status_code,
        queried.json(),
    )
    got = [(c.label, c.policy) for c in cap.calls]
    assert [
        ("/a", "every:1000000000"),
        ("/b", "trigger"),
        ("/a", "trigger"),
        ("/b", "trigger"),
    ] == got
    assert 7 == cap.stats["root_calls"]  # the admin route is not one


def test_no_token_no_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a token (argument or PROFKIT_TRIGGER_TOKEN) nothing is mounted: ValueError."""
    monkeypatch.delenv("PROFKIT_TRIGGER_TOKEN", raising=False)
    app = FastAPI()
    for token in (None, "", "   "):
        with pytest.raises(ValueError, match="token"):
            add_trigger_route(app, token=token)
    assert [] == [r for r in app.routes if getattr(r, "path", "") == "/profkit/trigger"]


def test_token_from_the_environment_and_a_custom_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """PROFKIT_TRIGGER_TOKEN is read when the route is added; the path can be moved."""
    monkeypatch.setenv("PROFKIT_TRIGGER_TOKEN", "from-env")
    app = FastAPI()
    add_trigger_route(app, path="/admin/profile")
    profkit.configure(exporters=(), sample_every=10**9)
    with serve(app) as url, httpx.Client(base_url=url, timeout=30.0) as client:
        ok = client.post("/admin/profile?n=3&label=x", headers={"Authorization": "Bearer from-env"})
        wrong = client.post("/admin/profile", headers=GOOD)
        default_path = client.post("/profkit/trigger", headers={"Authorization": "Bearer x"})
        schema = client.get("/openapi.json").json()
    assert (200, {"triggered": 3, "label": "x", "pending": 3, "capped": False}) == (
        ok.status_code,
        ok.json(),
    )
    assert (401, 404) == (wrong.status_code, default_path.status_code)
    assert "/admin/profile" not in schema["paths"]  # an admin route: not advertised


def test_before_configure_the_route_says_so() -> None:
    """With no profkit session a trigger would do nothing: 503, not a false 200."""
    app = FastAPI()
    add_trigger_route(app, token=TOKEN)
    with serve(app) as url:
        response = httpx.post(f"{url}/profkit/trigger", headers=GOOD, timeout=30.0)
    assert 503 == response.status_code


def test_a_body_that_is_not_utf8_is_a_422_not_a_server_error() -> None:
    """A token holder's body of bytes that are not UTF-8 is a bad body (422), not a 500 from
    FastAPI failing to echo the raw bytes back in the validation error; nothing triggered."""
    profkit.configure(exporters=(), sample_every=10**9)
    with serve(build_app()) as url, httpx.Client(base_url=url, timeout=30.0) as client:
        answers = [
            client.post("/profkit/trigger", content=body, headers={**GOOD, **JSON})
            for body in (b"\xff\xfe", b'{"n": 2, "label": "\xe9"}')
        ]
    assert [422, 422] == [r.status_code for r in answers], [r.text for r in answers]
    assert all(r.json()["detail"][0]["loc"][0] == "body" for r in answers)
    session = get_session()
    assert session is not None
    assert not session.triggered.pending
