"""The BUILT docs site (``mkdocs build`` output), not the Markdown: what readers see.

* no raw table pipes in a rendered paragraph (a caption line directly above a table makes
  Markdown read the table as more lines of the caption: ``| a | b |`` as text);
* no code block wider than the content column at a 1400 px wide window (measured in a real
  headless Chromium: skipped with a reason where it is missing). The page's own script is
  added to a copy of each built page: it writes the blocks that scroll into the DOM, which
  ``--dump-dom`` returns;
* every SVG picture a built page shows renders whole: each of its texts lies inside its
  viewBox (Chromium's ``getBBox``; two plots were cut off at "2,256 req/" and "1-min load (").

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


_PICTURES = """<script>
document.body.setAttribute("data-clipped", JSON.stringify(
  Object.fromEntries([...document.querySelectorAll("svg[data-src]")].map((s) => {
    const v = s.viewBox.baseVal && s.viewBox.baseVal.width ? s.viewBox.baseVal
      : {x: 0, y: 0, width: s.width.baseVal.value, height: s.height.baseVal.value};
    const out = [...s.querySelectorAll("text")].map((t) => [t, t.getBBox()])
      .filter(([t, b]) => b.width > 0 && (b.x < v.x - 0.5 || b.y < v.y - 0.5
        || b.x + b.width > v.x + v.width + 0.5 || b.y + b.height > v.y + v.height + 0.5))
      .map(([t, b]) => t.textContent);
    return [s.dataset.src, out];
  }).filter(([src, out]) => out.length))
));
</script></body>"""
_CLIPPED = re.compile(r'data-clipped="([^"]*)"')
_IMG_SVG = re.compile(r'<img[^>]*\bsrc="([^"]+\.svg)"')


def clipped_svg_text(browser: str, pictures: dict[str, str], folder: Path) -> dict[str, list[str]]:
    """Per picture (name: SVG text), the texts Chromium lays out outside its viewBox. The
    SVGs are inlined in one page of their own (as an ``<img>`` shows them: no page CSS)."""
    body = "".join(
        re.sub(r"<svg\b", f'<svg data-src="{html.escape(name)}"', text, count=1)
        for name, text in pictures.items()
    )
    measured = folder / "pictures.html"
    measured.write_text(f"<!DOCTYPE html><html><body>{body}{_PICTURES}</html>", encoding="utf-8")
    dom = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1400,1000",
            "--dump-dom",
            measured.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    found = _CLIPPED.search(dom.stdout)
    assert found is not None, f"not measured\n{dom.stderr[-2000:]}"
    return dict(json.loads(html.unescape(found.group(1))))


@pytest.mark.timeout(120)
def test_the_picture_check_catches_text_past_the_viewbox(tmp_path: Path) -> None:
    """The check itself: a title longer than its SVG is reported, a short one is not."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 200 30">'
        '<text x="8" y="18">{}</text></svg>'
    )
    pictures = {
        "cut.svg": svg.format("End to end: requests per second"),
        "ok.svg": svg.format("ok"),
    }
    assert {"cut.svg": ["End to end: requests per second"]} == clipped_svg_text(
        browser, pictures, tmp_path
    )


@pytest.mark.timeout(120)
def test_benchmark_plots_with_long_texts_render_whole(tmp_path: Path) -> None:
    """bench/plots.py lays out long titles, row names, value labels, notes and legends
    inside the viewBox (a title is wrapped, a plot with long names is made wider), as
    Chromium renders them; the plots of the docs are checked in the built site below."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    sys.path.insert(0, str(ROOT / "bench"))
    from plots import WIDTH, bars, stacked

    long = (
        "One sampled call on the request path, by part (ms, medians; 2 cores, 1-min load (0.6-0.7) "
    )
    names = ["W" * 40, "installed, never sampling (off-sample path only), " * 2, "1-in-1"]
    rows = [(n, 2256.0 * (i + 1), 2000.0, 2500.0 * (i + 1)) for i, n in enumerate(names)]
    pictures = {
        "bars.svg": bars(long * 2, rows, "requests per second", "note " * 60),
        "stacked.svg": stacked(
            long, [(n, [1.5, 0.2, 9999.0]) for n in names], ["MMMM " * 20, "part", "x"], "ms"
        ),
        "short.svg": bars("t", [("a", 1.0, 0.5, 1.5)], "ns"),
    }
    assert {} == clipped_svg_text(browser, pictures, tmp_path)
    assert f'width="{WIDTH}"' in pictures["short.svg"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_built_pages_svg_pictures_render_whole(site: Path) -> None:
    """Every SVG picture of every built page (the benchmark plots of docs/performance.md
    among them) has all its text inside its viewBox, as Chromium lays it out."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    pictures: dict[str, str] = {}
    for page in _pages(site):
        for src in _IMG_SVG.findall(page.read_text(encoding="utf-8")):
            path = (page.parent / html.unescape(src)).resolve()
            pictures[path.relative_to(site).as_posix()] = path.read_text(encoding="utf-8")
    assert {"images/bench/throughput.svg", "images/bench/window_cost.svg"} <= set(pictures)
    assert {} == clipped_svg_text(browser, pictures, site)


def test_scripts_test_builds_the_docs_without_the_banner() -> None:
    """``./scripts/test`` sets ``NO_MKDOCS_2_WARNING=1`` before its mkdocs build: without it,
    mkdocs-material 9.7+ prints an "end of life" banner on every build (the ``site`` fixture
    asserts that, with it, the build prints nothing)."""
    script = (ROOT / "scripts" / "test").read_text(encoding="utf-8")
    assert "export NO_MKDOCS_2_WARNING=1\n" in script
    assert script.index("export NO_MKDOCS_2_WARNING=1") < script.index("mkdocs build")
