"""The README's first snippet, as a newcomer copies it: a fresh interpreter, nothing set up.

No TracerProvider, no structlog configuration, no ``PROFKIT_*`` variable: the snippet must
print its summaries and nothing that looks like a failure, and ``shutdown()`` says True.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def use_it_snippet() -> str:
    """The first ```python block under the README's "Use it" heading."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Use it", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "README's 'Use it' has no python block"
    return match.group(1)


def run_clean(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter with no PROFKIT_/OTEL_ variable, this checkout first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROFKIT_", "OTEL_"))}
    env["PYTHONPATH"] = str(ROOT)
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-W", "default", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.slow
def test_the_use_it_snippet_runs_clean_with_nothing_configured(tmp_path: Path) -> None:
    """No warning, no error line, the summaries printed, ``shutdown()`` True."""
    code = use_it_snippet().replace("profkit.shutdown()", "print('SHUTDOWN', profkit.shutdown())")
    code += "\nprint('AFTER', profkit.stats())\n"  # (the snippet's own print may race the export)
    done = run_clean(code, tmp_path)
    assert 0 == done.returncode, done.stderr
    out = done.stdout + done.stderr
    assert "SHUTDOWN True" in done.stdout, out
    assert 3 == out.count("profkit.profile"), out  # 300 calls at 1 in 100: three summaries
    assert "Warning" not in out, out
    assert "span_not_recording" not in out, out
    stats_line = next(line for line in done.stdout.splitlines() if line.startswith("AFTER"))
    assert "'errors': 0" in stats_line, stats_line
    assert "'exported': 3" in stats_line, stats_line


PROVIDER_LATER = """
import profkit, torch
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

profkit.configure(sample_every=1, cold_calls=0)

@profkit.profiled
def predict(x):
    return x @ x

predict(torch.ones(4, 4))
assert profkit.force_flush(30.0)
spans = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(provider)          # after configure(): spans flow from now on
predict(torch.ones(4, 4))
print("FLUSHED", profkit.force_flush(30.0))
print("SPANS", sorted(s.name for s in spans.get_finished_spans()))
print("SHUTDOWN", profkit.shutdown())
"""


def test_a_tracer_provider_set_after_configure_gets_the_spans(tmp_path: Path) -> None:
    """Spans start flowing the moment the application sets a provider."""
    done = run_clean(PROVIDER_LATER, tmp_path)
    assert 0 == done.returncode, done.stderr
    assert "FLUSHED True" in done.stdout, done.stdout + done.stderr
    assert "SPANS ['predict']" in done.stdout, done.stdout
    assert "SHUTDOWN True" in done.stdout, done.stdout
    assert "Warning" not in done.stderr, done.stderr


CLAIM = re.compile(
    r"Off-sample, a decorated call adds \*\*(?P<us>[\d.]+) µs\*\*.*?target, (?P<limit>[\d.]+) µs,"
    r" is \*\*(?P<met>met|not met)\*\*",
    re.S,
)
ROW = re.compile(
    r"^\| Off-sample `@profiled` root call, added to the bare call \| <= (?P<limit>[\d.]+) µs"
    r" \| (?P<us>[\d.]+) µs \| (?P<met>yes|\*\*no\*\*) \|$",
    re.M,
)


def test_the_readmes_off_sample_cost_is_the_results_blocks() -> None:
    """The README quotes docs/performance.md's measured off-sample cost, limit and verdict."""
    claim = CLAIM.search(README.read_text(encoding="utf-8"))
    assert claim is not None, "README states the off-sample cost"
    results = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    results = results.split("<!-- bench:start -->", 1)[1]
    row = ROW.search(results)
    assert row is not None, "the results block has the off-sample row"
    assert f"{float(row['us']):.1f}" == claim["us"]
    assert float(row["limit"]) == float(claim["limit"])
    assert ("met" if row["met"] == "yes" else "not met") == claim["met"]
