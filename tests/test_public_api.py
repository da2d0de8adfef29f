"""The public surface: __all__ is sorted and complete, and the contract names exist."""

from __future__ import annotations

import pytest

import profkit
from profkit.testing import CaptureExporter


def test_all_is_sorted() -> None:
    """__all__ is sorted (dunder first, then case-sensitive order)."""
    assert sorted(profkit.__all__) == profkit.__all__


def test_all_is_complete() -> None:
    """Every public attribute of the package is in __all__ and resolves."""
    public = {
        name
        for name in dir(profkit)
        if not name.startswith("_") and not isinstance(getattr(profkit, name), type(profkit))
    }
    assert public | {"__version__"} == set(profkit.__all__)


def test_contract_names() -> None:
    """The names fixed by the design brief are exported."""
    for name in ("configure", "profiled", "region", "trigger", "stats", "force_flush", "shutdown"):
        assert callable(getattr(profkit, name))


def test_stats_before_configure_is_all_zero() -> None:
    """stats() works before configure() and reports nothing."""
    s = profkit.stats()
    assert (0, 0, 0) == (s["root_calls"], s["sampled"], s["errors"])
    assert profkit.force_flush(0.1)
    assert profkit.shutdown(0.1)


def test_stats_after_shutdown_keep_the_final_counters() -> None:
    """After shutdown(), stats() still reports the session that was shut down."""

    @profkit.profiled
    def f() -> int:
        return 1

    profkit.configure(sample_every=2, exporters=(), extra_exporters=(CaptureExporter(),))
    assert [1, 1, 1] == [f(), f(), f()]
    assert profkit.shutdown(5)
    s = profkit.stats()
    assert (3, 2, 2) == (s["root_calls"], s["sampled"], s["exported"])
    profkit.configure(sample_every=2, exporters=())
    assert 0 == profkit.stats()["root_calls"]


def test_configure_has_one_keyword_per_setting() -> None:
    """configure()'s keyword-only parameters are Config's fields, in order (editors list them)."""
    import dataclasses
    import inspect

    params = inspect.signature(profkit.configure).parameters.values()
    keywords = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert [f.name for f in dataclasses.fields(profkit.Config)] == keywords


def test_configure_leaves_unset_settings_to_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A parameter not passed is filled from PROFKIT_*; one passed wins over it."""
    monkeypatch.setenv("PROFKIT_TOP_K", "3")
    monkeypatch.setenv("PROFKIT_WINDOW", "2")
    config = profkit.configure(exporters=(), window=4)
    assert (3, 4) == (config.top_k, config.window)
