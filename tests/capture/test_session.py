"""The session: exact window counts, another profiler, off-sample cost, replacement."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import profkit
from profkit._global import get_session
from profkit.testing import capture


@profkit.profiled
def predict(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The handler under test."""
    with profkit.region("inference"):
        return model(x)


def test_sample_every_4_over_40_calls_gives_10_windows(mlp, batch) -> None:
    """sample_every=4 and 40 root calls: exactly 10 windows summarised and exported."""
    with capture(sample_every=4) as cap:
        for _ in range(40):
            predict(mlp, batch)
    assert 10 == len(cap.windows)
    assert (40, 10, 10, 10, 0) == (
        cap.stats["root_calls"],
        cap.stats["windows"],
        cap.stats["sampled"],
        cap.stats["exported"],
        cap.stats["dropped"],
    )


def test_mlp_summary_top_rows_show_addmm(mlp, batch) -> None:
    """The MLP's summary holds aten::addmm with the count of Linear layers."""
    with capture(sample_every=1, top_k=5) as cap:
        predict(mlp, batch)
    rows = {r.name: r for r in cap.calls[0].root.ops}
    assert 2 == rows["aten::addmm"].count
    assert "predict" == cap.calls[0].label


def test_returned_value_is_unchanged(mlp, batch) -> None:
    """A sampled call returns the same tensor as the bare model."""
    with capture(sample_every=1):
        out = predict(mlp, batch)
    assert torch.equal(mlp(batch), out)


def test_sample_rate_with_fixed_trace_id_decides_like_another_session() -> None:
    """With sample_rate and a fixed trace id, two sessions sample the same calls."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, use_span

    tracer_ids = [(i * 0x9E3779B97F4A7C15 + 12345) % (1 << 128) for i in range(1, 60)]

    def run() -> list[int]:
        picked = []
        with capture(sample_rate=0.3, tracer_provider=TracerProvider()) as cap:
            for tid in tracer_ids:
                ctx = SpanContext(tid, 1, is_remote=True, trace_flags=TraceFlags(1))
                with use_span(NonRecordingSpan(ctx)):
                    torch_add()
        for call in cap.calls:
            picked.append(call.parent_span_context.trace_id)  # type: ignore[union-attr]
        return picked

    first, second = run(), run()
    assert first == second
    assert 0 < len(first) < len(tracer_ids)


@profkit.profiled
def torch_add() -> torch.Tensor:
    """A tiny op."""
    return torch.ones(2) + 1


def test_user_profiler_active_profkit_stays_out(mlp, batch) -> None:
    """Under the user's own profiler, profkit opens no window and says why in stats()."""
    with capture(sample_every=1) as cap:
        with profile(activities=[ProfilerActivity.CPU]) as user_prof:
            for _ in range(100):
                predict(mlp, batch)
        stats = profkit.stats()
    assert (0, 100, 0) == (stats["windows"], stats["skipped_foreign"], len(cap.calls))
    names = {e.name for e in user_prof.events()}
    assert "aten::addmm" in names
    assert "predict" not in names  # no label leaked into the user's profile


def test_off_sample_call_enters_no_record_function(monkeypatch, mlp, batch) -> None:
    """An off-sample decorated call and its regions never open a record_function range."""
    calls: list[str] = []
    import profkit._label.scope as scope

    real = scope.range_enter

    def spy(name: str, args: object) -> object:
        calls.append(name)
        return real(name, args)

    monkeypatch.setattr(scope, "range_enter", spy)
    with capture(sample_every=1000):
        predict(mlp, batch)  # call 0: sampled
        assert ["predict", "inference"] == calls  # (the spy does see a sampled call's)
        calls.clear()
        for _ in range(50):
            predict(mlp, batch)
    assert [] == calls


def test_sampled_call_enters_record_function_for_each_scope(monkeypatch, mlp, batch) -> None:
    """Sanity for the test above: a sampled call opens a range per scope."""
    calls: list[str] = []
    import profkit._label.scope as scope

    real_enter = scope.range_enter

    def spy(name: str, args: object) -> object:
        calls.append(name)
        return real_enter(name, args)

    monkeypatch.setattr(scope, "range_enter", spy)
    with capture(sample_every=1) as cap:
        predict(mlp, batch)
    assert ["predict", "inference"] == calls
    (call,) = cap.calls  # each range ended where its scope did: the ops fall inside it
    assert ["predict", "inference"] == [scope.label for scope in call.scopes]
    assert call.scopes[1].op_count > 0


def test_trigger_overrides_the_sampler(mlp, batch) -> None:
    """trigger(2) profiles the next two root calls even at 1-in-1000."""
    with capture(sample_every=1000) as cap:
        predict(mlp, batch)  # the counter's first call is sampled
        profkit.trigger(2)
        for _ in range(5):
            predict(mlp, batch)
    assert ["every:1000", "trigger", "trigger"] == [c.policy for c in cap.calls]
    profkit.configure(exporters=())
    with pytest.raises(ValueError, match="n must be"):
        profkit.trigger(0)


def test_window_and_warmup(mlp, batch) -> None:
    """window=3, warmup=2: one window of 5 root calls, the first 2 discarded."""
    with capture(sample_every=100, window=3, warmup=2) as cap:
        for _ in range(5):
            predict(mlp, batch)
    assert (1, 3, 2) == (len(cap.windows), len(cap.calls), cap.stats["warmup_calls"])
    assert [2, 3, 4] == [c.call_index for c in cap.calls]
    assert ["window", "window", "window"] == [c.policy for c in cap.calls]


def test_rate_cap_limits_windows(mlp, batch) -> None:
    """max_per_minute=3 allows 3 windows in a burst of 10 sampled calls."""
    with capture(sample_every=1, max_per_minute=3) as cap:
        for _ in range(10):
            predict(mlp, batch)
    assert (3, 7) == (len(cap.calls), cap.stats["skipped_rate_limit"])


def test_configure_again_replaces_the_session(mlp, batch) -> None:
    """A second configure() installs a new session; the old one is retired cleanly."""
    profkit.configure(sample_every=1, exporters=())
    first = get_session()
    predict(mlp, batch)
    profkit.configure(sample_every=1, exporters=())
    second = get_session()
    predict(mlp, batch)
    assert get_session() is second
    assert first.stats.root_calls == 1 == second.stats.root_calls
    first.force_flush(5)  # (False, or True once its retirement asked first)
    assert not second.force_flush(5)  # no exporter: delivered nowhere


def test_disabled_session_does_nothing(mlp, batch) -> None:
    """enabled=False: calls run, nothing is counted or profiled."""
    profkit.configure(enabled=False, exporters=())
    predict(mlp, batch)
    assert 0 == profkit.stats()["root_calls"]


def test_calls_after_shutdown_run_unprofiled(mlp, batch) -> None:
    """After shutdown(), decorated calls still return and nothing is sampled."""
    profkit.configure(sample_every=1, exporters=())
    assert profkit.shutdown(5)
    assert torch.equal(mlp(batch), predict(mlp, batch))
    assert get_session() is None


def test_trigger_with_a_label_profiles_only_that_label() -> None:
    """trigger(2, label="b") profiles exactly the next two calls of b and none of a."""

    @profkit.profiled("a")
    def a() -> int:
        return 1

    @profkit.profiled("b")
    def b() -> int:
        return 2

    with capture(sample_every=10**9) as cap:
        assert 1 == a()  # the counter's first call is sampled: take it out of the way
        profkit.trigger(2, label="b")
        assert [1, 2, 1, 2, 1, 2, 2] == [a(), b(), a(), b(), a(), b(), b()]
    assert ["a", "b", "b"] == [c.label for c in cap.calls]
    assert ["every:1000000000", "trigger", "trigger"] == [c.policy for c in cap.calls]
    profkit.configure(exporters=())
    with pytest.raises(ValueError, match="label"):
        profkit.trigger(1, label=3)  # type: ignore[arg-type]


def test_configure_and_shutdown_racing_leave_a_consistent_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """configure() on one thread while shutdown() runs on another, shutdown landing while
    the new session starts (its profiler priming): in whichever order they are taken, a
    global session afterwards has its hooks (torch's profiler hooks, the exit flush), and
    none left means none of profkit's hooks either."""
    import threading

    from profkit import _global
    from profkit._capture import hooks
    from profkit._session import Session

    profkit.configure(exporters=(), sample_every=1, cold_calls=0)
    starting, go_on = threading.Event(), threading.Event()
    original = Session.start

    def slow_start(self: Session) -> None:
        starting.set()
        go_on.wait(5)  # the window in which the concurrent shutdown used to land
        original(self)

    monkeypatch.setattr(Session, "start", slow_start)
    late = threading.Thread(
        target=lambda: profkit.configure(exporters=(), sample_every=1, window=2)
    )
    late.start()
    try:
        assert starting.wait(10)
        stopper = threading.Thread(target=profkit.shutdown, args=(2.0,))
        stopper.start()
        stopper.join(0.3)  # it runs now, or waits for the configure to finish
        go_on.set()
        late.join(10)
        stopper.join(10)
    finally:
        go_on.set()
        monkeypatch.setattr(Session, "start", original)
    session = get_session()
    state = (
        hooks.profiler_hooked(),
        _global._before_exit in hooks._state.before_exit_callbacks,
    )
    try:
        if session is not None and session.active:
            assert (True, True) == state
        else:
            assert (False, False) == state
    finally:
        profkit.shutdown(2.0)
