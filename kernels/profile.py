"""Run one bench shape's forward (or forward + backward) a few times inside a CUDA profiler range, so
Nsight Compute / Nsight Systems capture only those launches, after the compiles and a warm-up:

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python -m kernels.profile --shape S3L --impl triton

``--impl`` names an implementation of ``kernels.bench`` (its switches apply, e.g. ``triton-gluon``).
Prints the shape, the implementation and the paths that ran; ``--kernel-times`` instead records the
profiled calls with torch.profiler and prints each kernel's GPU time (no Nsight needed).  ``--rounds N``
times N rounds as the benchmark does (a fresh implementation each round, do_bench medians) and prints one
line per round with each kernel's mean GPU time over ``--iters`` profiled calls: which kernel a slow
round loses its time in.
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
    ap.add_argument("--rounds", type=int, default=0, help="rounds of fresh set-up, timing and kernel times")
    ap.add_argument("--host", action="store_true",
                    help="host time per forward and per backward call (no synchronization between calls), and "
                         "cProfile's top functions of the backward calls")
    ap.add_argument("--calls", type=int, default=50, help="calls per measurement of --host")
    a = ap.parse_args(argv)
    for name, least in (("iters", 1), ("rounds", 0), ("calls", 1)):
        if getattr(a, name) < least:
            raise SystemExit(f"--{name} must be at least {least}, got {getattr(a, name)}")
    shapes = bench.make_shapes()
    if a.shape not in shapes:
        raise SystemExit(f"--shape must be one of {sorted(shapes)}, got {a.shape!r}")
    if a.impl not in bench.IMPLS:
        raise SystemExit(f"--impl must be one of {sorted(bench.IMPLS)}, got {a.impl!r}")
    shape = shapes[a.shape]
    if a.rounds:
        return rounds(a, shape)
    if a.host:
        return host_times(a, shape)
    q, step = _step(a, shape, bench.build(shape))
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
        paths += f"; backward {jfa.last_backward_paths()}"
    print(f"profiled {a.iters} x {'fwd+bwd' if a.backward else 'fwd'} of {a.shape} ({shape['desc']}) with "
          f"{a.impl}; {paths}", flush=True)


def _step(a, shape, tensors):
    """(q, step): one call of the implementation on fresh leaves of ``tensors``, forward and (--backward)
    the backward of its output with a fixed random dO, as in the benchmark."""
    q, k, v, cu_q, cu_k = tensors
    q, k, v = (t.detach().requires_grad_(a.backward) for t in (q, k, v))
    fwd = bench.IMPLS[a.impl](shape, q, k, v, cu_q, cu_k)
    do = None

    def step():
        nonlocal do
        with torch.set_grad_enabled(a.backward):
            out = fwd()
            if a.backward:
                do = torch.randn_like(out) if do is None else do
                torch.autograd.grad(out, (q, k, v), do)
    return q, step


def _synchronize(t):
    if t.is_cuda:
        torch.cuda.synchronize(t.device)


def kernel_times(step, iters, device_tensor):
    """{kernel name: mean GPU ms per call} over ``iters`` calls of ``step`` (torch.profiler; empty off a GPU)."""
    if not device_tensor.is_cuda:
        for _ in range(iters):
            step()
        return {}
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        _synchronize(device_tensor)
    return {e.key: e.self_device_time_total / 1e3 / iters for e in prof.key_averages()
            if e.self_device_time_total > 0}


def rounds(a, shape):
    tensors = bench.build(shape)
    q = tensors[0]
    names, lines = [], []
    for i in range(a.rounds):
        t_f, t_b, _ = bench.time_impl(bench.IMPLS[a.impl], shape, tensors, backward=a.backward)
        _, step = _step(a, shape, tensors)
        step()  # draws dO outside the profiled calls
        times = kernel_times(step, a.iters, q)
        names += [n for n in sorted(times, key=times.get, reverse=True) if n not in names]
        lines.append((i, t_f, t_b, times))
    print(f"{a.rounds} rounds of {a.shape} ({shape['desc']}) with {a.impl}: do_bench medians (ms), then each "
          f"kernel's mean GPU time per call (ms) over {a.iters} profiled calls")
    short = [n[:24] for n in names[:8]]
    print("round   fwd ms   bwd ms | " + " | ".join(f"{n:>24}" for n in short))
    for i, t_f, t_b, times in lines:
        print(f"{i:5d} {t_f:8.3f} {t_b:8.3f} | " + " | ".join(f"{times.get(n, 0.0):24.3f}" for n in names[:8]),
              flush=True)


def host_times(a, shape):
    """What a call costs the host: the launches are queued without waiting, so while the GPU queue has room
    the wall time of ``calls`` calls is the host's.  A backward whose host time nears its GPU time leaves
    the GPU idle between kernels whenever the host runs slower."""
    import cProfile
    import pstats
    import time
    q, k, v, cu_q, cu_k = (t.detach() for t in bench.build(shape))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    calls = a.calls
    fwd = bench.IMPLS[a.impl](shape, q, k, v, cu_q, cu_k)
    out = fwd()
    do = torch.randn_like(out)

    def bwd():
        torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    for _ in range(3):
        fwd()
        bwd()
    rows = []
    for name, fn in (("forward", fwd), ("backward", bwd)):
        _synchronize(q)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host = (time.perf_counter() - t0) / calls
        _synchronize(q)
        wall = (time.perf_counter() - t0) / calls
        rows.append(f"{name}: host {host * 1e3:.3f} ms per call, host + GPU {wall * 1e3:.3f} ms per call")
    _synchronize(q)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        bwd()
    prof.disable()
    _synchronize(q)
    print(f"{a.shape} ({shape['desc']}) with {a.impl}, {calls} calls each:")
    print("\n".join(rows))
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
