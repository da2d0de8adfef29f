"""The hot paths of this tree against an earlier commit, measured in the same run.

Acceptance check for internal refactors: the off-sample and sampled-call rows must stay
within 5% of the previous code. A git worktree of ``--base`` is made (or reused) under the
temp dir. Each round starts one fresh interpreter per tree (``PYTHONPATH=<tree>``, so that
``import profkit`` resolves to that tree) and the two run in lockstep: the parent asks them
for one short step at a time, alternately (base, new, new, base, ...), while the other one
waits blocked on its pipe. A shared machine's load then hits both trees alike, and each step
gives one paired new/base ratio. The children use only the public API both versions share,
with no exporter but one that discards (export cost is not in it).

    .venv/bin/python bench/compare.py --base HEAD [--new PATH] [--rounds 10] [--steps 6] [--json]

``--new`` defaults to the tree that holds this script (uncommitted edits included).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from _util import batch_ns, diffs, fmt_spread, interleaved, spread

NEW_TREE = Path(__file__).resolve().parent.parent
LIMIT = 1.05
#: per step: off-sample batches of N calls, REPEATS per variant; CALLS sampled + bare calls
N, REPEATS, CALLS = 2000, 5, 20
ROWS = {
    "profiled": "profiled, off-sample root (ns added)",
    "region_nested": "region, nested in off-sample root (ns added)",
    "region_root": "region, off-sample root (ns added)",
    "sampled": "sampled MLP call, start+stop+hand-off (µs added)",
}


# -- child: one tree, one fresh interpreter, steps on request --------------------------------


def _bare(x: Any) -> Any:
    return x


def _child() -> None:
    import torch
    from _util import seeded_mlp  # this script's folder: bench code, the same for both trees

    import profkit

    model, x = seeded_mlp()

    def forward(batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out: torch.Tensor = model(batch)
        return out

    def region_body(v: Any) -> Any:
        with profkit.region("stage"):
            return v

    def nested(fn: Callable[[Any], Any]) -> Callable[[int], float]:
        def run(k: int) -> float:
            with profkit.region("bench.root"):  # an unsampled root call around the batch
                return batch_ns(fn, 1, k)

        return run

    profiled = profkit.profiled(_bare)
    predict = profkit.profiled("predict")(forward)
    batches: dict[str, Callable[[int], float]] = {
        "bare": lambda k: batch_ns(_bare, 1, k),
        "profiled": lambda k: batch_ns(profiled, 1, k),
        "region_root": lambda k: batch_ns(region_body, 1, k),
        "nested_bare": nested(_bare),
        "nested_region": nested(region_body),
    }
    order = [("bare", forward), ("sampled", predict)]
    rng = random.Random(0)

    def off_step() -> dict[str, float]:
        raw = interleaved(batches, rounds=REPEATS, n=N, seed=rng.randrange(1 << 30))
        return {
            "profiled": statistics.median(diffs(raw["profiled"], raw["bare"])),
            "region_root": statistics.median(diffs(raw["region_root"], raw["bare"])),
            "region_nested": statistics.median(diffs(raw["nested_region"], raw["nested_bare"])),
        }

    def sampled_step() -> dict[str, float]:
        """Median wall µs of a sampled MLP call minus the bare call's (worker drained between)."""
        times: dict[str, list[float]] = {"bare": [], "sampled": []}
        exported = profkit.stats()["exported"]
        for _ in range(CALLS):
            rng.shuffle(order)
            for name, fn in order:
                t0 = time.perf_counter_ns()
                fn(x)
                times[name].append((time.perf_counter_ns() - t0) / 1e3)
                profkit.force_flush(10.0)  # outside the timed region
        missed = CALLS - (profkit.stats()["exported"] - exported)
        if missed:  # skipped (busy, budget...): the row would time unprofiled calls
            raise SystemExit(f"{missed} of {CALLS} sampled calls not exported: {profkit.stats()}")
        return {"sampled": statistics.median(times["sampled"]) - statistics.median(times["bare"])}

    class Discard:
        """An exporter that takes every summary and keeps nothing (both versions accept it)."""

        name = "discard"

        def export(self, summary: object) -> None:
            return None

    mode = ""
    print(json.dumps({"file": profkit.__file__}), flush=True)
    for line in sys.stdin:
        step = line.strip()
        if step != mode:  # set up outside the steps the parent times
            mode = step
            every = 10**9 if step == "off" else 1
            profkit.configure(
                sample_every=every, max_per_minute=None, exporters=(), extra_exporters=(Discard(),)
            )
            for _ in range(3):  # "off": the sampler takes call 0; later root calls are off
                predict(x)
                profkit.force_flush(10.0)
        print(json.dumps(off_step() if step == "off" else sampled_step()), flush=True)
    profkit.shutdown(5.0)


# -- parent: worktree, lockstep rounds, table -----------------------------------------------


def _git(*args: str, cwd: Path = NEW_TREE) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def base_tree(base: str) -> tuple[str, Path]:
    """(commit, path) of a detached worktree of ``base``, made or reused under the temp dir."""
    sha = _git("rev-parse", "--verify", f"{base}^{{commit}}")
    path = Path(tempfile.gettempdir()) / "profkit-compare" / sha[:12]
    if path.exists():
        if _git("rev-parse", "HEAD", cwd=path) != sha:
            raise SystemExit(f"{path} exists but is not a worktree of {sha}")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        _git("worktree", "add", "--detach", str(path), sha)
    return sha, path


class Child:
    """A child interpreter measuring one tree, one step per request."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree
        # closed by close(): it lives as long as the child, whose stderr it keeps
        self._err: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child"],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
        )
        imported = Path(self._read()["file"]).resolve()
        if not imported.is_relative_to(tree.resolve()):
            raise SystemExit(f"child for {tree} imported {imported}")

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self._err.seek(0)
            raise SystemExit(f"child for {self.tree} ended:\n{self._err.read()[-4000:]}")
        out: dict[str, Any] = json.loads(line)
        return out

    def step(self, kind: str) -> dict[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(kind + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)
        self._err.close()


def compare(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    sha, old = base_tree(args.base)
    trees = {"base": old, "new": Path(args.new).resolve()}
    values: dict[str, dict[str, list[float]]] = {r: {"base": [], "new": []} for r in ROWS}
    for rnd in range(args.rounds):
        children = {side: Child(tree) for side, tree in trees.items()}
        for kind in ("off", "sampled"):
            for i in range(args.steps):
                sides = ("base", "new") if (rnd + i) % 2 == 0 else ("new", "base")
                for side in sides:
                    for row, value in children[side].step(kind).items():
                        values[row][side].append(value)
        for child in children.values():
            child.close()
        if not args.json:
            print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    rows = {}
    for row, v in values.items():
        ratio = spread([n / b for n, b in zip(v["new"], v["base"], strict=True)])
        rows[row] = {
            "base": spread(v["base"]),
            "new": spread(v["new"]),
            "ratio": ratio,
            "within_5pct": ratio.median <= LIMIT,
            "values": v,
        }
    return {
        "base": sha,
        "base_tree": str(old),
        "new_tree": str(trees["new"]),
        "rounds": args.rounds,
        "steps": args.steps,
        "seconds": round(time.monotonic() - t0, 1),
        "rows": rows,
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"base {result['base'][:12]} vs {result['new_tree']}: {result['rounds']} rounds x "
        f"{result['steps']} paired steps ({result['seconds']} s); median [IQR] over steps",
        "| row | base | new | new/base (paired steps) | within 5% (new <= 1.05 x base) |",
        "|---|---|---|---|---|",
    ]
    for key, r in result["rows"].items():
        digits = 1 if key == "sampled" else 0
        cells = [fmt_spread(r["base"], digits), fmt_spread(r["new"], digits)]
        cells += [fmt_spread(r["ratio"], 3), "yes" if r["within_5pct"] else "no"]
        lines.append(f"| {ROWS[key]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", help="commit-ish of the previous code (e.g. HEAD, main~1)")
    parser.add_argument("--new", default=str(NEW_TREE), help="tree of the new code")
    parser.add_argument("--rounds", type=int, default=10, help="fresh interpreter pairs")
    parser.add_argument("--steps", type=int, default=6, help="paired steps per kind per round")
    parser.add_argument("--json", action="store_true", help="print the raw numbers as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child()
    elif not args.base:
        parser.error("--base is required")
    else:
        result = compare(args)
        print(json.dumps(result) if args.json else render(result))


if __name__ == "__main__":
    main()
