"""``python -m profkit demo`` (what ``./scripts/demo`` runs): a real loopback service whose
sampled calls print on stdout under their SERVER spans; ``--json``; ``--no-server``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import profkit
from profkit import __main__ as cli
from profkit import _demo
from profkit.testing import capture

ROOT = Path(__file__).resolve().parents[1]
HEADER = re.compile(r"^── in SERVER span 'POST /predict' ([0-9a-f]{16}), trace ([0-9a-f]{32})$")


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    """The demo in a subprocess, from the repository root, without PROFKIT_*/KINETO_* set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROFKIT_", "KINETO_"))}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "profkit", "demo", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert 0 == result.returncode, result.stdout + result.stderr
    return result


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_serves_and_prints_summaries_under_server_spans() -> None:
    """40 requests, 1 in 10 profiled: 4 summaries on stdout, each under its own SERVER span."""
    result = run_demo("--calls", "40", "--every", "10")
    lines = result.stdout.splitlines()
    headers = [m for m in (HEADER.match(line) for line in lines) if m]
    blocks = [line for line in lines if line.startswith("profkit ▸ /predict ")]
    own_traces = [line.split()[1] for line in lines if line.startswith("  trace ")]
    assert (4, 4) == (len(headers), len(blocks))
    assert [m.group(2) for m in headers] == own_traces  # the call's span is in the request's trace
    assert 4 == len({m.group(2) for m in headers})  # one trace per request, none leaked
    assert "USDT" not in result.stdout + result.stderr
    assert "served 40 requests (0 failed)" in result.stderr
    assert "torch threads 1" in result.stderr
    assert "sampled 4, exported 4, dropped 0, errors 0" in result.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_json_prints_only_json_lines() -> None:
    """``--json``: stdout is exactly one profkit.profile JSON object per sampled call."""
    result = run_demo("--calls", "20", "--every", "10", "--json")
    events = [json.loads(line) for line in result.stdout.splitlines()]
    expected = [("profkit.profile", "/predict", True)] * 2
    assert expected == [(e["event"], e["label"], len(e["trace_id"]) == 32) for e in events]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_without_server_says_what_it_does() -> None:
    """``--no-server``: a plain loop, summaries on stdout, no SERVER span, no "served" lie."""
    result = run_demo("--no-server", "--calls", "30", "--every", "10")
    assert 3 == result.stdout.count("profkit ▸ predict ")
    assert 3 == result.stdout.count("── no request span (--no-server: a plain loop)\n")
    assert "SERVER" not in result.stdout + result.stderr
    assert "served" not in result.stderr
    assert "ran 30 calls in " in result.stderr
    assert "plain loop (no server, no request spans)" in result.stderr
    assert "torch threads 1" in result.stderr
    for region in ("preprocess", "inference", "postprocess"):
        assert 3 == result.stdout.count(f"  region {region} ")
    assert "aten::" in result.stdout


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m profkit --version`` prints the package version."""
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert (0, f"profkit {profkit.__version__}\n") == (exc.value.code, capsys.readouterr().out)


def test_demo_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    """``demo --help`` names every option, ``--no-server`` included."""
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    out = capsys.readouterr().out
    expected = ["--calls", "--every", "--batch", "--json", "--no-server"]
    assert expected == [opt for opt in expected if opt in out]


def test_demo_rejects_nonpositive_counts(capsys: pytest.CaptureFixture[str]) -> None:
    """``--calls 0`` is a usage error (exit 2), before anything starts."""
    assert 2 == cli.main(["demo", "--calls", "0"])
    assert ">= 1" in capsys.readouterr().err


def test_demo_rejects_a_batch_too_big_to_make(capsys: pytest.CaptureFixture[str]) -> None:
    """``--batch 100000000`` would allocate hundreds of GB: a usage error, not a traceback."""
    assert 2 == cli.main(["demo", "--no-server", "--calls", "1", "--batch", "100000000"])
    err = capsys.readouterr().err
    assert "--batch must be <= 1024" in err
    assert "Traceback" not in err


def test_token_ids_hash_words_into_the_vocabulary() -> None:
    """No tokeniser: a start token, then one bucket per word (case-free), at most TOKENS."""
    ids = _demo.token_ids("Markets rally, markets FALL " + "word " * 100)
    assert (1, ids[1], _demo.TOKENS) == (ids[0], ids[3], len(ids))
    assert all(2 <= i < _demo.VOCAB for i in ids[1:])


def test_the_demo_model_is_a_transformer_text_classifier() -> None:
    """One profiled call of the demo's handler: its three regions, the encoder's attention
    ops in the table, and one (label, score) per text (none for no text)."""
    old = torch.get_num_threads()
    torch.set_num_threads(_demo.THREADS)
    try:
        model = _demo.build_model()
        texts = _demo.sample_texts(5)
        with capture(sample_every=1, top_k=1000) as cap:
            answers = profkit.profiled("predict")(_demo.predict_texts)(model, texts)
            assert profkit.force_flush(30.0)
    finally:
        torch.set_num_threads(old)
    (call,) = cap.calls
    assert ["predict", "preprocess", "inference", "postprocess"] == [s.label for s in call.scopes]
    ops = {row.name for row in call.root.ops}
    expected = {"aten::embedding", "aten::_native_multi_head_attention", "aten::native_layer_norm"}
    assert expected <= ops, ops
    assert (5, []) == (len(answers), _demo.predict_texts(model, []))
    assert all(a["label"] in _demo.LABELS and 0.0 < a["score"] <= 1.0 for a in answers)
