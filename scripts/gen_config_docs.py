"""Rewrite the settings table in docs/configuration.md from profkit's settings table.

Run after changing a setting: ``python scripts/gen_config_docs.py``. The table comes from
``profkit._config.markdown_table()`` (each ``Config`` field: its type, default, rule and
docstring); tests/test_config_table.py fails while the page and the table disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's profkit, not an installed one

from profkit._config import markdown_table  # noqa: E402 (after the path it comes from)

CONFIG_MD = ROOT / "docs" / "configuration.md"
TABLE_START = "<!-- config-table:start (generated: python scripts/gen_config_docs.py) -->"
TABLE_END = "<!-- config-table:end -->"


def rewrite(text: str) -> str:
    """``text`` with everything between the table markers replaced by the generated table."""
    head, rest = text.split(TABLE_START, 1)
    tail = rest.split(TABLE_END, 1)[1]
    return f"{head}{TABLE_START}\n{markdown_table()}\n{TABLE_END}{tail}"


if __name__ == "__main__":
    CONFIG_MD.write_text(rewrite(CONFIG_MD.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"rewrote the settings table in {CONFIG_MD.relative_to(ROOT)}")
