"""The settings are declared once: Config's fields, configure()'s keywords, the PROFKIT_*
variables and the Configuration page's table all follow the one table in profkit._config.

Each ``Config`` field carries a ``Setting`` (its rule, its variable's parser, what
``configure()`` accepts). ``configure()`` keeps explicit typed keywords, which Python typing
cannot derive: these tests check that they agree with the table, name for name.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from pathlib import Path
from typing import Any

import pytest

import profkit
from profkit import _config
from profkit._config import ENV_VARS, build_config, setting
from profkit._global import UNSET
from profkit._settings import Setting

ROOT = Path(__file__).resolve().parents[2]
CONFIG_MD = ROOT / "docs" / "configuration.md"
TABLE_START = "<!-- config-table:start (generated: python scripts/gen_config_docs.py) -->"
TABLE_END = "<!-- config-table:end -->"
OBJECTS = {"tracer_provider", "meter_provider", "logger", "extra_exporters"}
FIELDS = dataclasses.fields(profkit.Config)

#: values to try for every setting: each one its rule accepts must survive the environment
CANDIDATES: tuple[Any, ...] = (
    *(True, False, None, 0, 1, 2, 7, 100, 10_000, 2**31 - 1),
    *(0.0, 0.01, 0.5, 1.0, 1.5, 20.0, 3600, 3600.0, 1e-3, 1e-9),
    *("SIGUSR1", "SIGUSR2", "SIGRTMIN+3", "auto", "cpu", "cuda", "cpu,cuda", "/var/tmp/profkit"),
    *((), ("log",), ("otel", "log", "console", "json")),
)


def env_text(value: Any) -> str:
    """How a deployment writes ``value`` in a PROFKIT_* variable."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value) or "none"  # (an empty value is refused: a mistake)
    return repr(value) if isinstance(value, float) else str(value)


def test_every_field_has_a_setting() -> None:
    """Each Config field's metadata holds its Setting: a rule in words and a check."""
    specs = [f.metadata.get("profkit") for f in FIELDS]
    assert all(isinstance(spec, Setting) and spec.rule for spec in specs)
    assert [setting(f.name) for f in FIELDS] == specs


def test_every_default_meets_its_rule() -> None:
    """The defaults are acceptable values (Config() is what configure() gives by default)."""
    refused = [f.name for f in FIELDS if not setting(f.name).check(f.default)]
    assert [] == refused
    assert profkit.Config() == build_config({}, environ={})


def test_configure_keywords_are_the_table() -> None:
    """configure()'s keyword-only parameters: the fields, in order, default UNSET, typed as
    the table says (the field's type, or what the setting accepts), with ``| _Unset``."""
    params = list(inspect.signature(profkit.configure).parameters.values())
    *keywords, rest = params
    assert inspect.Parameter.VAR_KEYWORD is rest.kind  # the unknown ones, typed NoReturn
    assert [f.name for f in FIELDS] == [p.name for p in keywords]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in keywords)
    assert all(p.default is UNSET for p in keywords)
    expected = {f.name: setting(f.name).accepts or f.type for f in FIELDS}
    annotated = {p.name: str(p.annotation).replace(" | _Unset", "") for p in keywords}
    assert expected == annotated


def test_env_vars_are_the_value_settings() -> None:
    """Each setting but the objects has PROFKIT_<NAME>, parsed by its Setting."""
    values = {f.name for f in FIELDS} - OBJECTS
    assert {name: f"PROFKIT_{name.upper()}" for name in values} == dict(ENV_VARS)
    assert all(setting(name).parse is None for name in OBJECTS)


@pytest.mark.parametrize("name", list(ENV_VARS))
def test_env_round_trip(name: str) -> None:
    """The default and every candidate the rule accepts, written as a variable, parse back."""
    spec = setting(name)
    default = next(f.default for f in FIELDS if f.name == name)
    accepted = [v for v in (default, *CANDIDATES) if spec.check(v)]
    assert len(accepted) >= 2, "too few candidates to show a round trip"
    for value in accepted:
        config = build_config({}, environ={ENV_VARS[name]: env_text(value)})
        assert value == getattr(config, name), env_text(value)


@pytest.mark.parametrize("name", [f.name for f in FIELDS])
def test_refusal_says_the_rule(name: str) -> None:
    """A value no rule accepts (NaN) raises 'profkit setting NAME: must be RULE, got nan'."""
    expected = f"profkit setting {name!r}: must be {setting(name).rule}, got nan"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        build_config({name: math.nan}, environ={})


# -- the Configuration page -----------------------------------------------------------------


def documented_table() -> str:
    """The text between the table markers in docs/configuration.md."""
    text = CONFIG_MD.read_text(encoding="utf-8")
    start = text.index(TABLE_START) + len(TABLE_START)
    return text[start : text.index(TABLE_END)].strip()


def test_docs_carry_the_generated_table() -> None:
    """docs/configuration.md holds exactly the table the settings give: regenerate it."""
    assert _config.markdown_table() == documented_table(), "run: python scripts/gen_config_docs.py"


def test_table_has_a_row_per_field_with_its_rule_and_docstring() -> None:
    """One row per field, in order, each with its env var (or —), rule and docstring."""
    rows = documented_table().splitlines()[2:]
    docs = _config.field_docs()
    assert len(FIELDS) == len(rows)
    for f, row in zip(FIELDS, rows, strict=True):
        env = f"`{ENV_VARS[f.name]}`" if f.name in ENV_VARS else "—"
        assert row.startswith(f"| `{f.name}` | {env} | `{f.type}` | `{f.default!r}` | ")
        assert docs[f.name]
        assert _config._markdown(setting(f.name).rule) in row


def test_every_field_has_a_docstring() -> None:
    """Every field has the docstring under it (IDEs, mkdocstrings and the table read it)."""
    assert [f.name for f in FIELDS] == list(_config.field_docs())
