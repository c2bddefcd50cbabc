"""Config sweep for the Triton JFA kernels on the GPU (prints a table, writes json).

    python -m kernels.sweep [--out DIR] [--shapes S1,S1c,S2]
"""
import argparse
import json
import os

import torch
from triton.testing import do_bench

from kernels import jfa
from kernels.bench import build, make_shapes, visible_pairs

FWD = [(128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 4), (64, 128, 4, 2)]
KV = [(64, 128, 8, 2), (32, 128, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 128, 8, 3), (32, 64, 4, 3)]
KVF = [(64, 128, 8, 2), (64, 64, 4, 3), (32, 128, 4, 3), (64, 128, 8, 3), (128, 64, 8, 2)]
Q = [(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 8, 3), (128, 128, 8, 2), (64, 128, 4, 2)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "sweep_out"))
    ap.add_argument("--shapes", default="S1,S1c,S2")
    ap.add_argument("--kinds", default="fwd,kv,q")
    ap.add_argument("--fwd", default="", help="fwd configs, e.g. 64,64,4,3;128,64,8,3")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    shapes = make_shapes()
    res = []
    for sn in a.shapes.split(","):
        sh = shapes[sn]
        flops = 4.0 * 128 * sh["H"] * visible_pairs(sh["lq"], sh["lk"], sh["causal"], sh["bq"])
        q, k, v, cu_q, cu_k = build(sh)
        q.requires_grad_(); k.requires_grad_(); v.requires_grad_()
        mq, mk = int(sh["lq"].max()), int(sh["lk"].max())

        def f():
            return jfa.jagged_flash_attention(q, k, v, cu_q, cu_k, mq, mk, causal=sh["causal"],
                                              broadcast_q=sh["bq"])[0]
        fwd_list = [tuple(int(x) for x in c.split(",")) for c in a.fwd.split(";")] if a.fwd else FWD
        for kind, lst in (("fwd", fwd_list), ("kv", KV), ("kvf", KVF), ("q", Q)):
            if kind not in a.kinds.split(","):
                continue
            for cfg in lst:
                jfa.CONFIG_OVERRIDE.clear()
                jfa.CONFIG_OVERRIDE[kind] = cfg
                jfa.BWD_DQ_MODE = "atomic" if kind == "kvf" else "separate"
                try:
                    if kind == "fwd":
                        with torch.no_grad():
                            t = do_bench(f, warmup=20, rep=60, return_mode="median")
                        tf = flops / t * 1e-9
                    else:
                        out = f()
                        do = torch.randn_like(out)
                        t = do_bench(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True),
                                     warmup=20, rep=60, return_mode="median")
                        tf = 2.5 * flops / t * 1e-9
                    r = dict(shape=sn, kind=kind, cfg=cfg, ms=t, tflops=tf)
                except Exception as e:
                    r = dict(shape=sn, kind=kind, cfg=cfg, error=f"{type(e).__name__}: {str(e)[:200]}")
                res.append(r)
                print(json.dumps(r), flush=True)
        jfa.CONFIG_OVERRIDE.clear()
        jfa.BWD_DQ_MODE = "separate"
        del q, k, v
        torch.cuda.empty_cache()
    with open(os.path.join(a.out, "sweep.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    # best config per kernel kind: lowest geometric-mean time over the swept shapes
    import math
    best = {}
    for kind in {r["kind"] for r in res}:
        cands = {}
        for r in res:
            if r["kind"] == kind:
                cands.setdefault(tuple(r["cfg"]), []).append(r.get("ms", float("inf")))
        n = max(len(v) for v in cands.values())
        ok = {c: math.exp(sum(math.log(t) for t in v) / len(v)) for c, v in cands.items()
              if len(v) == n and all(math.isfinite(t) for t in v)}
        if ok:
            best[kind] = list(min(ok, key=ok.get))
    with open(os.path.join(a.out, "best.json"), "w") as fh:
        json.dump(best, fh)
    print("best:", best)
    print("| shape | kernel | BM,BN,warps,stages | ms | TFLOP/s |")
    print("|---|---|---|---|---|")
    for r in res:
        if "error" in r:
            print(f"| {r['shape']} | {r['kind']} | {r['cfg']} | err | {r['error'][:60]} |")
        else:
            print(f"| {r['shape']} | {r['kind']} | {r['cfg']} | {r['ms']:.3f} | {r['tflops']:.0f} |")


if __name__ == "__main__":
    main()
