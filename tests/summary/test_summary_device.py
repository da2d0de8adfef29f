"""The device code path on CPU: fake CUDA events through the summary builder and the diagnosis.

Fake events mimic torch's ``FunctionEvent`` as the profiler parses a CUDA window: an aten op
(``linked_correlation_id == 0``) launches kernels through a runtime call
(``cudaLaunchKernel``, a CPU event linked to the op), and each kernel (a ``DeviceType.CUDA``
event) is linked to the aten op's id. The runtime calls' own ids come from another counter,
so one of them may equal an aten op's id; torch ignores that, and so must the summary.
"""

from __future__ import annotations

import types
from typing import Any

from torch.autograd import DeviceType

from profkit._config import Config
from profkit._model import CallSummary
from profkit._records import CallRecord, Policy, ScopeRecord
from profkit._summary.builder import build_calls
from profkit._summary.diagnosis import Thresholds, diagnose

TRACE_START_NS = 1_700_000_000_000_000_000
THREAD = 1


def event(
    name: str,
    start_us: float,
    end_us: float,
    *,
    id: int = 0,
    linked: int = 0,
    self_cpu: float = 0.0,
    device_us: float = 0.0,
    device: bool = False,
    user: bool = False,
) -> Any:
    """One fake ``FunctionEvent``: times are µs since the trace start.

    A CPU op's ``device_us`` mirrors its kernels' time as torch reports it; a kernel's is its
    own duration.
    """
    return types.SimpleNamespace(
        name=name,
        thread=THREAD,
        time_range=types.SimpleNamespace(start=start_us, end=end_us),
        device_type=DeviceType.CUDA if device else DeviceType.CPU,
        is_user_annotation=user,
        id=id,
        linked_correlation_id=linked,
        self_cpu_time_total=self_cpu,
        cpu_time_total=self_cpu,
        self_device_time_total=device_us,
        device_time_total=device_us,
        self_cpu_memory_usage=0,
        self_device_memory_usage=0,
        flops=0,
        input_shapes=None,
    )


def summarise(label: str, wall_us: float, events: list[Any]) -> CallSummary:
    """Build the one call of a window whose root scope spans [0, wall_us] µs."""
    start_ns, end_ns = TRACE_START_NS, TRACE_START_NS + round(wall_us * 1000)
    scope = ScopeRecord(label, -1, {}, None, 0, start_ns, end_ns)
    record = CallRecord(
        None, 0, Policy.SAMPLER, False, None, "MainThread", [scope], sampler="every"
    )  # type: ignore[arg-type]
    mark = event(label, 0.0, wall_us, id=10_000, user=True)
    (call,) = build_calls(
        1,
        [record],
        [mark, *events],
        TRACE_START_NS,
        top_k=10,
        by_shapes=False,
        all_threads=False,
        limit=256,
        max_attributes=64,
    )
    return call


def matmul_events() -> list[Any]:
    """A matmul and an add on the GPU, then a synchronize; plus another call's kernel."""
    return [
        event("aten::mm", 100, 300, id=5, self_cpu=150, device_us=400),
        event("cudaLaunchKernel", 150, 160, id=77, linked=5, self_cpu=10),
        event("sgemm_128x64_tn", 200, 600, id=77, linked=5, device=True, device_us=400),
        event("aten::add", 400, 420, id=6, self_cpu=15, device_us=50),
        # a runtime call whose own id (5) equals aten::mm's: it must not claim sgemm again
        event("cudaLaunchKernel", 405, 410, id=5, linked=6, self_cpu=5),
        event("add_kernel", 610, 660, id=5, linked=6, device=True, device_us=50),
        event("cudaDeviceSynchronize", 620, 990, id=78, self_cpu=370),
        # launched by an op outside this call
        event("other_kernel", 700, 800, id=90, linked=99, device=True, device_us=100),
    ]


def test_kernels_join_their_launching_op_once() -> None:
    """Kernel rows are flagged, counted once, and only this call's kernels are taken."""
    call = summarise("step", 1000, matmul_events())
    kernels = {r.name: (r.count, r.self_device_us) for r in call.root.ops if r.is_kernel}
    assert {"sgemm_128x64_tn": (1, 400.0), "add_kernel": (1, 50.0)} == kernels


def test_device_totals_count_kernels_only() -> None:
    """Scope device time sums kernels (torch's "Self CUDA total"), not the ops mirroring them."""
    call = summarise("step", 1000, matmul_events())
    actual = (call.device_active, call.root.self_device_us, call.root.op_count)
    assert (True, 450.0, 5) == actual
    assert 550.0 == call.root.self_cpu_us


def test_cpu_op_rows_keep_torch_device_times() -> None:
    """A CPU op's row keeps the device time torch reports for it (its kernels')."""
    call = summarise("step", 1000, matmul_events())
    rows = {r.name: r.self_device_us for r in call.root.ops if not r.is_kernel}
    assert (400.0, 50.0) == (rows["aten::mm"], rows["aten::add"])


def test_matmul_on_device_is_compute_bound_by_kernel_time() -> None:
    """Diagnosed from the built summary: compute-bound, ranked by kernel device time."""
    d = diagnose(summarise("step", 1000, matmul_events()), Thresholds())
    expected = {"device_busy_us": 450.0, "device_idle_share": 0.55, "top1_share": 400 / 450}
    assert expected == {k: d.figures[k] for k in expected}
    reason = "sgemm_128x64_tn and add_kernel take 100% of device kernel time"
    assert ("compute-bound", reason) == (d.verdict, d.reason)
    assert ("kernel:sgemm_128x64_tn", 0.4) == d.amdahl[0][:2]


def tiny_kernel_loop(n: int) -> list[Any]:
    """``n`` adds back to back, each launching a 2 µs kernel: the GPU mostly waits."""
    events = []
    for i in range(n):
        t0 = 10 + 20 * i
        op_id, corr = 1000 + i, i + 1
        events += [
            event("aten::add", t0, t0 + 8, id=op_id, self_cpu=4, device_us=2),
            event("cudaLaunchKernel", t0 + 2, t0 + 6, id=corr, linked=op_id, self_cpu=4),
            event("add_kernel", t0 + 7, t0 + 9, id=corr, linked=op_id, device=True, device_us=2),
        ]
    return events


def test_tiny_kernel_loop_on_device_is_launch_bound() -> None:
    """300 adds with 2 µs kernels: device idle 90%, yet launch-bound, not input-bound."""
    call = summarise("loop", 6020, tiny_kernel_loop(300))
    d = diagnose(call, Thresholds.from_config(Config()))
    figures = {k: round(d.figures[k], 6) for k in ("op_count", "median_op_us", "input_share")}
    assert {"op_count": 600.0, "median_op_us": 4.0, "input_share": 0.0} == figures
    assert (600.0, "launch-bound") == (call.root.self_device_us, d.verdict)
    assert round(d.figures["device_idle_share"], 6) == round(1 - 600 / 6020, 6)
