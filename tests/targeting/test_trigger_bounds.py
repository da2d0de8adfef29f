"""Triggers are bounded (issue #26 item 5): the admin route answers 422, never 500, for any
value it cannot use, and the triggers pending stay at MAX_PENDING in all, however many
``trigger()`` calls and route requests pile up."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from live_server import serve

import profkit
from profkit._global import get_session
from profkit._sampling import MAX_PENDING, Triggered
from profkit.integrations.fastapi import add_trigger_route

pytestmark = pytest.mark.timeout(120)

TOKEN = "s3cret-token"
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

#: bodies a token holder may send that name nothing profkit can use
BAD_BODIES = [
    b'{"n": 1e400}',
    b'{"n": -1e400}',
    b'{"n": NaN}',
    b'{"n": Infinity}',
    b'{"n": -Infinity}',
    b'{"n": -5}',
    b'{"n": 0}',
    b'{"n": true}',
    b'{"n": 2.5}',
    b'{"n": "3"}',
    b'{"n": null}',
    b'{"n": 1' + b"0" * 5000 + b"}",
    b'{"n": -1' + b"0" * 5000 + b"}",
    b'{"n": 18446744073709551616}',
    b'{"n": {"a": 1e400}}',
    b'{"n": [1e400, NaN]}',
    b'{"n": 1, "label": 1e400}',
    b'{"label": {"x": [1, {"y": 1e400}]}}',
    b'{"label": ""}',
    b'{"label": "\\ud800"}',
    b'{"n": 1, "label": "a\\udcffb"}',
    b"1e400",
    b"[1e400]",
    b'"\\ud800"',
    b"NaN",
    b"{bad",
    b"\xff\xfe",
    b'{"n": 2, "label": "\xe9"}',
    b'{"n": 1, "label": "' + b"x" * 100_000 + b'"}',
    b"[" * 10_000 + b"]" * 10_000,
]

#: query strings a token holder may send that name nothing profkit can use
BAD_QUERIES = [
    "n=1e400",
    "n=inf",
    "n=nan",
    "n=-1",
    "n=true",
    "n=1" + "0" * 5000,
    "n=%ff",
    "label=",
    "label=%ed%a0%80",
    "label=" + "x" * 10_000,
]


def _app() -> FastAPI:
    app = FastAPI()
    add_trigger_route(app, token=TOKEN)
    return app


def test_the_route_answers_422_for_every_value_it_cannot_use() -> None:
    profkit.configure(exporters=(), sample_every=10**9)
    with serve(_app()) as url, httpx.Client(base_url=url, timeout=30.0) as client:
        by_body = {
            body[:40]: client.post("/profkit/trigger", content=body, headers=HEADERS)
            for body in BAD_BODIES
        }
        by_query = {
            query[:40]: client.post(f"/profkit/trigger?{query}", headers=HEADERS)
            for query in BAD_QUERIES
        }
    for what, response in [*by_body.items(), *by_query.items()]:
        assert response.status_code == 422, (what, response.status_code, response.text[:300])
        assert response.json()["detail"], what  # a JSON answer that names the problem
        assert len(response.content) < 20_000, what  # the input is not echoed back
    session = get_session()
    assert session is not None
    assert not session.triggered.pending  # nothing triggered


def test_the_route_says_how_many_are_pending_and_when_it_capped() -> None:
    """50 requests of n=100 leave MAX_PENDING pending, not 5000; the answer says so."""
    profkit.configure(exporters=(), sample_every=10**9)
    with serve(_app()) as url, httpx.Client(base_url=url, timeout=30.0) as client:
        answers = [
            client.post("/profkit/trigger", json={"n": 100}, headers=HEADERS).json()
            for _ in range(50)
        ]
    assert answers[0] == {"triggered": 100, "label": None, "pending": 100, "capped": False}
    assert answers[9] == {"triggered": 100, "label": None, "pending": 1000, "capped": False}
    assert answers[10] == {"triggered": 0, "label": None, "pending": 1000, "capped": True}
    assert answers[-1]["pending"] == MAX_PENDING
    session = get_session()
    assert session is not None
    assert session.triggered.pending == MAX_PENDING


def test_pending_triggers_are_capped_in_all() -> None:
    """Any label and per label together: MAX_PENDING at most; add() says what it granted."""
    assert MAX_PENDING == 1000
    t = Triggered()
    assert t.add(600) == 600
    assert t.add(600, "a") == 400
    assert t.add(1, "b") == 0
    assert t.pending == MAX_PENDING
    for _ in range(50):
        t.signalled()  # a signal beyond the cap is folded in, and capped, too
    assert t.add(1) == 0
    assert t.pending == MAX_PENDING
    taken = sum(t.take("a") for _ in range(2 * MAX_PENDING))
    assert taken == MAX_PENDING
    assert not t.pending
    assert t.add(10**100) == MAX_PENDING  # a huge n is the cap, not a raise


def test_trigger_beyond_the_cap_keeps_the_cap_and_does_not_raise() -> None:
    profkit.configure(exporters=(), sample_every=10**9)
    for _ in range(50):
        profkit.trigger(100)
    profkit.trigger(10**12, label="predict")
    session = get_session()
    assert session is not None
    assert session.triggered.pending == MAX_PENDING
    with pytest.raises(ValueError):
        profkit.trigger(0)  # what was an error stays one
