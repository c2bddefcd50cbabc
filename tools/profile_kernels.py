"""One bench shape's calls inside a CUDA profiler range, so that Nsight Compute sees only those launches
(after the compiles and a warm-up), or each kernel's GPU time from torch.profiler:

    ncu --profile-from-start off --csv --metrics gpu__time_duration.sum,... \\
        python tools/profile_kernels.py --shape S1 --impl triton-plan --direction bwd
    python tools/profile_kernels.py --shape S1 --impl fa4 --direction bwd --kernel-times

``--impl`` and ``--shape`` name an implementation and a shape of ``tools/bench.py``; ``--direction`` picks
what the profiled calls run: the forward, the backward of one stored output (as the bench times it), or
both. ``tools/gpu_check.sh OUT ncu`` runs it for the backward of FA4 and triton-jfa on S1, S4b and S5.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (tools/bench.py)

DIRECTIONS = ("fwd", "bwd", "both")


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="tools/profile_kernels.py")
    ap.add_argument("--shape", default="S1", help="a tools/bench.py shape (S3s<seed> for another S3 draw)")
    ap.add_argument("--impl", default="triton-plan", help=f"one of {', '.join(bench.IMPLS)}")
    ap.add_argument("--direction", default="bwd", choices=DIRECTIONS)
    ap.add_argument("--iters", type=int, default=1, help="profiled calls (default 1)")
    ap.add_argument("--kernel-times", action="store_true",
                    help="print each kernel's GPU time from torch.profiler instead of leaving it to Nsight")
    a = ap.parse_args(argv)
    if a.iters < 1:
        ap.error(f"--iters must be at least 1, got {a.iters}")
    if a.impl not in bench.IMPLS:
        ap.error(f"--impl must be one of {', '.join(bench.IMPLS)}, got {a.impl!r}")
    seeds = [int(a.shape[3:])] if a.shape.startswith("S3s") and a.shape[3:].isdigit() else []
    a.shapes = bench.make_shapes(seeds)
    if a.shape not in a.shapes:
        ap.error(f"--shape must be one of {', '.join(a.shapes)}, got {a.shape!r}")
    return a


def make_step(impl: str, shape: dict, tensors, direction: str):
    """One profiled step: the forward, the backward of one stored output with a fixed dO, or both."""
    q, k, v, cu_q, cu_k = tensors
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    fwd = bench.IMPLS[impl](shape, q, k, v, cu_q, cu_k)
    out = fwd()
    d_out = torch.randn_like(out)

    def step():
        if direction == "fwd":
            with torch.no_grad():
                fwd()
        elif direction == "both":
            torch.autograd.grad(fwd(), (q, k, v), d_out)
        else:
            torch.autograd.grad(out, (q, k, v), d_out, retain_graph=True)
    return step


def main(argv=None) -> int:
    a = parse(argv)
    shape = a.shapes[a.shape]
    step = make_step(a.impl, shape, bench.build(shape, shape.get("D", 128)), a.direction)
    for _ in range(3):  # compiles and warm-up, outside the profiled range
        step()
    torch.cuda.synchronize()
    if a.kernel_times:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(a.iters):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60))
    else:
        torch.cuda.cudart().cudaProfilerStart()
        for _ in range(a.iters):
            step()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled {a.iters} x {a.direction} of {a.shape} ({shape['desc']}) with {a.impl}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
