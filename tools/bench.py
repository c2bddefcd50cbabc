"""Benchmark: triton-jfa against FA4 (flash_attn.cute) and padded SDPA on one GPU, in one process.

    python tools/bench.py [--out DIR] [--impls fa4,triton-plan,triton,triton-fresh,triton-fresh-2,triton-tl-plan,sdpa]
                          [--shapes S4b,S1,S1c,S2,S4a,S3] [--s3-seeds 1,2] [--rounds N] [--host]
                          [--variant NAME=FIELD=VALUE,...]

(from a checkout: the repository root goes on the import path, so a PYTHONPATH set for FA4 alone does)

Implementations: ``triton`` (a plain ``jagged_flash_attention`` call with the same offsets tensors every call, as
a model's layers make: validation, and the tile lists the first call built on the device, kept by
kernels/reuse.py), ``triton-fresh`` (a plain call that keeps nothing: the tile lists built at every call, as for
the first layer of a step), ``triton-fresh-2`` (the same with the items written by a second builder
launch at every batch size), ``triton-plan`` (calls of a ``JaggedPlan`` made once), ``triton-tl-plan`` (the same with
``Config(gluon=False)``: the tl kernels alone), ``fa4``, ``sdpa`` (padded).  Every triton row records the
kernels that ran (``JaggedPlan.paths``).  ``--variant NAME=CONFIG`` (repeatable) adds ``triton-plan:NAME``, calls
of a plan made with ``kernels.Config.from_string(CONFIG)`` (``gluon_split_keys=256``, say): the A/B of a kernel
change made as a Config field, in the same process and rounds as the kernels as they are and FA4.

TFLOP/s count useful FLOPs only: 4 * D * H * (visible (query, key) pairs)
forward, 2.5x that backward.  Times are triton.testing.do_bench medians
after warm-up on random bf16 data (fixed seed).  Backward is timed as
torch.autograd.grad of the output (the forward is not re-run).  With
--rounds N every implementation is timed N times, interleaved (A B C, A B C),
and the table gives the median of the rounds and their spread.  With --host
the first round also measures what a call costs the host: microseconds per
call submitted back to back without waiting for the GPU (a call that waits
shows its GPU time here too), and the GPU launches one call makes (kernels,
memsets and copies, from torch.profiler).  Where the host cost per call exceeds
the GPU time per call, the do_bench time is the host's; the JSON also names the
functions that take most of the host's time (``fwd_host_top``, ``bwd_host_top``).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import numpy as np
import torch

# the checkout's kernels, also where PYTHONPATH names only other folders (FA4 installed outside site-packages)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SEED = 1234


# ---------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------
def _uniform_lens(rng, B, lo, hi):
    return rng.integers(lo, hi, size=B).astype(np.int64)


def _pareto_lens(rng, B, alpha=1.2, lo=16, hi=4096):
    x = (rng.pareto(alpha, size=B) + 1.0) * lo
    return np.clip(x, lo, hi).astype(np.int64)


def make_shapes(s3_seeds=()):
    """The bench shapes; S3 is one Pareto draw of the fixed seed, and ``S3s<seed>`` another draw of its
    lengths for each of ``s3_seeds``."""
    rng = np.random.default_rng(SEED)
    s1 = _uniform_lens(rng, 1024, 1, 1024)
    s2k = _uniform_lens(rng, 1024, 1, 1024)
    s3 = _pareto_lens(rng, 512)
    s5 = _uniform_lens(np.random.default_rng(SEED + 5), 1024, 1, 1024)
    shapes = {
        "S1": dict(desc="jagged self-attn B=1024 U[1,1024) H=4", lq=s1, lk=s1, H=4, causal=False, bq=False),
        "S1c": dict(desc="jagged self-attn B=1024 U[1,1024) H=4 causal", lq=s1, lk=s1, H=4, causal=True, bq=False),
        "S2": dict(desc="broadcast-Q Lq=256 x B=1024 KV U[1,1024) H=4", lq=np.array([256]), lk=s2k, H=4,
                   causal=False, bq=True),
        "S3": dict(desc="Pareto(1.2,16..4096) B=512 H=8", lq=s3, lk=s3, H=8, causal=False, bq=False),
        "S4a": dict(desc="dense B=768 L=512 H=4", lq=np.full(768, 512), lk=np.full(768, 512), H=4,
                    causal=False, bq=False),
        "S4b": dict(desc="dense B=8 L=4096 H=16 causal", lq=np.full(8, 4096), lk=np.full(8, 4096), H=16,
                    causal=True, bq=False),
        "S5": dict(desc="jagged head dim 64 B=1024 U[1,1024) H=8", lq=s5, lk=s5, H=8, causal=False, bq=False, D=64),
        "S5c": dict(desc="jagged head dim 64 B=1024 U[1,1024) H=8 causal", lq=s5, lk=s5, H=8, causal=True, bq=False,
                    D=64),
        "S6": dict(desc="jagged head dim 32 B=1024 U[1,1024) H=16", lq=s5, lk=s5, H=16, causal=False, bq=False, D=32),
        "S6c": dict(desc="jagged head dim 32 B=1024 U[1,1024) H=16 causal", lq=s5, lk=s5, H=16, causal=True, bq=False,
                    D=32),
        "S7": dict(desc="jagged head dim 16 B=1024 U[1,1024) H=16", lq=s5, lk=s5, H=16, causal=False, bq=False, D=16),
    }
    for seed in s3_seeds:
        lens = _pareto_lens(np.random.default_rng(seed), 512)
        shapes[f"S3s{seed}"] = dict(desc=f"Pareto(1.2,16..4096) B=512 H=8, seed {seed}", lq=lens, lk=lens, H=8,
                                    causal=False, bq=False)
    return shapes


def visible_pairs(lq, lk, causal, bq):
    lk = np.asarray(lk, dtype=np.int64)
    if bq:
        lq = np.full_like(lk, int(lq[0]))
    lq = np.asarray(lq, dtype=np.int64)
    if not causal:
        return int((lq * lk).sum())
    tot = 0
    for a, b in zip(lq.tolist(), lk.tolist()):
        i = np.arange(a)
        tot += int(np.clip(i + (b - a) + 1, 0, b).sum())
    return tot


# ---------------------------------------------------------------------------
# problem construction
# ---------------------------------------------------------------------------
def build(shape, D=128, dtype=torch.bfloat16, device="cuda"):
    g = torch.Generator(device="cpu").manual_seed(SEED)
    lq, lk, H, bq = shape["lq"], shape["lk"], shape["H"], shape["bq"]
    tq = int(lq[0]) if bq else int(lq.sum())
    tk_ = int(lk.sum())
    q = torch.randn(tq, H, D, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(tk_, H, D, generator=g).to(device=device, dtype=dtype)
    v = torch.randn(tk_, H, D, generator=g).to(device=device, dtype=dtype)
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32, device=device)
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lk)]), dtype=torch.int32, device=device)
    return q, k, v, cu_q, cu_k


# ---------------------------------------------------------------------------
# implementations: each returns (fwd_fn, make_bwd_fn) or raises
# ---------------------------------------------------------------------------
def _triton_args(shape, q, k, v, cu_q, cu_k):
    return (q, k, v, cu_q, cu_k, int(shape["lq"].max()), int(shape["lk"].max())), dict(causal=shape["causal"],
                                                                                     broadcast_q=shape["bq"])


def impl_triton(shape, q, k, v, cu_q, cu_k, config=None):
    """A plain call: validation, the tile lists built on the device (no wait for the GPU), the launches."""
    from kernels import jagged_flash_attention
    args, kw = _triton_args(shape, q, k, v, cu_q, cu_k)

    def fwd():
        return jagged_flash_attention(*args, config=config, **kw)[0]
    return fwd


def impl_triton_fresh(shape, q, k, v, cu_q, cu_k):
    """A plain call that keeps nothing (``Config(reuse_lists=False)``): every call builds its tile lists, as
    the first call with new offsets does (the first layer of a step)."""
    from kernels import Config
    return impl_triton(shape, q, k, v, cu_q, cu_k, config=Config(reuse_lists=False))


def impl_triton_fresh_2(shape, q, k, v, cu_q, cu_k):
    """``triton-fresh`` with the lists' items written by a second builder launch at every batch size
    (``Config(builder_items_seqs=0)``): the A/B of the one-launch builder."""
    from kernels import Config
    return impl_triton(shape, q, k, v, cu_q, cu_k, config=Config(reuse_lists=False, builder_items_seqs=0))


def impl_triton_plan(shape, q, k, v, cu_q, cu_k, config=None):
    """Calls of a JaggedPlan made once: a call only launches."""
    from kernels import JaggedPlan
    args, kw = _triton_args(shape, q, k, v, cu_q, cu_k)
    plan = JaggedPlan(*args, config=config, **kw)

    def fwd():
        return plan(q, k, v)[0]
    return fwd


def impl_triton_tl_plan(shape, q, k, v, cu_q, cu_k):
    from kernels import Config
    return impl_triton_plan(shape, q, k, v, cu_q, cu_k, config=Config(gluon=False))


# --variant's Configs by impl name ("triton-plan:NAME")
VARIANTS = {}


def add_variant(text):
    """``NAME=CONFIG`` -> the impl ``triton-plan:NAME`` (a plan under ``Config.from_string(CONFIG)``); its name.
    A Config the kernels refuse is a ValueError naming the field."""
    from kernels import Config
    name, sep, config_text = text.partition("=")
    if not sep or not name:
        raise ValueError(f"--variant takes NAME=FIELD=VALUE[,FIELD=VALUE...], got {text!r}")
    impl = f"triton-plan:{name}"
    VARIANTS[impl] = Config.from_string(config_text)
    IMPLS[impl] = functools.partial(impl_triton_plan, config=VARIANTS[impl])
    return impl


def triton_paths(name, shape, tensors):
    """The kernels a triton row runs (the plan of its call)."""
    from kernels import Config, JaggedPlan
    args, kw = _triton_args(shape, *tensors)
    config = VARIANTS.get(name, Config(gluon=False) if name == "triton-tl-plan" else None)
    return str(JaggedPlan(*args, config=config, **kw).paths)


def impl_fa4(shape, q, k, v, cu_q, cu_k):
    from flash_attn.cute import flash_attn_varlen_func as fa
    mq, mk = int(shape["lq"].max()), int(shape["lk"].max())
    if shape["bq"]:
        B = len(shape["lk"])
        Lq = int(shape["lq"][0])
        cu_qr = torch.arange(0, B + 1, device=q.device, dtype=torch.int32) * Lq

        def fwd():
            # Q replicated per sequence (a stride-0 4-D q with only cu_seqlens_k was
            # rejected by this FA4 build: "_compute_tile_cumsum requires num_m_blocks,
            # cu_seqlens, or seqused"); autograd of the expand sums dQ over the batch.
            qe = q.unsqueeze(0).expand(B, Lq, q.shape[1], q.shape[2]).reshape(B * Lq, q.shape[1], q.shape[2])
            r = fa(qe, k, v, cu_seqlens_q=cu_qr, cu_seqlens_k=cu_k, max_seqlen_q=Lq, max_seqlen_k=mk,
                   causal=shape["causal"])
            return r[0] if isinstance(r, tuple) else r
        return fwd

    def fwd():
        r = fa(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=mq, max_seqlen_k=mk,
               causal=shape["causal"])
        return r[0] if isinstance(r, tuple) else r
    return fwd


def impl_sdpa(shape, q, k, v, cu_q, cu_k):
    """Padded SDPA: scatter the packed rows into zero-padded [B, H, L, D] tensors, attend with a key
    mask (and the causal triangle), gather the real rows back.  The padding is an out-of-place
    index_put at distinct positions, so its backward is a gather (gathering padded rows from row 0
    would make it a scatter-add of every padded row's gradient onto row 0: serialized atomics)."""
    import torch.nn.functional as F
    lk = shape["lk"]
    B, H, D = len(lk), q.shape[1], q.shape[2]
    lq = np.full(B, int(shape["lq"][0])) if shape["bq"] else shape["lq"]
    Lq, Lk = -(-int(lq.max()) // 16) * 16, -(-int(lk.max()) // 16) * 16  # aligned for SDPA kernels
    dev = q.device
    vq = np.arange(Lq)[None, :] < lq[:, None]
    vk = np.arange(Lk)[None, :] < lk[:, None]
    # padded position of each packed row, batch-major (np.nonzero walks rows in order)
    pos_q = torch.tensor(np.flatnonzero(vq), device=dev)
    pos_k = torch.tensor(np.flatnonzero(vk), device=dev)
    vk_t = torch.tensor(vk, device=dev)
    dense = bool(vq.all() and vk.all())
    if shape["causal"] and not dense:
        if not np.all(lq == lk):
            raise RuntimeError("padded SDPA causal path only for Lq == Lk")
        tri = torch.ones(Lq, Lk, dtype=torch.bool, device=dev).tril()
        mask = (vk_t[:, None, None, :] & tri[None, None])
    elif dense:
        mask = None
    else:
        mask = vk_t[:, None, None, :]

    def pad(x, pos, rows):
        return x.new_zeros(B * rows, H, D).index_put((pos,), x).view(B, rows, H, D).transpose(1, 2)

    def fwd():
        if shape["bq"]:  # one query block shared by every batch: a stride-0 expand
            q1 = q.new_zeros(Lq, H, D).index_put((pos_q[:int(lq[0])],), q)
            qp = q1.view(1, Lq, H, D).expand(B, Lq, H, D).transpose(1, 2)
        else:
            qp = pad(q, pos_q, Lq)
        kp, vp = pad(k, pos_k, Lk), pad(v, pos_k, Lk)
        if mask is None:
            o = F.scaled_dot_product_attention(qp, kp, vp, is_causal=shape["causal"])
        else:
            o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)
        return o.transpose(1, 2).reshape(B * Lq, H, D)[pos_q]
    return fwd


IMPLS = {"fa4": impl_fa4, "triton-plan": impl_triton_plan, "triton": impl_triton, "triton-fresh": impl_triton_fresh,
         "triton-fresh-2": impl_triton_fresh_2,
         "triton-tl-plan": impl_triton_tl_plan, "sdpa": impl_sdpa}


# ---------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------
def warm_clocks(seconds=0.5):
    """Keep the GPU busy with bf16 matmuls for a moment, so the first implementation timed after the
    host-side set-up of a shape does not run while the clocks are still ramping."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t_end = time.time() + seconds
    while time.time() < t_end:
        for _ in range(8):
            a @ a
        torch.cuda.synchronize()


def time_impl(make, shape, tensors, warmup=25, rep=100, backward=True):
    from triton.testing import do_bench
    q, k, v, cu_q, cu_k = tensors
    q = q.detach().requires_grad_()
    k = k.detach().requires_grad_()
    v = v.detach().requires_grad_()
    fwd = make(shape, q, k, v, cu_q, cu_k)
    with torch.no_grad():
        t_f = do_bench(fwd, warmup=warmup, rep=rep, return_mode="median")
    out = fwd()
    if not backward:
        return t_f, float("nan"), out.detach()
    do = torch.randn_like(out)

    def bwd():
        torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    t_b = do_bench(bwd, warmup=warmup, rep=rep, return_mode="median")
    return t_f, t_b, out.detach()


def host_cost(fn, calls=50, sync=None, count_launches=True):
    """(host microseconds per call of ``fn`` submitted back to back, GPU launches of one call or None)."""
    sync = sync or torch.cuda.synchronize
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host_us = (time.perf_counter() - start) / calls * 1e6
    sync()
    launches = None
    if count_launches:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            sync()
        launches = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return host_us, launches


def host_profile(fn, calls=50, top=8, sync=None):
    """Where the host time of ``fn`` goes: the ``top`` functions by time spent in them (not in their callees),
    as ``[(where, microseconds per call), ...]`` over ``calls`` calls under cProfile (which slows every
    Python call alike, so read the shares, not the absolute figures)."""
    import cProfile
    import pstats
    sync = sync or torch.cuda.synchronize
    fn()
    sync()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    sync()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, primitive calls, self s, cumulative s, ...)
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [(f"{os.path.basename(f)}:{line}({name})", round(v[2] / calls * 1e6, 1)) for (f, line, name), v in rows]


def measure_host(make, shape, tensors):
    """host_cost of the forward and of the backward (torch.autograd.grad of one output) of an impl."""
    q, k, v, cu_q, cu_k = tensors
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    fwd = make(shape, q, k, v, cu_q, cu_k)
    with torch.no_grad():
        f_us, f_n = host_cost(fwd)
        f_top = host_profile(fwd)
    out = fwd()
    do = torch.randn_like(out)
    bwd = lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)  # noqa: E731
    b_us, b_n = host_cost(bwd)
    return dict(fwd_host_us=f_us, fwd_launches=f_n, bwd_host_us=b_us, bwd_launches=b_n,
                fwd_host_top=f_top, bwd_host_top=host_profile(bwd))


def run_shapes(names, s3_seeds):
    """The shapes a run times: ``names`` in order, with the S3 draws of ``s3_seeds`` that it does not name
    after S3 (at the end where S3 is not named), so that asking for seeds always times them."""
    names = [n for n in names if n]
    extra = [f"S3s{seed}" for seed in s3_seeds if f"S3s{seed}" not in names]
    at = names.index("S3") + 1 if "S3" in names else len(names)
    return names[:at] + extra + names[at:]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--impls", default="fa4,triton-plan,triton,triton-fresh,sdpa")
    ap.add_argument("--shapes", default="S4b,S1,S1c,S2,S4a,S3")
    ap.add_argument("--s3-seeds", default="", help="other Pareto draws of S3, e.g. 1,2: shapes S3s<seed>, timed "
                                                   "after S3 (or at the end) unless --shapes names them")
    ap.add_argument("--tag", default="")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every impl this many times, interleaved; report the median and the rounds")
    ap.add_argument("--fwd-only", default="",
                    help="impls whose backward is not timed (e.g. forward variants that share the shipped backward)")
    ap.add_argument("--once", default="",
                    help="impls timed in the first round only (slow baselines whose spread is not in question)")
    ap.add_argument("--host", action="store_true",
                    help="also measure each impl's host microseconds and GPU launches per call, and where the host "
                         "time goes (the costliest functions under cProfile; first round)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=CONFIG",
                    help="also time calls of a plan under kernels.Config.from_string(CONFIG) as impl "
                         "triton-plan:NAME (e.g. --variant split256=gluon_split_keys=256); repeatable")
    args = ap.parse_args(argv)
    variants = []
    for text in args.variant:
        try:
            variants.append(add_variant(text))
        except ValueError as exc:
            ap.error(str(exc))
    os.makedirs(args.out, exist_ok=True)
    try:
        seeds = [int(x) for x in args.s3_seeds.split(",") if x]
    except ValueError:
        ap.error(f"--s3-seeds takes integers joined by commas, got {args.s3_seeds!r}")
    shapes = make_shapes(seeds)
    tag = ("_" + args.tag) if args.tag else ""
    impls = args.impls.split(",") + [v for v in variants if v not in args.impls.split(",")]
    # a misspelt name would otherwise cost a GPU call an error row
    unknown = [n for n in impls + [x for x in (args.fwd_only + "," + args.once).split(",") if x] if n not in IMPLS]
    names = run_shapes(args.shapes.split(","), seeds)
    unknown += [n for n in names if n not in shapes]
    if unknown:
        ap.error(f"unknown impls or shapes: {', '.join(unknown)} "
                 f"(impls: {', '.join(IMPLS)}; shapes: {', '.join(shapes)})")
    rows = []
    dev = torch.cuda.get_device_name(0)
    print(f"device: {dev}; torch {torch.__version__}", flush=True)
    for sname in names:
        shape = shapes[sname]
        D, H = shape.get("D", 128), shape["H"]
        pairs = visible_pairs(shape["lq"], shape["lk"], shape["causal"], shape["bq"])
        flops_f = 4.0 * D * H * pairs
        tensors = build(shape, D)
        ref_out = None
        shape_rows = {}
        for rnd in range(args.rounds):  # interleaved rounds: A B C, A B C, ... so drift hits every impl
            for name in impls:
                rec = shape_rows.setdefault(name, dict(shape=sname, desc=shape["desc"], impl=name))
                if "error" in rec or (rnd > 0 and name in args.once.split(",")):
                    continue
                try:
                    warm_clocks()
                    t0 = time.time()
                    tf, tb, out = time_impl(IMPLS[name], shape, tensors,
                                            backward=name not in args.fwd_only.split(","))
                    rec.setdefault("fwd_ms_rounds", []).append(tf)
                    rec.setdefault("bwd_ms_rounds", []).append(tb)
                    tf, tb = float(np.median(rec["fwd_ms_rounds"])), float(np.median(rec["bwd_ms_rounds"]))
                    rec.update(fwd_ms=tf, bwd_ms=tb, fwd_tflops=flops_f / tf * 1e-9,
                               bwd_tflops=2.5 * flops_f / tb * 1e-9, wall_s=time.time() - t0)
                    if args.host and rnd == 0:
                        rec.update(measure_host(IMPLS[name], shape, tensors))
                    if name.startswith("triton"):  # the kernels that ran: a fallback cannot pass as a variant
                        rec["paths"] = triton_paths(name, shape, tensors)
                    if ref_out is None:
                        ref_out = out.float()
                    elif rnd == 0:
                        rec["max_abs_diff_vs_first"] = float((out.float() - ref_out).abs().max())
                except ImportError as e:
                    rec["error"] = f"skipped, not importable here: {str(e)[:200]}"
                except Exception as e:  # report and go on
                    rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                if rnd == 0:
                    rows.append(rec)
                print(json.dumps(rec), flush=True)
                with open(os.path.join(args.out, f"bench{tag}.json"), "w") as fh:
                    json.dump(rows, fh, indent=1)
                torch.cuda.empty_cache()
        del tensors
    # table
    by = {(r["shape"], r["impl"]): r for r in rows}
    def spread(ms):  # (max - min) / median over the rounds
        return f"{(max(ms) - min(ms)) / float(np.median(ms)):.0%}" if len(ms) > 1 else "-"
    lines = ["| shape | impl | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | fwd vs FA4 | bwd vs FA4 "
             "| fwd / bwd spread |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['shape']} | {r['impl']} | error: {r['error'][:80]} | | | | | | |")
            continue
        fa = by.get((r["shape"], "fa4"))
        timed_bwd = not np.isnan(r["bwd_ms"])  # --fwd-only impls have no backward time
        rf = rb = ""
        if fa and "error" not in fa:
            rf = f"{r['fwd_tflops'] / fa['fwd_tflops']:.2f}x"
            rb = f"{r['bwd_tflops'] / fa['bwd_tflops']:.2f}x" if timed_bwd else "-"
        bwd = f"{r['bwd_ms']:.3f} | {r['bwd_tflops']:.0f}" if timed_bwd else "- | -"
        lines.append(f"| {r['shape']} | {r['impl']} | {r['fwd_ms']:.3f} | {r['fwd_tflops']:.0f} | {bwd} | "
                     f"{rf} | {rb} | {spread(r['fwd_ms_rounds'])} / "
                     f"{spread(r['bwd_ms_rounds']) if timed_bwd else '-'} |")
    if args.host:
        lines += ["", "| shape | impl | fwd GPU ms | fwd host us/call | fwd launches | bwd GPU ms | bwd host us/call "
                  "| bwd launches |", "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "fwd_host_us" in r:
                lines.append(f"| {r['shape']} | {r['impl']} | {r['fwd_ms']:.3f} | {r['fwd_host_us']:.0f} | "
                             f"{r['fwd_launches']} | {r['bwd_ms']:.3f} | {r['bwd_host_us']:.0f} | {r['bwd_launches']} |")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(args.out, f"bench{tag}.md"), "w") as f:
        f.write(f"device: {dev}\n\n" + table + "\n")
    with open(os.path.join(args.out, f"bench{tag}.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
