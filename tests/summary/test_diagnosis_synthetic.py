"""Diagnosis rules on synthetic call summaries (no torch, no profiler)."""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from profkit._config import Config
from profkit._model import CallSummary, OpRow, ScopeSummary
from profkit._summary.builder import top_rows
from profkit._summary.diagnosis import Thresholds, amdahl_speedup, diagnose

VERDICTS = {"input-bound", "launch-bound", "compute-bound", "balanced", "no-ops"}


# --- builders ------------------------------------------------------------------------------


def op(
    name: str,
    count: int,
    cpu: float,
    device: float = 0.0,
    other: bool = False,
    kernel: bool = False,
) -> OpRow:
    """One op row with ``count`` events of total self CPU time ``cpu`` (µs)."""
    return OpRow(
        name=name,
        count=count,
        self_cpu_us=cpu,
        cpu_us=cpu,
        self_device_us=device,
        device_us=device,
        is_other=other,
        is_kernel=kernel,
    )


def scope(
    label: str,
    duration_us: float,
    *,
    index: int = 0,
    parent: int = -1,
    ops: Sequence[OpRow] = (),
    op_count: int | None = None,
    self_cpu_us: float | None = None,
    self_device_us: float | None = None,
) -> ScopeSummary:
    """A scope; op count and self times default to the sums over ``ops``, as the summary has them.

    Host op events and CPU time sum the host rows; device time sums the kernel rows only (a
    CPU op's device time mirrors its kernels).
    """
    host = [r for r in ops if not r.is_kernel]
    return ScopeSummary(
        index=index,
        parent=parent,
        label=label,
        start_ns=0,
        end_ns=round(duration_us * 1000),
        attributes={},
        ops=tuple(ops),
        op_count=sum(r.count for r in host) if op_count is None else op_count,
        self_cpu_us=sum(r.self_cpu_us for r in host) if self_cpu_us is None else self_cpu_us,
        self_device_us=(
            sum(r.self_device_us for r in ops if r.is_kernel)
            if self_device_us is None
            else self_device_us
        ),
    )


def region(
    label: str, duration_us: float, index: int, parent: int = 0, cpu: float = 0.0
) -> ScopeSummary:
    """A nested scope with ``cpu`` µs of op self time."""
    return scope(label, duration_us, index=index, parent=parent, op_count=1, self_cpu_us=cpu)


def call(root: ScopeSummary, *regions: ScopeSummary, device: bool = False) -> CallSummary:
    """A call whose root scope is ``root`` and nested scopes are ``regions``."""
    return CallSummary(
        window_id=1,
        call_index=0,
        label=root.label,
        scopes=(root, *regions),
        parent_span_context=None,
        policy="every",
        attribution="thread",
        device_active=device,
    )


DEFAULT = Thresholds()


# --- verdicts ------------------------------------------------------------------------------


def test_input_bound_names_the_region_with_most_outside_time() -> None:
    """73% input time, mostly in 'preprocess': input-bound naming that region.

    Outside ops: 820 µs; glue allowance 20 µs per op event, scope by scope: the root's own
    part (50 µs outside, 8 ops) keeps 0, preprocess 700 - 20, model 70 - 20: 730 µs.
    """
    root = scope("handler", 1000, ops=[op("aten::addmm", 10, 180)])
    c = call(root, region("preprocess", 700, 1), region("model", 250, 2, cpu=180))
    expected = "73% of the call outside torch ops, mostly in region 'preprocess'"
    d = diagnose(c, DEFAULT)
    assert (d.verdict, d.reason) == ("input-bound", expected)


def test_input_bound_without_regions_has_a_plain_reason() -> None:
    """Without nested scopes the input-bound reason names no region (820 - 10 x 20 µs)."""
    c = call(scope("handler", 1000, ops=[op("aten::addmm", 10, 180)]))
    assert diagnose(c, DEFAULT).reason == "62% of the call outside torch ops"


def test_input_bound_region_is_exclusive_of_child_scopes() -> None:
    """A parent scope's outside time excludes its children's: the inner region is named."""
    root = scope("handler", 1000, ops=[op("aten::mm", 1, 100)])
    c = call(root, region("outer", 800, 1), region("inner", 600, 2, parent=1))
    expected = "88% of the call outside torch ops, mostly in region 'inner'"
    assert diagnose(c, DEFAULT).reason == expected


def test_input_bound_minor_region_gets_its_share() -> None:
    """A region holding under half the outside time is named as the largest part."""
    root = scope("handler", 1000, ops=[op("aten::mm", 1, 100)])
    c = call(root, region("decode", 300, 1))
    expected = "88% of the call outside torch ops, the largest part (32%) in region 'decode'"
    assert diagnose(c, DEFAULT).reason == expected


def test_a_data_loader_ranked_past_top_k_on_a_device_is_still_input_time() -> None:
    """On a device the op rows rank by device time, so a DataLoader's range (none of its own)
    would fall past ``top_k`` into "other": it stays a named row, its time input time."""
    kernels = [op(f"kernel_{i}", 1, 0.0, device=200.0, kernel=True) for i in range(6)]
    launches = [op(f"aten::op_{i}", 1, 20.0, device=200.0) for i in range(6)]
    loader = op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 2, 90_000.0)
    rows = top_rows([*kernels, *launches, loader], 10)
    d = diagnose(call(scope("step", 100_000.0, ops=rows), device=True), DEFAULT)
    assert ("input-bound", [loader]) == (d.verdict, [r for r in rows if r.name == loader.name])


def test_launch_bound() -> None:
    """Many tiny ops taking all the time: launch-bound, though two rows hold all op time."""
    rows = [op("aten::add", 1000, 3100), op("aten::mul", 234, 1170)]
    d = diagnose(call(scope("step", 5000, ops=rows)), DEFAULT)
    expected = (
        "1,234 ops with a median of 3.1 \u00b5s each: tiny ops (\u2264 20 \u00b5s) and the gaps "
        "between them take 100% of the time in and between ops, the host is busy launching them"
    )
    assert (d.verdict, d.reason) == ("launch-bound", expected)


def test_many_tiny_ops_beside_a_heavy_op_are_not_launch_bound() -> None:
    """Issue 40: 298 ops with a median of 0.6 µs, but addmm takes 76% of op time (783 of 1,029
    µs): heavy ops carry most of the time in and between ops, so compute-bound, not launch."""
    rows = [op("aten::addmm", 3, 783), op("aten::unbind", 1, 40), op("other", 294, 206, other=True)]
    d = diagnose(call(scope("predict", 1500, ops=rows)), DEFAULT)
    expected = ("compute-bound", "aten::addmm takes 76% of op time", 0.45)
    assert expected == (d.verdict, d.reason, round(d.figures["launch_share"], 2)), d.figures


def test_launch_glue_counts_toward_launching() -> None:
    """1,000 tiny ops (1 ms) with 3 ms of glue between them beside a 1.5 ms matmul: the host
    spends 73% of the time in and between ops launching, so launch-bound, though the matmul
    takes 60% of op time."""
    rows = [op("aten::mm", 1, 1500), op("aten::add", 1000, 1000)]
    d = diagnose(call(scope("step", 5500, ops=rows)), DEFAULT)
    share = round(d.figures["launch_share"], 2)
    assert ("launch-bound", 0.73, 0.6) == (d.verdict, share, d.figures["top1_share"])


@pytest.mark.parametrize(
    ("mm_us", "verdict"), [(3000.0, "launch-bound"), (3001.0, "compute-bound")]
)
def test_launch_share_boundary(mm_us: float, verdict: str) -> None:
    """A launch share of exactly one half is launch-bound; a microsecond more matmul is not.

    300 adds of 10 µs (3 ms, tiny) and no glue beside one matmul of ``mm_us``.
    """
    rows = [op("aten::mm", 1, mm_us), op("aten::add", 300, 3000)]
    d = diagnose(call(scope("step", 3000 + mm_us, ops=rows)), DEFAULT)
    assert verdict == d.verdict, d.figures


def test_launch_share_on_a_device_reads_kernel_time() -> None:
    """On a device: 300 tiny kernels (2 µs) beside one 9 ms GEMM are not launch-bound; alone
    they are, with the reason quoting the tiny kernels' share of device time."""
    launches = [op("aten::add", 300, 600, device=600), op("aten::mm", 1, 5, device=9000)]
    tiny = op("add_kernel", 300, 0, device=600, kernel=True)
    gemm = op("sgemm", 1, 0, device=9000, kernel=True)
    heavy = diagnose(call(scope("f", 10_000, ops=[*launches, tiny, gemm]), device=True), DEFAULT)
    light = diagnose(call(scope("f", 10_000, ops=[launches[0], tiny]), device=True), DEFAULT)
    reason = (
        "300 ops with a median of 2.0 \u00b5s each: tiny kernels (\u2264 20 \u00b5s) take "
        "100% of device kernel time, the host is busy launching them"
    )
    assert ("compute-bound", "launch-bound", reason) == (heavy.verdict, light.verdict, light.reason)


def test_compute_bound() -> None:
    """Two ops taking 91% of op time: compute-bound naming them."""
    rows = [op("aten::addmm", 10, 600), op("aten::mm", 5, 219), op("aten::relu", 5, 81)]
    d = diagnose(call(scope("forward", 1000, ops=rows)), DEFAULT)
    expected = ("compute-bound", "aten::addmm and aten::mm take 91% of op time")
    assert (d.verdict, d.reason) == expected


def test_compute_bound_single_op() -> None:
    """One op row taking all op time: compute-bound with a singular reason."""
    d = diagnose(call(scope("forward", 1000, ops=[op("aten::conv2d", 3, 900)])), DEFAULT)
    assert (d.verdict, d.reason) == ("compute-bound", "aten::conv2d takes 100% of op time")


def test_balanced() -> None:
    """Four even ops, few events, little outside time: balanced with the three figures."""
    rows = [op(f"aten::op{i}", 2, 225) for i in range(4)]
    d = diagnose(call(scope("forward", 1000, ops=rows)), DEFAULT)
    expected = (
        "no single cause: 10% outside torch ops, median op 112.5 \u00b5s, "
        "tiny ops and launch gaps 10% of the time in and between ops, "
        "top two ops take 50% of op time"
    )
    assert (d.verdict, d.reason) == ("balanced", expected)


def test_launch_glue_outside_ops_is_not_input() -> None:
    """60% of a 3,000-op loop is outside ops (Python between ops): launch-bound, not input."""
    d = diagnose(call(scope("loop", 10_000, ops=[op("aten::add", 3000, 4000)])), DEFAULT)
    actual = (d.verdict, d.figures["outside_ops_share"], d.figures["input_share"])
    assert actual == ("launch-bound", 0.6, 0.0)


def test_glue_allowance_is_per_scope() -> None:
    """A preprocess region without ops keeps its time next to a model region of 2,000 ops."""
    root = scope("handler", 30_000, ops=[op("aten::add", 2000, 10_000)])
    model = region("model", 15_000, 2, cpu=10_000)
    model = dataclasses.replace(model, op_count=2000)
    preprocess = dataclasses.replace(region("preprocess", 15_000, 1), op_count=0)
    d = diagnose(call(root, preprocess, model), DEFAULT)
    expected = (
        "input-bound",
        0.5,
        "50% of the call outside torch ops, mostly in region 'preprocess'",
    )
    assert (d.verdict, d.figures["input_share"], d.reason) == expected


def test_compute_bound_leaves_a_trivial_second_op_unnamed() -> None:
    """addmm at 99.6% and t at 0.4%: the reason names addmm alone."""
    rows = [op("aten::addmm", 3, 996), op("aten::t", 3, 4)]
    d = diagnose(call(scope("forward", 1050, ops=rows)), DEFAULT)
    assert (d.verdict, d.reason) == ("compute-bound", "aten::addmm takes 100% of op time")


def test_compute_bound_names_the_top_two_when_both_were_needed() -> None:
    """55% + 6%: the second op is small, but the verdict needed it; the reason says so."""
    rows = [op("a", 1, 550), op("b", 1, 60), op("c", 1, 40)] + [
        op(f"d{i}", 1, 50) for i in range(7)
    ]
    d = diagnose(call(scope("f", 1050, ops=rows)), DEFAULT)
    expected = ("compute-bound", "a takes 55% of op time (the top two ops 61%)")
    assert (d.verdict, d.reason) == expected


@pytest.mark.parametrize(
    ("top", "verdict", "confidence"),
    [
        (300.0, "compute-bound", "low"),  # top two 60%: exactly at the threshold
        (330.0, "compute-bound", "medium"),  # 66%: 15% of the room above 60%
        (450.0, "compute-bound", "high"),  # 90%: 75% of the room
        (290.0, "balanced", "low"),  # 58%: 3% short of 60%
        (250.0, "balanced", "medium"),  # 50%: 17% short
        (200.0, "balanced", "high"),  # 40%: a third short
    ],
)
def test_confidence_follows_the_margin(top: float, verdict: str, confidence: str) -> None:
    """Near the compute-bound threshold the verdict is low-confidence, far from it high."""
    rest = 1000.0 - 2 * top
    rows = [op("a", 1, top), op("b", 1, top)] + [op(f"r{i}", 1, rest / 8) for i in range(8)]
    d = diagnose(call(scope("f", 1100, ops=rows)), DEFAULT)
    assert (verdict, confidence) == (d.verdict, d.confidence), d.figures


def test_launch_bound_by_a_thin_launch_share_is_low_confidence() -> None:
    """300 tiny adds (3 ms) beside a 2.8 ms matmul: launch share 0.52, launch-bound but low."""
    rows = [op("aten::mm", 1, 2800), op("aten::add", 300, 3000)]
    d = diagnose(call(scope("step", 5800, ops=rows)), DEFAULT)
    share = round(d.figures["launch_share"], 2)
    assert ("launch-bound", "low", 0.52) == (d.verdict, d.confidence, share)


def test_balanced_next_to_input_bound_is_low_confidence() -> None:
    """Input share 48% against a 50% threshold: a balanced verdict that could flip."""
    rows = [op(f"aten::op{i}", 1, 110) for i in range(4)]
    d = diagnose(call(scope("f", 1000, ops=rows)), DEFAULT)
    assert ("balanced", "low") == (d.verdict, d.confidence), d.figures


# --- boundaries ----------------------------------------------------------------------------


@pytest.mark.parametrize(("op_cpu", "verdict"), [(480.0, "input-bound"), (481.0, "compute-bound")])
def test_input_bound_boundary(op_cpu: float, verdict: str) -> None:
    """Input share (outside less 20 µs of glue) exactly at the threshold is input-bound."""
    d = diagnose(call(scope("f", 1000, ops=[op("aten::mm", 1, op_cpu)])), DEFAULT)
    assert d.verdict == verdict


@pytest.mark.parametrize(
    ("count", "cpu", "verdict"),
    [
        (200, 4000.0, "launch-bound"),
        (199, 3980.0, "compute-bound"),
        (200, 4000.2, "compute-bound"),
    ],
)
def test_launch_bound_boundary(count: int, cpu: float, verdict: str) -> None:
    """Exactly min ops at exactly the median threshold is launch-bound; one past either is not."""
    d = diagnose(call(scope("f", cpu * 1.25, ops=[op("aten::add", count, cpu)])), DEFAULT)
    assert (d.verdict, d.figures["op_count"]) == (verdict, float(count))


@pytest.mark.parametrize(("top", "verdict"), [(300.0, "compute-bound"), (299.0, "balanced")])
def test_compute_bound_boundary(top: float, verdict: str) -> None:
    """A top-two share exactly at compute_bound_top2_share is compute-bound; below is not."""
    rest = 1000.0 - 2 * top
    rows = [op("a", 1, top), op("b", 1, top), op("c", 1, rest / 2), op("d", 1, rest / 2)]
    d = diagnose(call(scope("f", 1100, ops=rows)), DEFAULT)
    assert d.verdict == verdict


# --- edge cases ----------------------------------------------------------------------------


def test_no_ops_says_no_ops() -> None:
    """A call without ops reads "no-ops" (not balanced), with full confidence."""
    d = diagnose(call(scope("idle", 1000)), DEFAULT)
    reason = "no torch ops recorded in the call: nothing to judge"
    expected = ("no-ops", reason, 0.0, "high")
    assert (d.verdict, d.reason, d.figures["median_op_us"], d.confidence) == expected


def test_zero_wall_time_is_balanced_with_no_amdahl() -> None:
    """A call of zero duration is balanced, with zero shares and no Amdahl entries."""
    d = diagnose(call(scope("instant", 0, ops=[op("aten::mm", 1, 5)])), DEFAULT)
    reason = "the call took no measurable wall time: nothing to judge"
    expected: tuple[str, str, float, list[object]] = ("balanced", reason, 0.0, [])
    assert (d.verdict, d.reason, d.figures["outside_ops_share"], list(d.amdahl)) == expected


def test_op_time_over_wall_clamps_outside_share() -> None:
    """Op self time above the wall time (several threads) gives an outside share of 0."""
    d = diagnose(call(scope("f", 100, ops=[op("aten::mm", 1, 150)])), DEFAULT)
    assert d.figures["outside_ops_share"] == 0.0


def test_top_op_ignores_the_other_row() -> None:
    """The "other" row never counts as a top op, however large it is."""
    rows = [op("other", 900, 800, other=True), op("aten::mm", 2, 100), op("aten::add", 4, 50)]
    d = diagnose(call(scope("f", 1000, ops=rows)), DEFAULT)
    expected = (100 / 950, 150 / 950, ["op:aten::mm", "op:aten::add"])
    assert (d.figures["top1_share"], d.figures["top2_share"], [a[0] for a in d.amdahl]) == expected


def test_median_is_weighted_by_count() -> None:
    """The median expands each row's mean by its count (other row included)."""
    rows = [op("aten::add", 3, 3), op("other", 1, 100, other=True)]
    d = diagnose(call(scope("f", 1000, ops=rows)), DEFAULT)
    assert d.figures["median_op_us"] == 1.0


def test_median_of_even_event_count_averages_middle_pair() -> None:
    """With an even number of events the median averages the two middle ones."""
    d = diagnose(call(scope("f", 1000, ops=[op("a", 1, 2), op("b", 1, 4)])), DEFAULT)
    assert d.figures["median_op_us"] == 3.0


def test_median_falls_back_to_mean_without_rows() -> None:
    """With events but no rows the median estimate is the mean op time."""
    d = diagnose(call(scope("f", 1000, op_count=4, self_cpu_us=40)), DEFAULT)
    assert d.figures["median_op_us"] == 10.0


def test_median_leaves_kernel_rows_out() -> None:
    """Kernel rows (no host time) do not pull the median op time down."""
    rows = [op("aten::add", 300, 600, device=300), op("add_kernel", 300, 0, 300, kernel=True)]
    d = diagnose(call(scope("f", 1000, ops=rows), device=True), DEFAULT)
    assert d.figures["median_op_us"] == 2.0


def test_median_other_row_stands_for_its_host_events_only() -> None:
    """An "other" row holding kernels too counts only the host events no named row holds."""
    rows = [op("aten::mm", 3, 3), op("other", 10, 400, other=True)]
    d = diagnose(call(scope("f", 1000, ops=rows, op_count=7), device=True), DEFAULT)
    assert d.figures["median_op_us"] == 100.0


# --- device --------------------------------------------------------------------------------


def test_gpu_figures_use_device_time() -> None:
    """On a device, busy/idle figures appear and top shares use kernel device self time."""
    rows = [
        op("aten::mm", 4, 600, device=200),
        op("sgemm_128x64", 4, 0, 200, kernel=True),
        op("elementwise", 8, 0, device=50, kernel=True),
    ]
    d = diagnose(call(scope("f", 1000, ops=rows), device=True), DEFAULT)
    figures = {k: d.figures[k] for k in ("device_busy_us", "device_idle_share", "top1_share")}
    expected = {"device_busy_us": 250.0, "device_idle_share": 0.75, "top1_share": 0.8}
    assert (figures, d.verdict, d.reason) == (
        expected,
        "compute-bound",
        "sgemm_128x64 and elementwise take 100% of device kernel time",
    )


def test_cpu_call_has_no_device_figures() -> None:
    """Without device activity the device figures are absent."""
    d = diagnose(call(scope("f", 1000, ops=[op("aten::mm", 1, 900)])), DEFAULT)
    assert sorted(d.figures) == [
        "input_share",
        "launch_share",
        "margin",
        "median_op_us",
        "op_count",
        "op_self_us",
        "outside_ops_share",
        "top1_share",
        "top2_share",
        "wall_us",
    ]


def test_gpu_idle_with_small_host_op_time_is_input_bound() -> None:
    """Device idle past the threshold and host ops (and glue) under half the call: input-bound."""
    rows = [op("aten::mm", 4, 400, device=250), op("sgemm", 4, 0, device=250, kernel=True)]
    th = Thresholds(input_bound_share=0.7)
    d = diagnose(call(scope("f", 1000, ops=rows), region("load", 500, 1), device=True), th)
    expected = "device idle for 75% of the call, 52% outside torch ops, mostly in region 'load'"
    assert (d.verdict, d.reason) == ("input-bound", expected)


def test_gpu_idle_with_busy_host_is_not_input_bound() -> None:
    """Device idle but host in ops for most of the call: not input-bound."""
    rows = [op("aten::mm", 4, 600, device=200), op("sgemm", 4, 0, device=200, kernel=True)]
    d = diagnose(call(scope("f", 1000, ops=rows), device=True), DEFAULT)
    assert (d.verdict, d.figures["device_idle_share"]) == ("compute-bound", 0.8)


def test_busy_device_with_host_outside_ops_is_not_input_bound() -> None:
    """Host outside ops while the device computes (a bare synchronize): compute-bound."""
    rows = [op("aten::mm", 2, 60, device=950), op("sgemm", 2, 0, device=950, kernel=True)]
    d = diagnose(call(scope("f", 1000, ops=rows), device=True), DEFAULT)
    actual = (d.verdict, d.figures["input_share"], round(d.figures["device_idle_share"], 6))
    assert ("compute-bound", 0.9, 0.05) == actual


def test_idle_device_and_host_outside_ops_is_input_bound() -> None:
    """Device idle for 90% and host in a loading region: input-bound, both figures said."""
    rows = [op("aten::mm", 2, 100, device=100), op("sgemm", 2, 0, device=100, kernel=True)]
    d = diagnose(call(scope("f", 1000, ops=rows), region("load", 800, 1), device=True), DEFAULT)
    expected = "device idle for 90% of the call, 86% outside torch ops, mostly in region 'load'"
    assert ("input-bound", expected) == (d.verdict, d.reason)


def test_device_active_without_device_time_reads_cpu_time() -> None:
    """Device recorded but no device time: fully idle, shares from CPU time."""
    rows = [op("aten::mm", 1, 700), op("aten::add", 1, 100)]
    d = diagnose(call(scope("f", 1000, ops=rows), device=True), DEFAULT)
    expected = (1.0, 0.875, "compute-bound")
    assert (d.figures["device_idle_share"], d.figures["top1_share"], d.verdict) == expected


def test_amdahl_names_kernels_by_device_time() -> None:
    """On a device, kernels enter the Amdahl ranking by device self time, host ops by CPU time."""
    rows = [op("aten::mm", 1, 50, device=600), op("sgemm", 1, 0, device=600, kernel=True)]
    d = diagnose(call(scope("f", 1000, ops=rows), device=True), DEFAULT)
    assert [(w, round(f, 6)) for w, f, _ in d.amdahl] == [
        ("kernel:sgemm", 0.6),
        ("op:aten::mm", 0.05),
    ]


# --- Amdahl --------------------------------------------------------------------------------


def test_amdahl_entries() -> None:
    """Regions and ops as (what, f, 1/(1-f)), largest f first, at most five."""
    rows = [op("aten::mm", 1, 250), op("aten::add", 1, 100), op("other", 9, 10, other=True)]
    regions = [region("prep", 500, 1), region("a", 40, 2), region("b", 30, 3), region("c", 20, 4)]
    d = diagnose(call(scope("f", 1000, ops=rows), *regions), DEFAULT)
    expected = [
        ("region:prep", 0.5, 2.0),
        ("op:aten::mm", 0.25, 1 / (1 - 0.25)),
        ("op:aten::add", 0.1, 1 / (1 - 0.1)),
        ("region:a", 0.04, 1 / (1 - 0.04)),
        ("region:b", 0.03, 1 / (1 - 0.03)),
    ]
    assert list(d.amdahl) == expected


def test_amdahl_clamps_f_below_one() -> None:
    """A region as long as the call is clamped to f = 0.999999 with a finite speed-up."""
    d = diagnose(call(scope("f", 1000, ops=[op("a", 1, 10)]), region("all", 1000, 1)), DEFAULT)
    assert d.amdahl[0] == ("region:all", 0.999999, 1 / (1 - 0.999999))


def test_amdahl_speedup() -> None:
    """amdahl_speedup follows 1/((1-f)+f/s), with s=inf giving 1/(1-f)."""
    actual = [
        amdahl_speedup(0.5, 2),
        amdahl_speedup(0.5, math.inf),
        amdahl_speedup(1.0, math.inf),
        amdahl_speedup(0.0, 10),
    ]
    assert actual == [1 / (0.5 + 0.25), 2.0, math.inf, 1.0]


@pytest.mark.parametrize(("f", "s"), [(-0.1, 2.0), (1.5, 2.0), (0.5, 0.0), (math.nan, 2.0)])
def test_amdahl_speedup_rejects_bad_input(f: float, s: float) -> None:
    """f outside [0, 1] or s <= 0 raises ValueError."""
    with pytest.raises(ValueError, match="amdahl_speedup"):
        amdahl_speedup(f, s)


# --- thresholds ----------------------------------------------------------------------------


def test_threshold_defaults_match_config() -> None:
    """Thresholds has the Config field names and defaults."""
    config_defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    expected = {f.name: config_defaults[f.name] for f in dataclasses.fields(Thresholds)}
    assert dataclasses.asdict(Thresholds()) == expected


def test_thresholds_from_config_and_any_object() -> None:
    """from_config reads the four attributes off a Config or any object."""
    ns = types.SimpleNamespace(
        launch_bound_op_us=5,
        launch_bound_min_ops=10,
        input_bound_share=0.3,
        compute_bound_top2_share=0.9,
    )
    actual = (Thresholds.from_config(Config()), Thresholds.from_config(ns))
    assert actual == (Thresholds(), Thresholds(5.0, 10, 0.3, 0.9))


# --- properties ----------------------------------------------------------------------------

times = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
shares = st.floats(min_value=0.01, max_value=1.0)


@st.composite
def calls(draw: st.DrawFn) -> CallSummary:
    """Random calls: op rows (maybe an other row), nested scopes, maybe a device."""
    names = draw(st.lists(st.text("abcxyz:", min_size=1, max_size=8), max_size=6, unique=True))
    rows = [
        op(n, draw(st.integers(0, 5000)), draw(times), draw(times), kernel=draw(st.booleans()))
        for n in names
    ]
    if draw(st.booleans()):
        rows.append(op("other", draw(st.integers(0, 5000)), draw(times), draw(times), other=True))
    root = scope("root", draw(times), ops=rows)
    parents = draw(st.lists(st.integers(0, 5), max_size=5))
    regions = [
        region(f"r{i}", draw(times), i + 1, parent=min(p, i), cpu=draw(times))
        for i, p in enumerate(parents)
    ]
    return call(root, *regions, device=draw(st.booleans()))


@st.composite
def thresholds(draw: st.DrawFn) -> Thresholds:
    """Random valid thresholds."""
    return Thresholds(
        draw(st.floats(0.01, 1000.0)), draw(st.integers(1, 10000)), draw(shares), draw(shares)
    )


@given(calls(), thresholds())
def test_property_verdict_and_shares_are_well_formed(c: CallSummary, th: Thresholds) -> None:
    """The verdict is one of the four, the reason one line, every share in [0, 1]."""
    d = diagnose(c, th)
    share_keys = [k for k in d.figures if k.endswith("_share") or k == "margin"]
    in_range = all(0.0 <= d.figures[k] <= 1.0 for k in share_keys)
    assert d.confidence in ("low", "medium", "high")
    assert (d.verdict in VERDICTS, "\n" in d.reason, bool(d.reason), in_range) == (
        True,
        False,
        True,
        True,
    )


@given(calls(), thresholds())
def test_property_amdahl_is_sorted_and_bounded(c: CallSummary, th: Thresholds) -> None:
    """Amdahl entries: at most five, f descending in [0, 1), speed-up 1/(1-f) >= 1."""
    entries = list(diagnose(c, th).amdahl)
    fs = [f for _, f, _ in entries]
    ok = all(0.0 <= f < 1.0 and s >= 1.0 and s == 1 / (1 - f) for _, f, s in entries)
    assert (len(entries) <= 5, fs == sorted(fs, reverse=True), ok) == (True, True, True)


@given(calls(), thresholds(), shares)
def test_property_raising_input_share_never_creates_input_bound(
    c: CallSummary, th: Thresholds, higher: float
) -> None:
    """Raising input_bound_share never turns a non-input-bound call into an input-bound one."""
    low, high = sorted((th.input_bound_share, higher))
    before = diagnose(c, dataclasses.replace(th, input_bound_share=low)).verdict
    after = diagnose(c, dataclasses.replace(th, input_bound_share=high)).verdict
    assert not (before != "input-bound" and after == "input-bound")


@given(st.floats(0.0, 1.0), st.floats(1.0, 1e6))
def test_property_amdahl_speedup_between_one_and_limit(f: float, s: float) -> None:
    """A speed-up s of fraction f gives an overall speed-up in [1, min(s, 1/(1-f))]."""
    overall = amdahl_speedup(f, s)
    limit = amdahl_speedup(f, math.inf)
    assert (overall >= 1.0 - 1e-12, overall <= min(s, limit) * (1 + 1e-12)) == (True, True)


@st.composite
def mixed_calls(draw: st.DrawFn) -> CallSummary:
    """Host calls mixing tiny rows (mean <= 20 µs per event) and heavy ones, with glue."""
    tiny = [
        op(f"t{i}", n, n * draw(st.floats(0.1, 20.0)))
        for i, n in enumerate(draw(st.lists(st.integers(1, 3000), min_size=1, max_size=4)))
    ]
    heavy = [
        op(f"h{i}", n, n * draw(st.floats(20.5, 5000.0)))
        for i, n in enumerate(draw(st.lists(st.integers(1, 20), max_size=3)))
    ]
    rows = sorted([*tiny, *heavy], key=lambda r: r.self_cpu_us, reverse=True)
    op_us = sum(r.self_cpu_us for r in rows)
    return call(scope("f", op_us + draw(st.floats(0.0, 100_000.0)), ops=rows))


@given(mixed_calls())
def test_property_launch_bound_never_while_heavy_ops_take_most(c: CallSummary) -> None:
    """A launch-bound call: the rows heavier than ``launch_bound_op_us`` per event take at most
    half of the time in and between ops (op time plus the glue that is not input)."""
    d = diagnose(c, DEFAULT)
    f = d.figures
    glue = f["wall_us"] * (f["outside_ops_share"] - f["input_share"])
    heavy = sum(r.self_cpu_us for r in c.root.ops if r.self_cpu_us > 20.0 * r.count)
    launch = d.verdict == "launch-bound"
    assert not launch or heavy <= 0.5 * (f["op_self_us"] + glue) * (1 + 1e-9)
