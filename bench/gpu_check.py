"""GPU check of the diagnosis: device times and kernel rows through the whole profkit pipeline.

Profiles three CUDA workloads with ``activities="cpu,cuda"`` and ``sample_every=1`` and checks
what profkit made of each sampled call:

* ``gpu_launch_loop``: 2,000 ``t = t + 1`` on a 4-element CUDA tensor -> **launch-bound**
  (thousands of microsecond kernels; the GPU idles between launches).
* ``gpu_matmul``: ten 4096 x 4096 float32 matmuls, then a synchronize -> **compute-bound**
  (one GEMM kernel takes nearly all device time).
* ``gpu_input``: 20 ms of "preprocessing" (a sleep) in a region, then a small model on the
  GPU -> **input-bound** (the device idles while the host prepares input).

For every call it prints the verdict and reason, the deciding figures (device busy time,
device idle share, input share, median op time, top-two share), the kernel rows
(``OpRow.is_kernel``) with their device self time, and the root scope's device and CPU
totals. It also checks that kernel rows exist, that the scope's device total is the sum of
its kernels (not doubled by the CPU ops that mirror them), and compares that total with
torch's own "Self CUDA time total" for the same workload profiled by ``torch.profiler``
alone (a loose check: two different runs).

Exit status: 0 all checks passed; 1 a check failed (each failure is printed); 2 CUDA is not
available, nothing was checked (the message starts with "CUDA not available"), so that a CI
step can tell "skipped" from "failed".

    python bench/gpu_check.py [--calls N]

Status: written and exercised on CPU only (where it exits 2); it has not yet been run on a
GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import profkit
from profkit._model import CallSummary
from profkit.testing import capture

EXIT_OK, EXIT_FAILED, EXIT_NO_CUDA = 0, 1, 2
LOOP_OPS = 2000
MATMUL_N = 4096
MATMULS = 10


def _workloads() -> dict[str, tuple[Callable[[], Any], str]]:
    """The three workloads (profiled functions) and the verdict each call must get."""
    dev = torch.device("cuda")
    a = torch.randn(MATMUL_N, MATMUL_N, device=dev)
    b = torch.randn(MATMUL_N, MATMUL_N, device=dev)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    ).to(dev)
    request = torch.randn(1, 64)

    @profkit.profiled("gpu_launch_loop")
    def gpu_launch_loop() -> torch.Tensor:
        t = torch.zeros(4, device=dev)
        for _ in range(LOOP_OPS):
            t = t + 1
        torch.cuda.synchronize()
        return t

    @profkit.profiled("gpu_matmul")
    def gpu_matmul() -> torch.Tensor:
        c = a
        for _ in range(MATMULS):
            c = a @ b
        torch.cuda.synchronize()
        return c

    @profkit.profiled("gpu_input")
    def gpu_input() -> torch.Tensor:
        with profkit.region("preprocess"):
            time.sleep(0.02)
            x = request.to(dev)
        with profkit.region("model"), torch.no_grad():
            out: torch.Tensor = model(x)
        torch.cuda.synchronize()
        return out

    return {
        "gpu_launch_loop": (gpu_launch_loop, "launch-bound"),
        "gpu_matmul": (gpu_matmul, "compute-bound"),
        "gpu_input": (gpu_input, "input-bound"),
    }


def _torch_self_cuda_total(fn: Callable[[], Any]) -> float:
    """torch's own "Self CUDA time total" (µs) for one call of ``fn``, profiled directly."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        fn()
    return float(
        sum(
            e.self_device_time_total
            for e in prof.events()
            if str(e.device_type) != "DeviceType.CPU"
        )
    )


def _report(call: CallSummary, expected: str, reference_us: float) -> list[str]:
    """Print one call's diagnosis, figures and kernel rows; return the failed checks."""
    d = call.diagnosis
    root = call.root
    print(f"\n== {call.label}: {d.verdict if d else None} (expected {expected})")
    if d is None:
        return [f"{call.label}: no diagnosis"]
    print(f"   reason : {d.reason}")
    print("   figures: " + ", ".join(f"{k}={v:.3f}" for k, v in d.figures.items()))
    print(f"   amdahl : {[(w, round(f, 3)) for w, f, _ in d.amdahl]}")
    print(
        f"   root   : wall {root.duration_us:.1f} us, self cpu {root.self_cpu_us:.1f} us, "
        f"self device {root.self_device_us:.1f} us, {root.op_count} host ops, "
        f"device_active={call.device_active}"
    )
    print(f"   torch  : Self CUDA time total of a separate run {reference_us:.1f} us")
    kernels = [r for r in root.ops if r.is_kernel]
    for r in kernels:
        print(f"   kernel : {r.name[:60]:<60} x{r.count:<5} {r.self_device_us:10.1f} us")
    for r in (r for r in root.ops if not r.is_kernel):
        print(
            f"   op     : {r.name[:60]:<60} x{r.count:<5} cpu {r.self_cpu_us:9.1f} us"
            f"  device {r.self_device_us:9.1f} us"
        )
    failures = []
    if d.verdict != expected:
        failures.append(f"{call.label}: verdict {d.verdict!r}, expected {expected!r}")
    if not call.device_active or not kernels:
        failures.append(f"{call.label}: no kernel rows (is CUPTI available to the profiler?)")
    kernel_sum = sum(r.self_device_us for r in root.ops if r.is_kernel or r.is_other)
    if root.self_device_us <= 0.0 or root.self_device_us > kernel_sum * 1.001 + 1e-6:
        failures.append(
            f"{call.label}: scope device time {root.self_device_us:.1f} us is not the sum "
            f"of its kernels (<= {kernel_sum:.1f} us)"
        )
    if reference_us > 0 and not 0.5 <= root.self_device_us / reference_us <= 2.0:
        failures.append(
            f"{call.label}: device time {root.self_device_us:.1f} us is far from torch's "
            f"{reference_us:.1f} us"
        )
    return failures


def main(argv: list[str] | None = None) -> int:
    """Run the check; returns the exit status (see the module docstring)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3, help="sampled calls per workload")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            f"CUDA not available (torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda}): bench/gpu_check.py needs an NVIDIA GPU; nothing was checked."
        )
        return EXIT_NO_CUDA
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    workloads = _workloads()
    for fn, _ in workloads.values():  # warm up CUDA, cuBLAS and the allocator, unprofiled
        fn()
    references = {name: _torch_self_cuda_total(fn) for name, (fn, _) in workloads.items()}
    failures: list[str] = []
    with capture(sample_every=1, activities="cpu,cuda", top_k=10) as cap:
        for name, (fn, _) in workloads.items():
            for _ in range(args.calls):
                fn()
                if not profkit.force_flush(60.0):
                    failures.append(f"{name}: flush timed out")
    for call in cap.calls:
        _, expected = workloads[call.label]
        failures += _report(call, expected, references[call.label])
    if len(cap.calls) != args.calls * len(workloads):
        failures.append(f"{len(cap.calls)} calls summarised, expected {args.calls * 3}")
    print(f"\nstats: {cap.stats}")
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return EXIT_FAILED
    print("\nOK: every call got its verdict, with kernel rows and device times")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
