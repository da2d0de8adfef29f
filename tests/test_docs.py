"""The docs are checked: the settings table matches ``Config``, code blocks run, mkdocs builds.

Fences: every block fenced ```` ```python ```` in ``docs/`` must run as it is (each in a fresh
namespace, in a temporary working directory, the global session reset after). A complete
program shown as a file is fenced ```` ```python title="main.py" ```` and run as that file by
a test of its own (``FILE_BLOCKS`` says which). Python that cannot run alone is fenced
```` ```py title="Fragment: ..." ````, so that readers see it is a fragment; it must still
parse. Other fences: ```` ```bash ```` for commands, ```` ```text ```` for output,
```` ```yaml ```` for configuration files.

The configuration table is generated from ``profkit.Config`` (field types, defaults and the
docstring under each field) and ``profkit._config.ENV_VARS``; rewrite it after changing a
setting with ``python tests/test_docs.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import itertools
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import profkit
from profkit import _config
from profkit.testing import reset

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CONFIG_MD = DOCS / "configuration.md"
TABLE_START = "<!-- config-table:start (generated: python tests/test_docs.py) -->"
TABLE_END = "<!-- config-table:end -->"
HEADER = ("Setting", "Environment variable", "Type", "Default", "Description")
NO_ENV = "—"

_FENCE = re.compile(
    r"^(?P<indent>[ ]*)```(?P<info>[^`\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)
_TITLE = re.compile(r'^(?P<lang>\w+) title="(?P<title>[^"]+)"$')
PLAIN_FENCES = {"python", "bash", "text", "yaml"}
FILE_BLOCKS = {("getting-started.md", "main.py"): "tests/test_getting_started.py"}
"""Complete files shown in the docs, and the test that runs each one."""


# -- the configuration table ----------------------------------------------------------------


def field_docs() -> dict[str, str]:
    """The docstring under each ``Config`` field, read from the source (one line each)."""
    tree = ast.parse(inspect.getsource(_config))
    config = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Config")
    docs: dict[str, str] = {}
    body = config.body
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _markdown(doc: str) -> str:
    """A docstring line as markdown: ``x`` -> `x`, :class:`x` -> `x`, pipes escaped."""
    doc = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", doc)
    doc = doc.replace("``", "`")
    return _escape_pipes(doc)


def _escape_pipes(text: str) -> str:
    """Escape ``|`` outside code spans (inside them Python-Markdown does not split cells)."""
    parts = text.split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def config_rows() -> list[tuple[str, ...]]:
    """One row per ``Config`` field, in declaration order."""
    docs = field_docs()
    rows = []
    for f in dataclasses.fields(profkit.Config):
        env = _config.ENV_VARS.get(f.name)
        rows.append(
            (
                f"`{f.name}`",
                f"`{env}`" if env else NO_ENV,
                f"`{f.type}`",
                f"`{f.default!r}`",
                _markdown(docs.get(f.name, "")),
            )
        )
    return rows


def render_config_table() -> str:
    """The markdown table that docs/configuration.md carries between its markers."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in config_rows()]
    return "\n".join(lines)


def split_row(line: str) -> tuple[str, ...]:
    """Cells of one markdown table row; ``|`` inside backticks or escaped does not split."""
    cells, cell, in_code, i = [], "", False, 0
    body = line.strip()[1:-1] if line.strip().endswith("|") else line.strip()[1:]
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body) and body[i + 1] == "|" and not in_code:
            cell += "\\|"
            i += 2
            continue
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
        i += 1
    cells.append(cell.strip())
    return tuple(cells)


def documented_table() -> str:
    """The text between the table markers in docs/configuration.md."""
    text = CONFIG_MD.read_text(encoding="utf-8")
    start = text.index(TABLE_START) + len(TABLE_START)
    return text[start : text.index(TABLE_END)].strip()


def documented_rows() -> list[tuple[str, ...]]:
    """The data rows of the documented table (header and rule left out)."""
    lines = [ln for ln in documented_table().splitlines() if ln.strip().startswith("|")]
    assert split_row(lines[0]) == HEADER, "the table's header changed"
    return [split_row(ln) for ln in lines[2:]]


def _code(cell: str) -> str:
    return cell.strip("`")


def test_configuration_lists_every_setting() -> None:
    """docs/configuration.md lists exactly the fields of profkit.Config, in order."""
    expected = [f.name for f in dataclasses.fields(profkit.Config)]
    assert expected == [_code(row[0]) for row in documented_rows()]


def test_configuration_lists_every_env_var() -> None:
    """Each documented setting names its PROFKIT_* variable, or none when it has none."""
    expected = {
        f.name: _config.ENV_VARS.get(f.name, "") for f in dataclasses.fields(profkit.Config)
    }
    documented = {
        _code(row[0]): "" if row[1] == NO_ENV else _code(row[1]) for row in documented_rows()
    }
    assert expected == documented


def test_configuration_types_defaults_and_descriptions() -> None:
    """The table's types, defaults and descriptions are those of the source: regenerate it."""
    assert render_config_table() == documented_table(), "run: python tests/test_docs.py"


def test_every_setting_is_documented_in_the_source() -> None:
    """Every Config field has a docstring, which is where the table's description comes from."""
    fields = [f.name for f in dataclasses.fields(profkit.Config)]
    assert fields == [name for name in fields if field_docs().get(name)]


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
    page: str, line: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ```python block in the docs runs without error (asserts in it included)."""
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    try:
        exec(compile(code, f"docs/{page}:{line}", "exec"), namespace)
    finally:
        reset()


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


if __name__ == "__main__":
    text = CONFIG_MD.read_text(encoding="utf-8")
    head, rest = text.split(TABLE_START, 1)
    tail = rest.split(TABLE_END, 1)[1]
    CONFIG_MD.write_text(
        f"{head}{TABLE_START}\n{render_config_table()}\n{TABLE_END}{tail}", encoding="utf-8"
    )
    print(f"rewrote the settings table in {CONFIG_MD.relative_to(ROOT)}")
