"""A label that is not a string (``region(123)``, ``profiled(name=None)``'s cousins): made
one with ``str()``, sampled or not, never an exception in the caller's ``with`` body."""

from __future__ import annotations

from typing import Any

import pytest

import profkit
from profkit.testing import capture


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


@pytest.mark.parametrize(
    ("label", "expected"),
    [(123, "123"), (None, "None"), (b"x", "b'x'"), (Unprintable(), "<Unprintable>")],
    ids=["int", "none", "bytes", "unprintable"],
)
def test_a_region_label_that_is_not_a_string_is_made_one(label: Any, expected: str) -> None:
    ran = 0
    with capture(sample_every=1) as cap:
        for _ in range(3):
            with profkit.region(label):
                ran += 1
        assert profkit.force_flush(10.0)
        stats = profkit.stats()
    assert 3 == ran
    assert (3, 0) == (stats["exported"], stats["dropped"]), stats["dropped_reasons"]
    assert [expected] * 3 == [c.label for c in cap.calls]


def test_a_decorator_name_that_is_not_a_string_is_made_one() -> None:
    @profkit.profiled(name=123)  # type: ignore[arg-type]
    def handler() -> int:
        return 5

    with capture(sample_every=1) as cap:
        assert [5, 5] == [handler(), handler()]
        assert profkit.force_flush(10.0)
    assert ["123", "123"] == [c.label for c in cap.calls]


def test_a_batch_label_that_is_not_a_string_is_made_one() -> None:
    with capture(sample_every=1) as cap:
        with profkit.batch(7, []):  # type: ignore[arg-type]
            pass
        assert profkit.force_flush(10.0)
    assert ["7"] == [c.label for c in cap.calls]
