"""Exit without shutdown(): every sampled call counted exported reached the provider's
exporter, or was counted dropped, whichever exit hook (profkit's, the provider's) runs first."""

from __future__ import annotations

import pytest
from fresh_interpreter import run_fresh

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("kind", ["simple", "batch"])
@pytest.mark.parametrize(
    "order",
    # the provider made after configure() never lost spans: CI runs it (slow), the default
    # suite the order that did
    [pytest.param("after", marks=pytest.mark.slow), "before"],
)
@pytest.mark.slow
def test_exit_without_shutdown_delivers_what_it_counts(order: str, kind: str) -> None:
    rc, report, err = run_fresh("exit_otel_provider_order", order, kind)
    assert 0 == rc, err[-2000:]
    stats = report["stats"]
    assert stats["sampled"] > 0, stats
    assert stats["sampled"] == stats["exported"] + stats["dropped"], stats
    assert report["delivered"] == stats["exported"], (report, stats)
    assert 0 == stats["dropped"], stats  # the provider was alive when profkit flushed


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "calls"), [("calls", 8), ("window", 1)])
@pytest.mark.parametrize("kind", ["simple", "batch"])
def test_calls_of_a_non_daemon_thread_after_main_returned_are_delivered(
    kind: str, mode: str, calls: int
) -> None:
    """A non-daemon thread samples on after the main thread returned (after profkit's first
    exit flush), or ends with its ``window=2`` window open: its calls reach the provider
    made after configure() before it shuts down (they were dropped, ``provider_shut_down``)."""
    rc, report, err = run_fresh("exit_non_daemon_thread_samples_on", kind, mode)
    assert 0 == rc, err[-2000:]
    stats = report["stats"]
    assert (calls, calls, 0) == (stats["sampled"], stats["exported"], stats["dropped"]), stats
    assert calls == report["delivered"]
