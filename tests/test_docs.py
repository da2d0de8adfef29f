"""The docs are checked: code blocks run, mkdocs builds (the settings table: test_config_table).

Fences: every block fenced ```` ```python ```` in ``docs/`` must run as it is (each in a fresh
namespace, in a temporary working directory, the global session reset after). A complete
program shown as a file is fenced ```` ```python title="main.py" ```` and run as that file by
a test of its own (``FILE_BLOCKS`` says which). Python that cannot run alone is fenced
```` ```py title="Fragment: ..." ````, so that readers see it is a fragment; it must still
parse. Other fences: ```` ```bash ```` for commands, ```` ```text ```` for output,
```` ```yaml ```` for configuration files.

Output comments: in a block that runs, a comment after a top-level ``print(...)`` says what
it prints (``print(a, b)  # 1 1``; ``# -> 1 1`` is the same) and is checked, line by line, in
order, against what the block printed; prose goes on a line of its own.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from profkit.testing import reset

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

_FENCE = re.compile(
    r"^(?P<indent>[ ]*)```(?P<info>[^`\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)
_TITLE = re.compile(r'^(?P<lang>\w+) title="(?P<title>[^"]+)"$')
PLAIN_FENCES = {"python", "bash", "text", "yaml"}
FILE_BLOCKS = {("getting-started.md", "main.py"): "tests/test_getting_started.py"}
"""Complete files shown in the docs, and the test that runs each one."""


# -- code blocks ----------------------------------------------------------------------------


def fenced_blocks() -> list[tuple[str, int, str, str]]:
    """(page, line, info string, code) for every fenced block under docs/, admonitions too."""
    blocks = []
    for path in sorted(DOCS.rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 2
            code = textwrap.dedent(match.group("body"))
            info = match.group("info").strip()
            blocks.append((path.relative_to(DOCS).as_posix(), line, info, code))
    return blocks


def python_blocks() -> list[tuple[str, int, str]]:
    """(page, line, code) for every ```python block to run in-process (no title)."""
    return [(page, line, code) for page, line, info, code in fenced_blocks() if info == "python"]


def file_block(page: str, title: str) -> str:
    """The code of the ```python title="..." block on ``page`` (a complete file)."""
    wanted = f'python title="{title}"'
    (code,) = [c for p, _, info, c in fenced_blocks() if p == page and info == wanted]
    return code


_BLOCKS = python_blocks()


def test_docs_have_python_blocks() -> None:
    """The block finder finds the runnable examples (the pages that must have some do)."""
    pages = {page for page, _, _ in _BLOCKS}
    assert {"index.md", "getting-started.md", "concepts.md"} <= pages


def test_every_fence_is_run_or_marked() -> None:
    """Each block is run (python), a file a test runs, a titled fragment, or not Python."""
    odd = []
    for page, line, info, code in fenced_blocks():
        titled = _TITLE.match(info)
        if info in PLAIN_FENCES:
            continue
        if titled and titled["lang"] == "python" and (page, titled["title"]) in FILE_BLOCKS:
            continue
        if titled and titled["lang"] == "py" and titled["title"].startswith("Fragment"):
            ast.parse(code, f"docs/{page}:{line}")  # a fragment still parses
            continue
        odd.append(f"docs/{page}:{line} {info!r}")
    assert [] == odd


def test_file_blocks_are_run_by_their_tests() -> None:
    """Every complete file in the docs names a test module that exists and reads it."""
    for (page, title), test in FILE_BLOCKS.items():
        assert file_block(page, title)
        assert f'file_block("{page}", "{title}")' in (ROOT / test).read_text(encoding="utf-8")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("page", "line", "code"), _BLOCKS, ids=[f"{page}:{line}" for page, line, _ in _BLOCKS]
)
def test_python_block_runs(
    page: str,
    line: int,
    code: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A ```python block in the docs runs without error (asserts in it included) and prints
    what its output comments say. It runs with profkit's defaults, as a reader's does: not
    with the suite's ``PROFKIT_COLD_CALLS=0`` (tests/conftest.py)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PROFKIT_COLD_CALLS", raising=False)
    namespace = {"__name__": "__docs__"}
    try:
        exec(compile(code, f"docs/{page}:{line}", "exec"), namespace)
    finally:
        reset()
    printed = capsys.readouterr().out.splitlines()
    assert [] == unmet_output_comments(output_comments(code), printed)


def output_comments(code: str) -> list[tuple[int, str]]:
    """(line, text) of each comment after a top-level ``print(...)`` statement in ``code``."""
    lines = code.splitlines()
    found = []
    for node in ast.parse(code).body:
        call = node.value if isinstance(node, ast.Expr) else None
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "print"):
            continue
        tail = lines[node.end_lineno - 1][node.end_col_offset :]  # type: ignore[operator]
        comment = tail.strip()
        if comment.startswith("#"):
            text = comment[1:].strip()
            found.append((node.lineno, text[3:] if text.startswith("-> ") else text))
    return found


def unmet_output_comments(expected: list[tuple[int, str]], printed: list[str]) -> list[str]:
    """The output comments not matched, in order, by a printed line (each line used once)."""
    unmet, at = [], 0
    for line, text in expected:
        rest = [i for i in range(at, len(printed)) if printed[i].strip() == text]
        if rest:
            at = rest[0] + 1
        else:
            unmet.append(f"line {line}: expected {text!r}, printed {printed[at:]!r}")
    return unmet


def test_output_comments_are_checked() -> None:
    """A wrong output comment is caught; prose on its own line and ``# ->`` are understood."""
    code = "x = 1\n# prose\nprint(x, x)  # 1 1\nprint(2)  # -> 2\nprint(3)  # 4\n"
    expected = output_comments(code)
    assert [(3, "1 1"), (4, "2"), (5, "4")] == expected
    assert ["line 5: expected '4', printed ['3']"] == unmet_output_comments(
        expected, ["1 1", "2", "3"]
    )


def test_docs_name_no_private_module() -> None:
    """No page (nor the README) points readers at ``profkit._private`` code."""
    pages = [*sorted(DOCS.rglob("*.md")), ROOT / "README.md"]
    private = re.compile(r"\bprofkit\._\w+")
    hits = [f"{p.name}: {m}" for p in pages for m in private.findall(p.read_text("utf-8"))]
    assert [] == hits


# -- the site -------------------------------------------------------------------------------


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in _nav_pages(value)]
    if isinstance(nav, list):
        return [p for item in nav for p in _nav_pages(item)]
    return []


def test_every_page_is_in_the_nav() -> None:
    """Each markdown page under docs/ is reachable from the mkdocs nav, and nothing else is."""
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(_nav_pages(config["nav"])) == pages


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """``mkdocs build --strict`` passes: no broken link, no missing page, API docs render."""
    for module in ("mkdocs", "material", "mkdocstrings"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install 'profkit[dev]')")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "api" / "index.html").is_file()
