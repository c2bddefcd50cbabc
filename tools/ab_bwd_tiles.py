"""The backward's Gluon tiles at head dim 64, A/B in one process: the dK/dV kernel's query rows per block
(``dkdv.block_m``) and the dQ kernel's keys per block and stages (``dq.tiles``), each variant timed as
tools/bench.py times a backward (``do_bench`` medians of interleaved rounds, one stored output), with FA4
beside them, and each variant's gradients compared with the first variant's:

    python tools/ab_bwd_tiles.py --out OUT/ab --rounds 3

A variant is ``name=dkdv_rows:dq_keys:dq_stages``; ``--variants`` replaces the default list.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (tools/bench.py)

VARIANTS = "m32-n64s2=32:64:2,m64-n64s2=64:64:2,m64-n64s3=64:64:3,m64-n64s4=64:64:4"


def shapes():
    base = bench.make_shapes()
    s5 = base["S5"]
    return {
        "S5": s5,
        "S5c": dict(s5, desc=s5["desc"] + " causal", causal=True),
        "S4b64": dict(desc="dense B=8 L=4096 H=16 causal, head dim 64", lq=np.full(8, 4096), lk=np.full(8, 4096),
                      H=16, causal=True, bq=False, D=64),
    }


def patched(rows, keys, stages):
    """The two host functions that pick the tiles, replaced for one variant (restored by the caller)."""
    from kernels.gluon import dkdv, dq
    saved = (dkdv.block_m, dq.tiles)
    dkdv.block_m = lambda head_d: rows
    dq.tiles = lambda head_d: (keys, stages)
    return saved


def restore(saved):
    from kernels.gluon import dkdv, dq
    dkdv.block_m, dq.tiles = saved


def grads(make, shape, tensors, d_out):
    q, k, v, cu_q, cu_k = tensors
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = make(shape, q, k, v, cu_q, cu_k)()
    return torch.autograd.grad(out, (q, k, v), d_out)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tools/ab_bwd_tiles.py")
    ap.add_argument("--out", default="ab")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default=VARIANTS)
    ap.add_argument("--shapes", default="S5,S5c,S4b64")
    ap.add_argument("--no-fa4", action="store_true")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    variants = {}
    for item in a.variants.split(","):
        name, spec = item.split("=")
        variants[name] = tuple(int(x) for x in spec.split(":"))
    table = {s: shapes()[s] for s in a.shapes.split(",")}
    rows = []
    for sname, shape in table.items():
        tensors = bench.build(shape, shape.get("D", 128))
        impls = ([] if a.no_fa4 else ["fa4"]) + list(variants)
        rec = {n: dict(shape=sname, impl=n, bwd_ms_rounds=[]) for n in impls}
        first = None
        d_out = None
        for rnd in range(a.rounds):
            for n in impls:
                saved = patched(*variants[n]) if n in variants else None
                try:
                    bench.warm_clocks()
                    make = bench.IMPLS["fa4" if n == "fa4" else "triton-plan"]
                    _, tb, out = bench.time_impl(make, shape, tensors)
                    rec[n]["bwd_ms_rounds"].append(tb)
                    if rnd == 0 and n in variants:
                        if d_out is None:
                            d_out = torch.randn_like(out)
                        g = grads(make, shape, tensors, d_out)
                        if first is None:
                            first = g
                        rec[n]["max_abs_diff_vs_first"] = [float((x.float() - y.float()).abs().max())
                                                           for x, y in zip(g, first)]
                        rec[n]["finite"] = all(bool(torch.isfinite(x).all()) for x in g)
                except Exception as e:  # report and go on
                    rec[n]["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                finally:
                    if saved:
                        restore(saved)
                print(json.dumps(rec[n]), flush=True)
                torch.cuda.empty_cache()
        for n in impls:
            r = rec[n]
            if r["bwd_ms_rounds"]:
                r["bwd_ms"] = float(np.median(r["bwd_ms_rounds"]))
            rows.append(r)
        del tensors
        with open(os.path.join(a.out, "ab_bwd_tiles.json"), "w") as fh:
            json.dump(rows, fh, indent=1)
    print("| shape | impl | bwd ms (median) | rounds | vs fa4 | max |dq|,|dk|,|dv| diff vs first |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        fa4 = next((x.get("bwd_ms") for x in rows if x["shape"] == r["shape"] and x["impl"] == "fa4"), None)
        ms = r.get("bwd_ms")
        ratio = f"{fa4 / ms:.2f}x" if fa4 and ms else ""
        print(f"| {r['shape']} | {r['impl']} | {ms if ms is None else round(ms, 3)} | "
              f"{[round(x, 3) for x in r['bwd_ms_rounds']]} | {ratio} | {r.get('max_abs_diff_vs_first', r.get('error', ''))} |")


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"{time.time() - t0:.0f} s")
