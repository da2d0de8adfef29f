"""The token-streaming example (examples/streaming_service) served for real under uvicorn.

Concurrent clients stream tokens from the sync generator endpoint (Starlette steps it
through ``iterate_in_threadpool``, so steps hop threads) and the async generator endpoint,
sampled every time. Every stream completes with the same tokens it would have without
profkit, no profiler stays on, and the sampled streams' spans sit inside their requests.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from test_examples import ROOT, example_env, free_port, stop_gracefully, wait_until_up

CLIENTS = 12
ROUNDS = 3
TOKENS = 24


async def _stream(client: httpx.AsyncClient, url: str) -> str:
    async with client.stream("GET", url, timeout=60.0) as response:
        response.raise_for_status()
        return "".join([chunk async for chunk in response.aiter_text()])


async def _clients(base: str) -> list[str]:
    async with httpx.AsyncClient() as client:
        urls = [
            f"{base}/{path}?prompt=3,1,4&tokens={TOKENS}"
            for _ in range(ROUNDS)
            for path in ("generate", "agenerate")
        ]
        out: list[str] = []
        for i in range(0, len(urls), 2):
            pair = urls[i : i + 2] * (CLIENTS // 2)
            out += await asyncio.gather(*(_stream(client, u) for u in pair))
        # then one of each alone: under the concurrent rounds either kind may find the one
        # window slot always taken by the other (skipped_busy); these two are exported
        for url in urls[:2]:
            out.append(await _stream(client, url))
        return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_streaming_example_under_concurrent_clients(tmp_path: Path) -> None:
    """12 concurrent clients x 3 rounds, both endpoints: identical streams, no profiler left."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    env = example_env(PROFKIT_SAMPLE_EVERY="1", PROFKIT_EXPORTERS="otel")
    command = [sys.executable, "-m", "uvicorn", "examples.streaming_service.app:app"]
    with log.open("wb") as out:
        server = subprocess.Popen(
            [*command, "--port", str(port)], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            wait_until_up(base, server, log, timeout=120.0)
            try:
                streams = asyncio.run(_clients(base))
            except httpx.HTTPError as exc:
                pytest.fail(f"{exc!r}\n{log.read_text(errors='replace')[-6000:]}")
            stats = httpx.get(f"{base}/profkit/stats", timeout=10.0).json()
        finally:
            returncode = stop_gracefully(server)
    text = log.read_text(errors="replace")
    assert 0 == returncode, text[-4000:]
    assert CLIENTS * ROUNDS * 2 // 2 + 2 == len(streams)
    assert 1 == len(set(streams)), "every stream yields the same tokens"
    assert TOKENS == len(streams[0].split())
    assert 0 == stats["errors"], stats
    assert stats["profiler_flag"] is False
    assert stats["exported"] >= 2, stats
    spans = [json.loads(line) for line in text.splitlines() if line.startswith('{"name"')]
    by_id = {s["context"]["span_id"]: s for s in spans}
    generated = [s for s in spans if s["name"] in ("generate", "agenerate")]
    assert {"generate", "agenerate"} == {s["name"] for s in generated}
    for span in generated:
        parent = by_id[span["parent_id"]]
        assert "SERVER" == parent["kind"].removeprefix("SpanKind.")
        assert parent["name"].startswith("GET /")
    truncated = {
        s["attributes"].get("profkit.truncated") for s in generated if s["name"] == "generate"
    }
    assert {"first_step"} == truncated  # the thread-hopping stream says what it recorded
    assert "Profiler is already enabled" not in text
    assert "disableProfiler called" not in text
