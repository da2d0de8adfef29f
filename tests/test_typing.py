"""mypy sees through @profiled and region() (the original signatures are kept, ParamSpec) and
checks configure()'s keyword parameters (one per setting, typed)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent
CACHE = HERE.parent / ".mypy_cache"


@pytest.mark.timeout(300)
def test_decorators_keep_signatures_for_mypy() -> None:
    """reveal_type shows the wrapped signatures; a wrong argument type, a wrongly typed
    setting and a misspelt setting are errors."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            # the checkout's own incremental cache, which ./scripts/test's `mypy profkit` has
            # just filled with profkit and torch: ~2 s instead of ~20 s for torch's stubs
            "--cache-dir",
            str(CACHE),
            "--no-error-summary",
            str(HERE / "typing" / "api_usage.py"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=280,
    ).stdout
    lines = [line.split(": ", 1)[1] for line in out.splitlines() if ": " in line]
    assert [
        'note: Revealed type is "def (x: int, y: int =) -> int"',
        'note: Revealed type is "def (url: str) -> typing.Coroutine[Any, Any, bytes]"',
        'note: Revealed type is "def (n: int) -> typing.Iterator[int]"',
        'note: Revealed type is "def (flag: bool) -> str"',
        'error: Argument 1 to "add" has incompatible type "str"; expected "int"  [arg-type]',
        'error: Argument "sample_every" to "configure" has incompatible type "str"; '
        'expected "int | _Unset | None"  [arg-type]',
        'error: Argument "sampel_every" to "configure" has incompatible type "int"; '
        'expected "Never"  [arg-type]',
    ] == lines
