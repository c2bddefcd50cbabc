"""Where a plain ``jagged_flash_attention`` call spends its host time, piece by piece, on a GPU.

    python tools/host_costs.py [--shapes S3,S3s1,S3s2,S1] [--calls 300] [--out FILE.json]

Each row is microseconds per call of one piece of the forward's host path, submitted back to back without
waiting for the GPU (the GPU is idle or far behind, so these are the host's costs): the whole plain call (the
same offsets every call: the lists the first built are kept, kernels/reuse.py), a plain call that keeps
nothing (its lists built at every call), a JaggedPlan call, FA4's call where it is installed, then ``prepare`` (validation, paths, tile lists), the
tile-list builders alone, ``launch.forward`` on a prepared plan, and the primitives they are made of
(an allocation, a zeroed counter, a view, a TMA descriptor, an autograd Function, one Triton launch of the
order builder through ``kernel[grid](...)``).  bf16, D = 128, the bench's shapes (tools/bench.py).
"""
from __future__ import annotations

import argparse
import json

import torch


def per_call_us(fn, calls):
    import bench  # tools/bench.py, beside this file
    return round(bench.host_cost(fn, calls, count_launches=False)[0], 1)


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def pieces(shape, calls):
    import bench  # tools/bench.py, beside this file
    from kernels import Config, JaggedPlan, jagged_flash_attention, launch, schedule
    from kernels.gluon.pipeline import descriptor
    from kernels.plan import default_config, prepare
    from kernels.validation import validate

    q, k, v, cu_q, cu_k = bench.build(shape)
    args = (q, k, v, cu_q, cu_k, int(shape["lq"].max()), int(shape["lk"].max()))
    kw = dict(causal=shape["causal"], broadcast_q=shape["bq"])
    cfg = default_config(None)
    rows = {}
    with torch.no_grad():
        rows["plain call"] = per_call_us(lambda: jagged_flash_attention(*args, **kw), calls)
        fresh = Config(reuse_lists=False)  # every call builds its lists (the first call with new offsets)
        rows["plain call, nothing kept"] = per_call_us(lambda: jagged_flash_attention(*args, config=fresh, **kw), calls)
        plan = JaggedPlan(*args, **kw)
        rows["JaggedPlan call"] = per_call_us(lambda: plan(q, k, v), calls)
        try:
            fwd = bench.impl_fa4(shape, q, k, v, cu_q, cu_k)
            rows["FA4 call"] = per_call_us(fwd, calls)
        except Exception as exc:  # not installed here
            rows["FA4 call"] = f"{type(exc).__name__}: {exc}"[:120]

        def prep():
            return prepare(*args, shape["causal"], None, shape["bq"], cfg)
        rows["prepare (validation, paths, lists)"] = per_call_us(prep, calls)
        rows["validate"] = per_call_us(lambda: validate(*args, shape["bq"], None, read_offsets=False), calls)
        pq, pk, pv, pcu_q, pcu_k, lp = prep()
        rows["launch.forward on a prepared plan"] = per_call_us(
            lambda: launch.forward(pq, pk, pv, pcu_q, pcu_k, lp), calls)
        specs = [schedule.ListSpec(128, q.shape[1], side=schedule.KEYS_AT_LEAST, split=512),
                 schedule.ListSpec(128, q.shape[1], side=schedule.KEYS_BELOW, split=512)]
        rows["order_and_lists (1 launch up to 512 sequences, else 2)"] = per_call_us(
            lambda: schedule.order_and_lists(cu_q, cu_k, q.shape[0], k.shape[0], specs, causal=shape["causal"],
                                             broadcast=shape["bq"]), calls)
        rows["_arrays (one list's buffer and views)"] = per_call_us(
            lambda: schedule._arrays(specs[0], cu_k.shape[0] - 1, q.shape[0], k.shape[0], False, q.device), calls)
        rows["torch.empty int32 [4096]"] = per_call_us(
            lambda: torch.empty(4096, device=q.device, dtype=torch.int32), calls)
        rows["torch.empty out [rows, H, D] bf16"] = per_call_us(lambda: torch.empty_like(q), calls)
        rows["torch.zeros(1) int32 (a fill launch)"] = per_call_us(
            lambda: torch.zeros(1, device=q.device, dtype=torch.int32), calls)
        buf = torch.empty(4096, device=q.device, dtype=torch.int32)
        rows["a view buf[a:b]"] = per_call_us(lambda: buf[16:1024], calls)
        q2 = q.view(q.shape[0], -1)
        rows["TMA descriptor (gluon TensorDescriptor)"] = per_call_us(lambda: descriptor(q2, [64, q.shape[2]]), calls)
        x = torch.empty(4, device=q.device, requires_grad=True)
        rows["autograd Function.apply (identity)"] = per_call_us(lambda: _Identity.apply(x), calls)
        rows["torch.cuda.get_device_properties"] = per_call_us(
            lambda: torch.cuda.get_device_properties(q.device).multi_processor_count, calls)
        rows["torch.cuda.get_device_capability"] = per_call_us(lambda: torch.cuda.get_device_capability(q.device),
                                                               calls)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="S3,S3s1,S3s2,S1")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    import bench
    names = args.shapes.split(",")
    seeds = [int(n[3:]) for n in names if n.startswith("S3s")]
    shapes = bench.make_shapes(seeds)
    result = {"device": torch.cuda.get_device_name(), "calls": args.calls, "shapes": {}}
    for name in names:
        result["shapes"][name] = pieces(shapes[name], args.calls)
        print(f"## {name}: {shapes[name]['desc']}")
        for piece, us in result["shapes"][name].items():
            print(f"  {piece:45s} {us}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
