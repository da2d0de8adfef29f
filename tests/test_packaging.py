"""Packaging: the license, the files pyproject.toml cites, and the extras each command needs."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
PROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]


def names(extra: str) -> set[str]:
    """The distribution names an extra installs, self-references (profkit[a,b]) expanded."""
    out: set[str] = set()
    for requirement in EXTRAS[extra]:
        name = re.split(r"[\[<>=~! ;]", requirement, maxsplit=1)[0].lower()
        if name == "profkit":
            for inner in re.findall(r"\[(.*)\]", requirement)[0].split(","):
                out |= names(inner.strip())
        else:
            out.add(name)
    return out


def test_license_file_is_the_apache_license() -> None:
    """pyproject says Apache-2.0 and LICENSE holds that license's full text."""
    text = (ROOT / "LICENSE").read_text("utf-8")
    expected = ("Apache-2.0", "Apache License", "Version 2.0, January 2004", True)
    actual = (
        PROJECT["license"],
        text.split("\n")[0].strip(),
        text.split("\n")[1].strip(),
        "END OF TERMS AND CONDITIONS" in text,
    )
    assert expected == actual


def test_every_file_pyproject_cites_exists() -> None:
    """Each file name in pyproject.toml (readme, comments) is a file of the repository."""
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    cited = set(re.findall(r"[\w./-]+\.(?:md|py|txt|toml|cfg|yml|yaml)\b", text))
    assert sorted(cited) == sorted(c for c in cited if (ROOT / c).is_file())


def test_otlp_extras_split_by_protocol() -> None:
    """otlp-grpc and otlp-http install one exporter each; otlp installs both."""
    grpc, http = "opentelemetry-exporter-otlp-proto-grpc", "opentelemetry-exporter-otlp-proto-http"
    expected = ({grpc}, {http}, {grpc, http})
    assert expected == (names("otlp-grpc"), names("otlp-http"), names("otlp"))


def test_demo_extra_is_only_what_the_demo_needs() -> None:
    """The demo extra: the web stack, OTel's FastAPI instrumentation, numpy; no dev tools."""
    expected = {"fastapi", "uvicorn", "httpx", "opentelemetry-instrumentation-fastapi", "numpy"}
    assert expected == names("demo")


#: extras too large for every developer's ``.[dev]``, each installed by a script of its own
#: that ./scripts/test runs in CI (their tests skip with a reason without them)
APART = {"ray": "scripts/setup-ray"}


def test_dev_extra_covers_every_other_extra() -> None:
    """``.[dev]`` (the test command's) installs everything the other extras do, but those
    set up apart."""
    others = set().union(*(names(e) for e in EXTRAS if e != "dev" and e not in APART))
    assert set() == others - names("dev")
    assert set() == set(APART) - set(EXTRAS)


@pytest.mark.parametrize(("extra", "script"), sorted(APART.items()))
def test_an_extra_set_up_apart_is_installed_by_its_script_in_ci(extra: str, script: str) -> None:
    """Its script installs the extra into .venv; ./scripts/test runs the script in CI."""
    assert f'-e ".[{extra}]"' in (ROOT / script).read_text("utf-8")
    test_lines = [line.strip() for line in (ROOT / "scripts/test").read_text("utf-8").splitlines()]
    assert any(line.startswith(f"./{script}") for line in test_lines)


@pytest.mark.parametrize(("script", "extra"), [("scripts/demo", "demo"), ("scripts/test", "dev")])
def test_each_command_sets_up_its_own_extra(script: str, extra: str) -> None:
    """./scripts/demo installs the demo extra only; ./scripts/test the dev extras."""
    assert f"./scripts/setup {extra}" in (ROOT / script).read_text("utf-8").splitlines()


def test_the_ray_serve_integration_without_ray_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Imported where Ray is not installed, it raises an ImportError naming the extra."""
    for name in ("ray", "ray.serve"):
        monkeypatch.setitem(sys.modules, name, None)  # what an absent package imports as
    monkeypatch.delitem(sys.modules, "profkit.integrations.ray_serve", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'profkit\[ray\]'"):
        importlib.import_module("profkit.integrations.ray_serve")
