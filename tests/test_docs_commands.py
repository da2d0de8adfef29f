"""Every shell block in the docs that runs the ``profkit`` command runs as written.

A reader follows a page in one terminal, from a checkout that the README's ``./scripts/demo``
(or ``./scripts/test``) set up: so a page's ```` ```bash ```` blocks that name ``profkit``
run in order, in one ``bash`` process, in a scratch directory that sees the checkout's
``.venv`` and ``scripts/``, with nothing of profkit's on ``PATH`` until a block activates
the environment itself. Input files a page takes from the reader's own service
(``before.jsonl``, ``after.jsonl``) are made from the demo first, unless the page makes them.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.test_docs import fenced_blocks

ROOT = Path(__file__).resolve().parents[1]
_COMMAND = re.compile(r"^\s*(?:profkit|python -m profkit)\s", re.M)
_FENCE = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)
SEEDED = ("before.jsonl", "after.jsonl")


def command_blocks() -> dict[str, list[str]]:
    """Page -> its bash blocks that run ``profkit``, in page order (the README too)."""
    pages: dict[str, list[str]] = {}
    for page, _line, info, code in fenced_blocks():
        if info == "bash" and _COMMAND.search(code):
            pages.setdefault(f"docs/{page}", []).append(code)
    readme = [
        b for b in _FENCE.findall((ROOT / "README.md").read_text("utf-8")) if _COMMAND.search(b)
    ]
    if readme:
        pages["README.md"] = readme
    return pages


PAGES = command_blocks()


def _param(page: str) -> object:
    # ./scripts/demo serves 300 requests over HTTP
    slow = any(re.search(r"^\./scripts/demo", block, re.M) for block in PAGES[page])
    return pytest.param(page, marks=[pytest.mark.slow] if slow else [], id=page)


def test_the_docs_show_the_profkit_command() -> None:
    """The pages that tell readers to run ``profkit report``/``diff`` are found."""
    assert {"README.md", "docs/getting-started.md", "docs/reading-output.md"} <= set(PAGES)
    assert "docs/fleet.md" in PAGES


def _scratch(tmp_path: Path, script: str) -> dict[str, str]:
    """The checkout's environment and scripts beside the page's files; a PATH without it."""
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    venv_bin = str(ROOT / ".venv" / "bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROFKIT_", "VIRTUAL_ENV"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env.pop("PYTHONPATH", None)
    missing = [n for n in SEEDED if n in script and not re.search(rf">\s*{re.escape(n)}", script)]
    if missing:  # one demo run stands for the reader's own samples
        demo = [str(ROOT / ".venv/bin/profkit"), "demo", "--no-server", "--json", "--calls", "100"]
        sample = subprocess.run(
            [*demo, "--every", "10"],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
            env=env,
        )
        for name in missing:
            (tmp_path / name).write_text(sample.stdout, encoding="utf-8")
    return env


@pytest.mark.slow
@pytest.mark.parametrize("page", [_param(p) for p in sorted(PAGES)])
def test_a_pages_commands_run_as_written(page: str, tmp_path: Path) -> None:
    """The page's ``profkit`` blocks, one after another in one shell, exit 0."""
    script = "\n".join(PAGES[page])
    env = _scratch(tmp_path, script)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert 0 == done.returncode, f"{page}:\n{script}\n--- stderr:\n{done.stderr[-3000:]}"
    for html in re.findall(r"--html (\S+\.html)", script):
        assert (tmp_path / html).stat().st_size > 1000, html
