"""``python -m profkit``: the demo, the rollup report, the version.

* ``python -m profkit demo``: a small model served over HTTP on 127.0.0.1, driven by its own
  client, 1 request in N profiled, each sampled call printed on stdout (:mod:`profkit._demo`).
* ``python -m profkit report FILE...``: per label, a rollup of the JSON lines profkit wrote
  (samples, duration p50/p95, verdict counts, top ops by median self time) (:mod:`profkit._report`);
  ``--html OUT.html`` writes it as one self-contained page, with a waterfall per sample
  (:mod:`profkit._html`); ``--baseline OTHER`` (only with ``--html``) shows other samples
  beside them.
* ``python -m profkit diff BEFORE AFTER``: per label, each op's and region's per-call time
  before and after, the ratio and whether the change is significant (:mod:`profkit._diff`).
* ``python -m profkit --version``.

Nothing heavy is imported before a command is chosen.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ._version import __version__


def build_parser() -> argparse.ArgumentParser:
    """The command line: ``demo``, ``report`` and ``diff`` sub-commands, ``--version``."""
    from . import _demo, _diff, _html, _report

    parser = argparse.ArgumentParser(
        prog="profkit", description="profkit's demo, report and diff tools."
    )
    parser.add_argument("--version", action="version", version=f"profkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="serve a small model over HTTP, profile 1 request in N, print the summaries",
        description=_demo.DESCRIPTION,
    )
    _demo.add_arguments(demo)
    report = sub.add_parser(
        "report",
        help="roll up profkit's JSON lines per label",
        description=_report.DESCRIPTION,
    )
    _report.add_arguments(report)
    _html.add_arguments(report)
    report.set_defaults(refuse=report.error)  # options that do not go together (main)
    changes = sub.add_parser(
        "diff",
        help="what changed between two sets of profkit JSON lines, per label",
        description=_diff.DESCRIPTION,
    )
    _diff.add_arguments(changes)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen command; its exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # argparse reads FILE... only up to the first option: the report's FILEs after one
        # (``after.jsonl --baseline before.jsonl more.jsonl``) are FILEs too
        if args.command == "report" and not any(a.startswith("-") and a != "-" for a in extra):
            args.files.extend(extra)
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")  # exits 2
    if args.command == "report":
        from . import _html

        problem = _html.refused(args)
        if problem is not None:
            args.refuse(problem)  # exits 2, the report's usage and the problem on stderr
        if args.html:
            return _html.run(args)
        from . import _report

        return _report.run(args)
    if args.command == "diff":
        from . import _diff

        return _diff.run(args)
    from . import _demo

    return _demo.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
