"""Run one bench shape's forward (or forward + backward) a few times inside a CUDA profiler range, so
Nsight Compute / Nsight Systems capture only those launches, after the compiles and a warm-up:

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python -m kernels.profile --shape S3L --impl triton

``--impl`` names an implementation of ``kernels.bench`` (its switches apply, e.g. ``triton-gluon``).
Prints the shape, the implementation and the paths that ran; ``--kernel-times`` instead records the
profiled calls with torch.profiler and prints each kernel's GPU time (no Nsight needed).
"""
from __future__ import annotations

import argparse

import torch

from kernels import bench


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="S3L", help="a kernels.bench shape name")
    ap.add_argument("--impl", default="triton", help="a kernels.bench implementation name")
    ap.add_argument("--iters", type=int, default=2, help="profiled calls")
    ap.add_argument("--backward", action="store_true", help="profile forward + backward")
    ap.add_argument("--kernel-times", action="store_true", help="print each kernel's GPU time (torch.profiler)")
    a = ap.parse_args(argv)
    shapes = bench.make_shapes()
    if a.shape not in shapes:
        raise SystemExit(f"--shape must be one of {sorted(shapes)}, got {a.shape!r}")
    if a.impl not in bench.IMPLS:
        raise SystemExit(f"--impl must be one of {sorted(bench.IMPLS)}, got {a.impl!r}")
    shape = shapes[a.shape]
    q, k, v, cu_q, cu_k = bench.build(shape)
    q, k, v = (t.requires_grad_(a.backward) for t in (q, k, v))
    fwd = bench.IMPLS[a.impl](shape, q, k, v, cu_q, cu_k)
    do = None  # random, as in the benchmark

    def step():
        nonlocal do
        with torch.set_grad_enabled(a.backward):
            out = fwd()
            if a.backward:
                do = torch.randn_like(out) if do is None else do
                torch.autograd.grad(out, (q, k, v), do)
    for _ in range(3):  # compile and warm up outside the profiled range
        step()
    cuda = q.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
    if a.kernel_times:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(a.iters):
                step()
            if cuda:
                torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=48))
    for _ in range(0 if a.kernel_times else a.iters):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    from kernels import jfa
    paths = f"forward path {jfa.LAST_FWD_PATH or '-'}"
    if a.backward:
        paths += f"; backward dK/dV {jfa.LAST_BWD_KV_PATH or '-'}, dQ {jfa.LAST_BWD_DQ_PATH or '-'}"
    print(f"profiled {a.iters} x {'fwd+bwd' if a.backward else 'fwd'} of {a.shape} ({shape['desc']}) with "
          f"{a.impl}; {paths}", flush=True)


if __name__ == "__main__":
    main()
