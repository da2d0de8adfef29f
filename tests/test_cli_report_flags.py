"""``python -m profkit report``: every flag is used or refused, never silently ignored."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from profkit import __main__ as cli


def _lines(path: Path, calls: int, label: str = "predict") -> str:
    """``calls`` json exporter lines of ``label`` in ``path``; the path as a string."""
    event = {"event": "profkit.profile", "label": label, "duration_us": 1000.0}
    rows = [{"op": f"aten::op{i}", "self_cpu_us": 50.0 - i} for i in range(8)]
    path.write_text((json.dumps({**event, "top_ops": rows}) + "\n") * calls, encoding="utf-8")
    return str(path)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What ``argv`` says on stderr, refused by argparse (exit status 2)."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert 2 == exited.value.code
    return capsys.readouterr().err


def test_baseline_without_html_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--baseline`` only means something on the page: the text report refuses it (and
    points at ``diff``) instead of printing FILE's rollup alone with exit status 0."""
    after, before = _lines(tmp_path / "a.jsonl", 3), _lines(tmp_path / "b.jsonl", 3)
    err = _refused(["report", after, "--baseline", before], capsys)
    assert "--baseline needs --html" in err
    assert "python -m profkit diff" in err
    assert "--json" in _refused(
        ["report", "--html", str(tmp_path / "o.html"), after, "--json"], capsys
    )


def test_baseline_takes_one_path_and_can_be_repeated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--baseline OTHER`` takes one path (or quoted glob): a FILE after it is read as FILE,
    not as one more baseline; ``--baseline`` again adds another."""
    one, two = _lines(tmp_path / "one.jsonl", 3), _lines(tmp_path / "two.jsonl", 5)
    out = tmp_path / "o.html"
    assert 0 == cli.main(["report", "--html", str(out), "--baseline", one, two])
    text = out.read_text(encoding="utf-8")
    assert ["5"] == re.findall(r"<p class=meta>(\d+) samples", text)
    assert ["3"] == re.findall(r"baseline: (\d+) samples", text)
    assert 0 == cli.main(["report", "--html", str(out), two, "--baseline", one, "--baseline", two])
    assert ["8"] == re.findall(r"baseline: (\d+) samples", out.read_text(encoding="utf-8"))
    capsys.readouterr()
    assert "FILE" in _refused(["report", "--html", str(out), "--baseline", one], capsys)


def test_top_still_sets_the_text_reports_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The text report: 5 op rows a label, ``--top`` rows with it."""
    src = _lines(tmp_path / "a.jsonl", 2)
    for argv, rows in (([], 5), (["--top", "3"], 3)):
        assert 0 == cli.main(["report", src, *argv])
        assert rows == capsys.readouterr().out.count("aten::op")


def test_files_on_both_sides_of_an_option_are_all_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """FILEs before and after an option (``after.jsonl --baseline before.jsonl more.jsonl``,
    ``a.jsonl --top 3 b.jsonl``) are all FILEs, as the docs say, not "unrecognized
    arguments" (exit status 2, no page); an unknown option is still refused."""
    one, two = _lines(tmp_path / "one.jsonl", 3), _lines(tmp_path / "two.jsonl", 5)
    base = _lines(tmp_path / "base.jsonl", 2)
    out = tmp_path / "o.html"
    assert 0 == cli.main(["report", "--html", str(out), one, "--baseline", base, two])
    text = out.read_text(encoding="utf-8")
    assert (["8"], ["2"]) == (
        re.findall(r"<p class=meta>(\d+) samples", text),
        re.findall(r"baseline: (\d+) samples", text),
    )
    capsys.readouterr()
    assert 0 == cli.main(["report", one, "--top", "3", two])
    assert "predict  8 samples" in capsys.readouterr().out
    assert "--bogus" in _refused(["report", one, "--bogus", two], capsys)
