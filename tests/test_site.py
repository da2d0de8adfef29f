"""The BUILT docs site (``mkdocs build`` output), not the Markdown: what readers see.

* no raw table pipes in a rendered paragraph (a caption line directly above a table makes
  Markdown read the table as more lines of the caption: ``| a | b |`` as text);
* no code block wider than the content column at a 1400 px wide window (measured in a real
  headless Chromium: skipped with a reason where it is missing). The page's own script is
  added to a copy of each built page: it writes the blocks that scroll into the DOM, which
  ``--dump-dom`` returns.

The output comments of the executed snippets are checked by ``tests/test_docs.py``.
"""

from __future__ import annotations

import html
import html.parser
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 1400


class _Paragraphs(html.parser.HTMLParser):
    """The text of every ``<p>`` (code inside it left out)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self._depth = 0  # inside <p>
        self._code = 0  # inside <code>/<pre> within it

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "p":
            self._depth += 1
            self.found.append("")
        elif tag in ("code", "pre") and self._depth:
            self._code += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "p" and self._depth:
            self._depth -= 1
        elif tag in ("code", "pre") and self._code:
            self._code -= 1

    def handle_data(self, data: str) -> None:
        if self._depth and not self._code:
            self.found[-1] += data


_ROW = re.compile(r"^\s*\|.*\|\s*$", re.M)


def raw_table_rows(page: str) -> list[str]:
    """Lines of rendered paragraphs that are Markdown table rows left as text."""
    parser = _Paragraphs()
    parser.feed(page)
    return [row.strip() for text in parser.found for row in _ROW.findall(text)]


def test_raw_table_pipes_are_caught() -> None:
    """A caption line directly above a table renders as one paragraph: the check says so;
    with a blank line between them it is a table, and the check is quiet."""
    markdown = pytest.importorskip("markdown")
    broken = "caption of the table\n| case | ns |\n|---|---|\n| bare | 37 |\n"
    assert ["| case | ns |", "|---|---|", "| bare | 37 |"] == raw_table_rows(
        markdown.markdown(broken, extensions=["tables"])
    )
    fixed = broken.replace("table\n|", "table\n\n|")
    assert [] == raw_table_rows(markdown.markdown(fixed, extensions=["tables"]))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs, built by mkdocs (strict) into a temporary folder."""
    for module in ("mkdocs", "material", "mkdocstrings"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install 'profkit[dev]')")
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert (0, "", "") == (result.returncode, result.stdout, result.stderr)
    return out


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("index.html") if "assets" not in p.parts)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_built_pages_have_no_raw_table_pipes(site: Path) -> None:
    """Every table of every built page rendered as a table (none left as paragraph text)."""
    found = {
        p.relative_to(site).as_posix(): rows
        for p in _pages(site)
        if (rows := raw_table_rows(p.read_text(encoding="utf-8")))
    }
    assert {} == found


_MEASURE = """<script>
document.body.setAttribute("data-wide", JSON.stringify(
  [...document.querySelectorAll("pre > code")]
    .filter((c) => c.scrollWidth > c.clientWidth + 1)
    .map((c) => c.textContent.split("\\n").reduce((a, b) => (b.length > a.length ? b : a), ""))
));
</script></body>"""
_WIDE = re.compile(r'data-wide="([^"]*)"')


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_no_code_block_is_wider_than_the_column(site: Path) -> None:
    """At a 1400 px window, no code block of any page scrolls sideways (cut off)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    wide: dict[str, list[str]] = {}
    for page in _pages(site):
        measured = page.with_name("measured.html")
        measured.write_text(
            page.read_text(encoding="utf-8").replace("</body>", _MEASURE, 1), encoding="utf-8"
        )
        dom = subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                f"--window-size={WIDTH},1000",
                "--dump-dom",
                measured.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        found = _WIDE.search(dom.stdout)
        assert found is not None, f"{page}: not measured\n{dom.stderr[-2000:]}"
        lines = json.loads(html.unescape(found.group(1)))
        if lines:
            wide[page.parent.relative_to(site).as_posix() or "/"] = lines
    assert {} == wide


def test_scripts_test_builds_the_docs_without_the_banner() -> None:
    """``./scripts/test`` sets ``NO_MKDOCS_2_WARNING=1`` before its mkdocs build: without it,
    mkdocs-material 9.7+ prints an "end of life" banner on every build (the ``site`` fixture
    asserts that, with it, the build prints nothing)."""
    script = (ROOT / "scripts" / "test").read_text(encoding="utf-8")
    assert "export NO_MKDOCS_2_WARNING=1\n" in script
    assert script.index("export NO_MKDOCS_2_WARNING=1") < script.index("mkdocs build")
