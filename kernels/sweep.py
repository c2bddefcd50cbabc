"""Config sweep for the Triton JFA kernels on the GPU (prints a table, writes json).

    python -m kernels.sweep [--out DIR] [--shapes S1,S1c,S2] [--kinds fwd,kv,q]
                            [--fwd "BM,BN,W,S;..."] [--fwd-tma off|on|both] [--fwd-adv off|on|both]
                            [--fwd-ws off|on|both] [--kv "BM,BN,W,S;..."]

--fwd-tma / --fwd-adv time the forward with K/V loaded through TMA
descriptors (jfa.FWD_TMA) / with advanced pointer tiles (jfa.FWD_PTR_ADVANCE);
the "path" column is the path that actually ran (jfa.LAST_FWD_PATH: a layout
TMA cannot describe falls back to "ptr").  With TMA on, the default forward
list adds the larger tiles worth trying with TMA on Hopper.  --fwd-ws asks for
Triton's automatic warp specialization of the forward's key loop
(jfa.FWD_WARP_SPECIALIZE; "+ws" in the path column).  Every forward row also
records "maxdiff", the largest difference from the shipped forward's output on
the same inputs, so a variant that is fast but wrong shows; backward rows (kinds
kv, kvf, q) record the largest difference from the shipped configuration's
dQ / dK / dV for the same output gradient.  Kind "gluon" times
the Gluon forward (kernels/gluon_fwd.py) over its configs, with the same column.
"""
import argparse
import json
import os

import torch
from triton.testing import do_bench

from kernels import jfa
from kernels.bench import build, make_shapes, visible_pairs

FWD = [(128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 4), (64, 128, 4, 2)]
# TMA frees the registers the address tiles held: larger tiles may now pay
FWD_TMA = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 4, 4)]
KV = [(64, 128, 8, 2), (32, 128, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 128, 8, 3), (32, 64, 4, 3),
      # v15: the shipped (32, 64, 4, 3) issues on 37% of cycles with two warps per scheduler (Nsight); two
      # warp groups per 128 keys, a shallower ring (less shared memory) and 16-row blocks (no spills when
      # compiled for sm_90, against 184 bytes) are untimed
      (32, 128, 8, 3), (32, 128, 8, 2), (32, 64, 4, 2), (16, 64, 4, 3), (16, 64, 4, 4),
      # v16: none of the above beat the shipped one; two warp groups on 64 keys (half the dK / dV accumulator
      # per thread, four warps per scheduler at two CTAs) and a deeper ring
      (32, 64, 8, 3), (64, 64, 8, 3), (32, 64, 8, 2), (32, 64, 4, 4)]
KVF = [(64, 128, 8, 2), (64, 64, 4, 3), (32, 128, 4, 3), (64, 128, 8, 3), (128, 64, 8, 2)]
# the Gluon forward (jfa.FWD_KERNEL = "gluon"): (BM, BN, warps per consumer group, stages, schedule)
GLUON = [(128, 128, 4, 2, "overlap"), (128, 128, 4, 2, "pingpong"),
         (128, 64, 4, 3, "overlap"), (128, 64, 4, 3, "pingpong"), (128, 64, 4, 4, "pingpong")]
Q = [(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 8, 3), (128, 128, 8, 2), (64, 128, 4, 2)]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "sweep_out"))
    ap.add_argument("--shapes", default="S1,S1c,S2")
    ap.add_argument("--kinds", default="fwd,kv,q")
    ap.add_argument("--fwd", default="", help="fwd configs, e.g. 64,64,4,3;128,64,8,3")
    ap.add_argument("--kv", default="", help="dK/dV configs instead of the KV list, same form")
    ap.add_argument("--fwd-tma", default="off", choices=("off", "on", "both"),
                    help="forward K/V loads through TMA descriptors")
    ap.add_argument("--fwd-adv", default="off", choices=("off", "on", "both"),
                    help="pointer-path forward with advanced address tiles")
    ap.add_argument("--fwd-ws", default="off", choices=("off", "on", "both"),
                    help="forward key loop with Triton's automatic warp specialization")
    a = ap.parse_args(argv)
    shipped_kv, shipped_q = jfa.BWD_KV_KERNEL, jfa.BWD_Q_KERNEL
    onoff = {"off": (False,), "on": (True,), "both": (False, True)}
    # (FWD_TMA, FWD_PTR_ADVANCE, FWD_WARP_SPECIALIZE) to time; the advance applies to the pointer path only
    fwd_modes = list(dict.fromkeys((t, ad and not t, ws) for t in onoff[a.fwd_tma] for ad in onoff[a.fwd_adv]
                                   for ws in onoff[a.fwd_ws]))
    def configs(text):
        return [tuple(int(x) for x in c.split(",")) for c in text.split(";")]
    kv = configs(a.kv) if a.kv else KV
    if a.fwd:
        fwd_default = configs(a.fwd)
    elif a.fwd_tma != "off":
        fwd_default = FWD + [c for c in FWD_TMA if c not in FWD]
    else:
        fwd_default = FWD
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
        with torch.no_grad():
            shipped_out = f().float()
        # the shipped configuration's gradients, so a backward config that is fast but wrong shows
        out = f()
        do_shipped = torch.randn_like(out)
        shipped_grads = [g.float() for g in torch.autograd.grad(out, (q, k, v), do_shipped)]
        for kind, lst in (("fwd", fwd_default), ("gluon", GLUON), ("kv", kv), ("kvf", KVF), ("q", Q)):
            if kind not in a.kinds.split(","):
                continue
            modes = fwd_modes if kind == "fwd" else [(False, False, False)]
            for cfg in lst:
                for use_tma, adv, ws in modes:
                    jfa.CONFIG_OVERRIDE.clear()
                    jfa.CONFIG_OVERRIDE["gluon_fwd" if kind == "gluon" else kind] = cfg
                    jfa.FWD_KERNEL = "gluon" if kind == "gluon" else "triton"
                    jfa.BWD_DQ_MODE = "atomic" if kind == "kvf" else "separate"
                    # the configs swept are the tl kernels': "auto" would run the Gluon ones on sm_90
                    jfa.BWD_KV_KERNEL = "triton" if kind in ("kv", "kvf") else shipped_kv
                    jfa.BWD_Q_KERNEL = "triton" if kind == "q" else shipped_q
                    jfa.FWD_TMA, jfa.FWD_PTR_ADVANCE, jfa.FWD_WARP_SPECIALIZE = use_tma, adv, ws
                    jfa.LAST_FWD_PATH = ""
                    try:
                        if kind in ("fwd", "gluon"):
                            with torch.no_grad():
                                t = do_bench(f, warmup=20, rep=60, return_mode="median")
                            tf = flops / t * 1e-9
                            with torch.no_grad():
                                maxdiff = (f().float() - shipped_out).abs().max().item()
                        else:
                            out = f()
                            t = do_bench(lambda: torch.autograd.grad(out, (q, k, v), do_shipped, retain_graph=True),
                                         warmup=20, rep=60, return_mode="median")
                            tf = 2.5 * flops / t * 1e-9
                            grads = torch.autograd.grad(out, (q, k, v), do_shipped)
                            maxdiff = max((g.float() - ref).abs().max().item() for g, ref in zip(grads, shipped_grads))
                        r = dict(shape=sn, kind=kind, cfg=cfg, ms=t, tflops=tf, maxdiff=maxdiff)
                        if kind not in ("fwd", "gluon"):  # which kernels the timed backward ran
                            r["bwd_path"] = jfa.last_backward_paths()
                    except Exception as e:
                        r = dict(shape=sn, kind=kind, cfg=cfg, error=f"{type(e).__name__}: {str(e)[:200]}")
                    # requested path, and the one that ran (it differs on a TMA fallback)
                    r["req"] = ("tma" if use_tma else "ptr-adv" if adv else "ptr") + ("+ws" if ws else "")
                    r["path"] = (jfa.LAST_FWD_PATH or r["req"] + "?") + ("+ws" if ws and jfa.LAST_FWD_PATH else "")
                    res.append(r)
                    print(json.dumps(r), flush=True)
        jfa.FWD_TMA, jfa.FWD_PTR_ADVANCE, jfa.FWD_WARP_SPECIALIZE = False, False, False
        jfa.FWD_KERNEL = "triton"
        jfa.CONFIG_OVERRIDE.clear()
        jfa.BWD_DQ_MODE = "separate"
        jfa.BWD_KV_KERNEL, jfa.BWD_Q_KERNEL = shipped_kv, shipped_q
        del q, k, v
        torch.cuda.empty_cache()
    with open(os.path.join(a.out, "sweep.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    # best config per kernel kind: lowest geometric-mean time over the swept shapes
    import math
    best = {}
    # key: kernel kind, plus the requested forward path when it is not the default
    def bkey(r):
        return r["kind"] if r["kind"] != "fwd" or r["req"] == "ptr" else f"fwd[{r['req']}]"
    for key in {bkey(r) for r in res}:
        cands = {}
        for r in res:
            if bkey(r) == key:
                cands.setdefault(tuple(r["cfg"]), []).append(r.get("ms", float("inf")))
        n = max(len(v) for v in cands.values())
        ok = {c: math.exp(sum(math.log(t) for t in v) / len(v)) for c, v in cands.items()
              if len(v) == n and all(math.isfinite(t) for t in v)}
        if ok:  # keys are CONFIG_OVERRIDE's, so bench --cfg can apply the file
            best["gluon_fwd" if key == "gluon" else key] = list(min(ok, key=ok.get))
    with open(os.path.join(a.out, "best.json"), "w") as fh:
        json.dump(best, fh)
    print("best:", best)
    print("| shape | kernel | path | BM,BN,warps,stages | ms | TFLOP/s | max diff vs shipped |")
    print("|---|---|---|---|---|---|---|")
    for r in res:
        path = r["path"] if r["kind"] in ("fwd", "gluon") else "-"
        diff = f"{r['maxdiff']:.2e}" if "maxdiff" in r else "-"
        if "error" in r:
            print(f"| {r['shape']} | {r['kind']} | {path} | {r['cfg']} | err | {r['error'][:60]} | - |")
        else:
            print(f"| {r['shape']} | {r['kind']} | {path} | {r['cfg']} | {r['ms']:.3f} | {r['tflops']:.0f} | {diff} |")


if __name__ == "__main__":
    main()
