"""Run every benchmark, check the performance budget, write the table the docs quote.

    .venv/bin/python bench/run.py            # full run (a few minutes), writes the results
    .venv/bin/python bench/run.py --quick    # smoke run (CI): few, short rounds
    .venv/bin/python bench/run.py --quick --no-write   # print only

Each section runs in its own fresh interpreter (``bench/<section>.py --json``): overhead,
sampled, first_call, export, slow, budget, budget_load, e2e. The markdown goes to stdout, to
``bench/out/results.md`` (raw numbers in ``bench/out/results.json``) and into
``docs/performance.md`` between the ``<!-- bench:start -->`` and ``<!-- bench:end -->``
markers; SVG plots of them (``bench/plots.py``) go to ``bench/out/`` and, with the docs,
to ``docs/images/bench/``. Numbers are medians with their interquartile range over
repeats; the load average before and after each section is recorded, because the machine
these numbers come from is shared.

The exit status is 0 when every section ran, whether or not every target was met (a
benchmark reports; the table says which targets were missed). It is 1 when a section failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out"
DOC = ROOT / "docs" / "performance.md"
PLOTS = ROOT / "docs" / "images" / "bench"
START = "<!-- bench:start -->"
END = "<!-- bench:end -->"
SECTIONS = (
    "overhead",
    "sampled",
    "window_cost",
    "first_call",
    "export",
    "slow",
    "budget",
    "budget_load",
    "e2e",
)

#: what each target means, for the summary table
TARGETS = {
    "profiled_off_sample_us": ("Off-sample `@profiled` root call, added to the bare call", "µs"),
    "profiled_vs_record_function": (
        "Off-sample `@profiled` added cost / raw `record_function` added cost",
        "x",
    ),
    "region_nested_off_sample_us": (
        "Off-sample `region()` inside an unsampled root call, added",
        "µs",
    ),
    "region_root_off_sample_us": ("Off-sample `region()` as the root call itself, added", "µs"),
    "capture_slow_off_sample_us": (
        "Off-sample `@profiled` root call with `capture_slow=True` (timed), added",
        "µs",
    ),
    "batch_member_off_sample_us": (
        "`batch_member()` in a request's span (off-sample), added to the bare call",
        "µs",
    ),
    "metrics_off_sample_added_us": (
        "Off-sample `@profiled` root call with `metrics=True`, over `metrics=False` (same run)",
        "µs",
    ),
    "sampled_overhead_ms": (
        "Sampled call on the MLP: start + stop + hand-off beyond per-op recording",
        "ms",
    ),
    "window_cost_ratio": (
        "Sampled MLP call + its export (otel + log), process CPU / torch's raw start+call+stop",
        "x",
    ),
    "summarise_off_request_path": (
        "Growth of profkit's request-path share across top_k 5..100 and 10x events "
        "(limit: half the worker's summarise time)",
        "ms",
    ),
    "first_call_ratio": ("First sampled call after configure() / median sampled call", "x"),
    "first_call_ratio_issue_2": ("Same, issue 2's limit", "x"),
    "worker_mlp_ms": ("Worker CPU per MLP window, OTel and structlog exporters included", "ms"),
    "worker_per_event_us": ("Worker CPU per event beyond that (1k to 10k events)", "µs"),
    "worker_metrics_ratio": (
        "Worker CPU per MLP window with `metrics=True` (SDK hand-off included) / without",
        "x",
    ),
    "backlog_skipped_not_dropped": (
        "Full queue: calls skipped before recording (skipped_backlog), none dropped",
        "",
    ),
    "budget_throughput_in_process": (
        "~1 ms calls at 1-in-1 with max_overhead=0.02: CPU throughput / the bare loop's",
        "x",
    ),
    "budget_load_measured_share": (
        "Pool thread beside 2 CPU hogs, max_overhead=0.01: profkit's CPU share, measured",
        "x",
    ),
    "budget_load_agreement_points": (
        "... |profkit's own share (as charged) - the measured share|",
        "x",
    ),
    "throughput_1_in_100": ("E2E throughput at 1-in-100 (no cap) / without profkit", "x"),
    "throughput_budget_1pct": (
        "E2E throughput at 1-in-1 with max_overhead=0.01 / without profkit",
        "x",
    ),
}
#: targets that must stay at or above their limit (the rest must stay at or below)
AT_LEAST = {
    "backlog_skipped_not_dropped",
    "budget_throughput_in_process",
    "throughput_1_in_100",
    "throughput_budget_1pct",
}


def run_section(name: str, quick: bool) -> dict[str, Any]:
    """Run ``bench/<name>.py --json`` in a fresh interpreter; its JSON result."""
    cmd = [sys.executable, str(HERE / f"{name}.py"), "--json"]
    if quick:
        cmd.append("--quick")
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    seconds = time.perf_counter() - t0
    # kineto prints "USDT ... profiler_start/stop" on stderr for every window: not news
    err = "\n".join(line for line in proc.stderr.splitlines() if "USDT" not in line)
    if proc.returncode != 0:
        raise RuntimeError(f"bench section {name} failed ({proc.returncode}):\n{err[-6000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["seconds"] = seconds
    result["loadavg"] = [load_before, os.getloadavg()[0]]
    return result


def _fmt_value(value: float, unit: str) -> str:
    if unit == "":
        return f"{value:.0f}"
    if unit == "x":
        return f"{value:.3f}"
    return f"{value:.3f} {unit}"


def targets_table(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| target | limit | measured (median) | met |", "|---|---|---|---|"]
    for result in results.values():
        for key, t in result.get("targets", {}).items():
            text, unit = TARGETS.get(key, (key, ""))
            op = ">=" if key in AT_LEAST else "<="
            lines.append(
                f"| {text} | {op} {_fmt_value(t['limit'], unit)} "
                f"| {_fmt_value(t['value'], unit)} | {'yes' if t['ok'] else '**no**'} |"
            )
    return "\n".join(lines)


def machine_line(results: dict[str, dict[str, Any]]) -> str:
    m = next(iter(results.values()))["machine"]
    loads = [x for r in results.values() for x in r["loadavg"]]
    return (
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['os']}; Python {m['python']}, "
        f"torch {m['torch']}, wrapt {m['wrapt']}, profkit {m['profkit']}. "
        f"1-minute load average during the run: {min(loads):.1f}-{max(loads):.1f} "
        f"(the machine is shared: other processes compete for the {m['cores']} cores)."
    )


def render(results: dict[str, dict[str, Any]], quick: bool, total_s: float) -> str:
    sys.path.insert(0, str(HERE))
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        f"Run: `bench/run.py{' --quick' if quick else ''}`, {when}, {total_s:.0f} s.",
        "",
        machine_line(results),
        "",
        "### Targets",
        "",
        targets_table(results),
    ]
    titles = {
        "overhead": "Off-sample overhead (CPU ns per call; added = variant - bare, per round)",
        "sampled": "Sampled call: the request path",
        "window_cost": "Per-window CPU against torch's raw start and stop (all threads)",
        "first_call": "First sampled call after configure() (fresh processes)",
        "export": "Export pipeline",
        "slow": "Slow-call capture",
        "budget": "Overhead budget (in process)",
        "budget_load": "Overhead budget beside busy neighbours (pool threads)",
        "e2e": "End to end (uvicorn + FastAPI)",
    }
    for name, result in results.items():
        module = __import__(name)
        parts += ["", f"### {titles[name]}", "", module.render(result)]
    return separate_tables("\n".join(parts) + "\n")


def separate_tables(markdown: str) -> str:
    """A blank line between a caption line and the table under it: without one, Markdown
    reads the table as more lines of the caption's paragraph (raw ``|`` text on the page)."""
    out: list[str] = []
    for line in markdown.split("\n"):
        if line.startswith("|") and out and out[-1].strip() and not out[-1].startswith("|"):
            out.append("")
        out.append(line)
    return "\n".join(out)


def update_doc(table: str) -> None:
    """Replace what lies between the markers in docs/performance.md (appended if missing)."""
    text = DOC.read_text(encoding="utf-8") if DOC.exists() else "# Performance\n"
    block = f"{START}\n{table}{END}"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        tail = rest.split(END, 1)[1]
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    DOC.write_text(text, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: few, short rounds")
    parser.add_argument(
        "--no-write", action="store_true", help="print only; write no results or docs"
    )
    parser.add_argument(
        "--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="sections to run"
    )
    args = parser.parse_args()
    t0 = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    failed = []
    for name in args.only:
        sys.stderr.write(f"bench: {name}...\n")
        try:
            results[name] = run_section(name, args.quick)
        except (RuntimeError, json.JSONDecodeError, IndexError) as exc:
            failed.append(name)
            sys.stderr.write(f"{exc}\n")
            continue
        sys.stderr.write(f"bench: {name} done in {results[name]['seconds']:.0f} s\n")
    if not results:
        return 1
    table = render(results, args.quick, time.perf_counter() - t0)
    sys.stdout.write(table)
    if not args.no_write:
        OUT.mkdir(exist_ok=True)
        (OUT / "results.md").write_text(table, encoding="utf-8")
        (OUT / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
        sys.path.insert(0, str(HERE))
        from plots import write_all

        write_all(results, OUT)
        if not args.quick and not failed and args.only == list(SECTIONS):
            update_doc(table)  # the docs quote full runs of every section only
            write_all(results, PLOTS)  # and show their plots
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
