"""Experiment (not committed): Gluon forward variants against the kernels as they are, and FA4 if on the path."""
import json, os, sys, time
sys.path.insert(0, "tools")
import torch
import bench
from kernels import Config
from triton.testing import do_bench

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
shapes = bench.make_shapes(s3_seeds=(1, 2))
names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["S4b", "S1", "S1c", "S4a", "S3", "S3s1", "S2", "S5"]
variants = {"base": Config(), "mf": Config(fwd_masked_first=True),
            "p32mf": Config(fwd_p_fp32=True, fwd_masked_first=True)}
try:
    import flash_attn.cute  # noqa
    have_fa4 = True
except Exception as exc:
    print("no fa4:", exc); have_fa4 = False
bench.warm_clocks(1.0)
rows = []
for name in names:
    shape = shapes[name]
    D = shape.get("D", 128)
    q, k, v, cu_q, cu_k = bench.build(shape, D=D)
    fns = {n: bench.impl_triton_plan(shape, q, k, v, cu_q, cu_k, config=c) for n, c in variants.items()}
    if have_fa4:
        fns["fa4"] = bench.impl_fa4(shape, q, k, v, cu_q, cu_k)
    with torch.no_grad():
        ref = fns["base"]().float()
        diffs = {}
        for n, f in fns.items():
            o = f().float()
            diffs[n] = float((o - ref).abs().max())
            if n != "fa4":
                o2 = f().float()
                diffs[n + "_repeat"] = float((o - o2).abs().max())
        times = {n: [] for n in fns}
        for rnd in range(7):
            for n, f in fns.items():
                times[n].append(do_bench(f, warmup=25, rep=100, return_mode="median"))
    med = {n: sorted(t)[3] for n, t in times.items()}
    row = dict(shape=name, med_ms=med, rounds=times, diffs=diffs)
    rows.append(row)
    line = f"{name}: " + ", ".join(f"{n} {m:.3f}" for n, m in med.items())
    line += " | vs base: " + ", ".join(f"{n} {med['base'] / m:.3f}x" for n, m in med.items() if n != "base")
    line += " | maxdiff vs base: " + ", ".join(f"{n} {d:.2e}" for n, d in diffs.items())
    print(line, flush=True)
    json.dump(rows, open(os.path.join(out_dir, "exp_fwd.json"), "w"), indent=1)
