"""Benchmark: triton-jfa vs FA4 (flash_attn.cute), flex_attention (document
BlockMask) and padded SDPA on one GPU.

    python -m kernels.bench [--out DIR] [--impls triton,fa4,flex,sdpa]
                            [--shapes S1,S1c,S2,S3,S4a,S4b] [--rounds N]

TFLOP/s count useful FLOPs only: 4 * D * H * (visible (query, key) pairs)
forward, 2.5x that backward.  Times are triton.testing.do_bench medians
after warm-up on random bf16 data (fixed seed).  Backward is timed as
torch.autograd.grad of the output (the forward is not re-run).  With
--rounds N every implementation is timed N times, interleaved (A B C, A B C),
and the table gives the median of the rounds and their spread.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

SEED = 1234


# ---------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------
def _uniform_lens(rng, B, lo, hi):
    return rng.integers(lo, hi, size=B).astype(np.int64)


def _pareto_lens(rng, B, alpha=1.2, lo=16, hi=4096):
    x = (rng.pareto(alpha, size=B) + 1.0) * lo
    return np.clip(x, lo, hi).astype(np.int64)


def make_shapes():
    rng = np.random.default_rng(SEED)
    s1 = _uniform_lens(rng, 1024, 1, 1024)
    s2k = _uniform_lens(rng, 1024, 1, 1024)
    s3 = _pareto_lens(rng, 512)
    longest = int(np.argmax(s3))
    return {
        "S1": dict(desc="jagged self-attn B=1024 U[1,1024) H=4", lq=s1, lk=s1, H=4, causal=False, bq=False),
        "S1c": dict(desc="jagged self-attn B=1024 U[1,1024) H=4 causal", lq=s1, lk=s1, H=4, causal=True, bq=False),
        "S2": dict(desc="broadcast-Q Lq=256 x B=1024 KV U[1,1024) H=4", lq=np.array([256]), lk=s2k, H=4,
                   causal=False, bq=True),
        "S3": dict(desc="Pareto(1.2,16..4096) B=512 H=8", lq=s3, lk=s3, H=8, causal=False, bq=False),
        "S4a": dict(desc="dense B=768 L=512 H=4", lq=np.full(768, 512), lk=np.full(768, 512), H=4,
                    causal=False, bq=False),
        "S4b": dict(desc="dense B=8 L=4096 H=16 causal", lq=np.full(8, 4096), lk=np.full(8, 4096), H=16,
                    causal=True, bq=False),
        # diagnostics, not targets: S3 split into its longest sequence (over half its FLOPs) and the rest
        "S3L": dict(desc="S3's longest sequence alone, H=8", lq=s3[[longest]], lk=s3[[longest]], H=8,
                    causal=False, bq=False),
        "S3R": dict(desc="S3 without its longest sequence, H=8", lq=np.delete(s3, longest),
                    lk=np.delete(s3, longest), H=8, causal=False, bq=False),
    }


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
def impl_triton(shape, q, k, v, cu_q, cu_k):
    from kernels import jagged_flash_attention
    mq, mk = int(shape["lq"].max()), int(shape["lk"].max())

    def fwd():
        return jagged_flash_attention(q, k, v, cu_q, cu_k, mq, mk, causal=shape["causal"],
                                      broadcast_q=shape["bq"])[0]
    return fwd


def impl_triton_plan(shape, q, k, v, cu_q, cu_k):
    """The shipped kernel through a JaggedPlan made once: validation, configs and schedule happen at
    planning, so a call only launches (impl_triton reads the offsets on the host at every call, which
    waits for the GPU)."""
    from kernels import JaggedPlan
    mq, mk = int(shape["lq"].max()), int(shape["lk"].max())
    plan = JaggedPlan(q, k, v, cu_q, cu_k, mq, mk, causal=shape["causal"], broadcast_q=shape["bq"])

    def fwd():
        return plan(q, k, v)[0]
    return fwd


def _triton_with(base=None, **switches):
    """``base`` (impl_triton) with module switches of kernels.jfa set (and restored) around its set-up and
    around each forward call; the backward acts on the switches its forward read (jfa.BackwardSwitches)."""
    base = base or impl_triton

    def make(shape, q, k, v, cu_q, cu_k):
        from kernels import jfa

        def switched(fn, *args):
            old = {name: getattr(jfa, name) for name in switches}
            for name, value in switches.items():
                setattr(jfa, name, value)
            try:
                return fn(*args)
            finally:
                for name, value in old.items():
                    setattr(jfa, name, value)
        inner = switched(base, shape, q, k, v, cu_q, cu_k)
        return lambda: switched(inner)
    return make


impl_triton_atomic = _triton_with(BWD_DQ_MODE="atomic")
impl_triton_persistent = _triton_with(FWD_GRID="persistent", BWD_KV_GRID="persistent")
impl_triton_gluon = _triton_with(FWD_KERNEL="gluon")
impl_triton_gluon_persistent = _triton_with(FWD_KERNEL="gluon", GLUON_GRID="persistent")
# the launch order before v7 (jfa.ITEM_ORDER); the backward keeps the order its forward chose
impl_triton_work = _triton_with(ITEM_ORDER="work")
impl_triton_gluon_work = _triton_with(FWD_KERNEL="gluon", ITEM_ORDER="work")
impl_triton_section = _triton_with(ITEM_ORDER="section")
# the tl forward alone (the default before v9; sm_90 now sends sequences with >= 512 keys to Gluon)
impl_triton_tl = _triton_with(FWD_KERNEL="triton")


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


_FLEX = None


def impl_flex(shape, q, k, v, cu_q, cu_k):
    global _FLEX
    from torch.nn.attention.flex_attention import flex_attention

    from backends.flex import allow_recompiles, document_block_mask
    if _FLEX is None:
        allow_recompiles(64)  # one static compile per shape and pass (v4's flex ran eager on S4a, S4b)
        _FLEX = torch.compile(flex_attention, dynamic=False)
    lq = np.full(len(shape["lk"]), int(shape["lq"][0])) if shape["bq"] else shape["lq"]
    # the flex adapter's builder: block lists from the offsets, never a dense (q, k) evaluation
    cu_doc_q = torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32, device=q.device)
    cu_doc_k = torch.tensor(np.concatenate([[0], np.cumsum(shape["lk"])]), dtype=torch.int32, device=q.device)
    bm = document_block_mask(cu_doc_q, cu_doc_k, "bottom_right" if shape["causal"] else "none")
    B = len(shape["lk"])

    def fwd():
        qq = q
        if shape["bq"]:
            qq = q.unsqueeze(0).expand(B, *q.shape).reshape(B * q.shape[0], q.shape[1], q.shape[2])
        o = _FLEX(qq.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], block_mask=bm)
        return o[0].transpose(0, 1)
    return fwd


def impl_sdpa(shape, q, k, v, cu_q, cu_k):
    """Padded SDPA: scatter the packed rows into zero-padded [B, H, L, D] tensors, attend with a key
    mask (and the causal triangle), gather the real rows back.  The padding is an out-of-place
    index_put at distinct positions, so its backward is a gather; gathering padded rows from row 0
    instead made the backward a scatter-add of every padded row's gradient onto row 0 (serialized
    atomics: 1-6 s per backward before v8)."""
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


IMPLS = {"triton": impl_triton, "triton-atomic": impl_triton_atomic, "triton-persistent": impl_triton_persistent,
         "triton-gluon": impl_triton_gluon, "triton-gluon-persistent": impl_triton_gluon_persistent,
         "triton-work": impl_triton_work, "triton-gluon-work": impl_triton_gluon_work,
         "triton-section": impl_triton_section, "triton-tl": impl_triton_tl,
         # through a JaggedPlan: the shipped forward, the tl and Gluon forwards alone, and other split points
         # (sequences with at least N keys on Gluon, the rest on tl; the default is 512)
         "triton-plan": impl_triton_plan,
         "triton-tl-plan": _triton_with(impl_triton_plan, FWD_KERNEL="triton"),
         "triton-gluon-plan": _triton_with(impl_triton_plan, FWD_KERNEL="gluon"),
         **{f"triton-split{n}-plan": _triton_with(impl_triton_plan, FWD_KERNEL="split", GLUON_SPLIT_KEYS=n)
            for n in (256, 1024, 2048)},
         # the shipped forward with the Gluon part on each grid (jfa.GLUON_GRID; "dynamic" is the default)
         **{f"triton-plan-gluon-{g}": _triton_with(impl_triton_plan, GLUON_GRID=g)
            for g in ("sorted", "persistent", "dynamic")},
         # the shipped kernel with the Gluon dK/dV kernel in its backward (jfa.BWD_KV_KERNEL; since v13 beside
         # the Gluon dQ kernel)
         "triton-plan-gluon-bwd": _triton_with(impl_triton_plan, BWD_KV_KERNEL="gluon"),
         **{f"triton-plan-gluon-bwd-s{n}": _triton_with(impl_triton_plan, BWD_KV_KERNEL="gluon", GLUON_BWD_STAGES=n)
            for n in (1, 2, 3, 4)},
         # the Gluon kernels writing every output tile by masked stores, K / Q from shared memory (v17's default)
         "triton-plan-masked-stores": _triton_with(impl_triton_plan, GLUON_TMA_STORE_KERNELS=(),
                                                   GLUON_BWD_REG_OPERAND=False),
         # v18's default: dK / dV / dQ by TMA stores, O by masked stores, K / Q from shared memory
         "triton-plan-v18": _triton_with(impl_triton_plan, GLUON_TMA_STORE_KERNELS=("backward",),
                                         GLUON_BWD_REG_OPERAND=False),
         # O by TMA stores too, K / Q from shared memory (v19's first default)
         "triton-plan-tma-fwd": _triton_with(impl_triton_plan, GLUON_TMA_STORE_KERNELS=("forward", "backward"),
                                             GLUON_BWD_REG_OPERAND=False),
         # K (dK/dV) and Q (dQ) as register operands, every output by TMA stores, delta by its own pass: v19's
         # default (the row names each switch so that it keeps meaning this as defaults move)
         "triton-plan-reg-operand": _triton_with(impl_triton_plan, GLUON_BWD_REG_OPERAND=True,
                                                 GLUON_TMA_STORE_KERNELS=("forward", "backward"),
                                                 GLUON_DQ_DELTA=False),
         # ... and delta from the Gluon dQ kernel, run first, instead of a separate pass (jfa.GLUON_DQ_DELTA)
         "triton-plan-dq-delta": _triton_with(impl_triton_plan, GLUON_BWD_REG_OPERAND=True,
                                              GLUON_TMA_STORE_KERNELS=("forward", "backward"), GLUON_DQ_DELTA=True),
         # the tl dK/dV kernel (the default before v17, when "auto" began to pick the Gluon one on sm_90)
         "triton-plan-tl-kv": _triton_with(impl_triton_plan, BWD_KV_KERNEL="triton"),
         **{f"triton-plan-gluon-bwd-ovl-s{n}": _triton_with(impl_triton_plan, BWD_KV_KERNEL="gluon",
                                                          GLUON_BWD_ORDER="overlap", GLUON_BWD_STAGES=n)
            for n in (2, 3)},
         # ... with 64-row query blocks (jfa.GLUON_BWD_BLOCK_M)
         **{f"triton-plan-gluon-bwd-m64{sfx}": _triton_with(impl_triton_plan, BWD_KV_KERNEL="gluon",
                                                           GLUON_BWD_BLOCK_M=64, **kw)
            for sfx, kw in (("", {}), ("-s3", {"GLUON_BWD_STAGES": 3}), ("-ovl-s2", {"GLUON_BWD_ORDER": "overlap"}))},
         # dK/dV split by sequence length (jfa.BWD_KV_KERNEL "split"): sequences with at least n keys to the
         # Gluon kernel in its overlapped order at three stages (v15's fastest on S4b), the rest to the tl kernel
         **{f"triton-plan-bwd-split{n}": _triton_with(impl_triton_plan, BWD_KV_KERNEL="split", GLUON_BWD_SPLIT_KEYS=n,
                                                     GLUON_BWD_ORDER="overlap", GLUON_BWD_STAGES=3)
            for n in (1024, 2048, 4096)},
         # the dQ kernel (jfa.BWD_Q_KERNEL): the tl one (the default before v13), the Gluon one (the default
         # on sm_90 since v13) asked for explicitly, and the tl dQ beside the Gluon dK/dV kernel
         "triton-plan-tl-dq": _triton_with(impl_triton_plan, BWD_Q_KERNEL="triton"),
         "triton-plan-gluon-dq": _triton_with(impl_triton_plan, BWD_Q_KERNEL="gluon"),
         "triton-plan-gluon-bwd-tl-dq": _triton_with(impl_triton_plan, BWD_KV_KERNEL="gluon", BWD_Q_KERNEL="triton"),
         # dQ fused into the Gluon dK/dV kernel (TMA reduce-adds of dQ^T), the groups splitting the keys or the
         # head dim (jfa.GLUON_FUSED_DQ_SPLIT), at the default stages (3 since v17, 2 before), 2 and 3; -b2: two
         # dQ^T staging buffers per group (jfa.GLUON_FUSED_DQ_BUFFERS)
         **{f"triton-plan-gluon-fused-{split}{sfx}": _triton_with(
             impl_triton_plan, BWD_KV_KERNEL="gluon", BWD_DQ_MODE="atomic", GLUON_FUSED_DQ_SPLIT=split, **kw)
            for split in ("keys", "dim") for sfx, kw in (("", {}), ("-s2", {"GLUON_BWD_STAGES": 2}),
                                                         ("-s3", {"GLUON_BWD_STAGES": 3}),
                                                         ("-b2", {"GLUON_FUSED_DQ_BUFFERS": 2}))},
         # dQ fused into the tl dK/dV kernel (jfa.BWD_DQ_MODE "atomic"): blocks added through TMA (the default
         # reduce on sm_90) or per element; -kvf<BM>x<BN>w<warps>s<stages>: other fused-kernel tiles
         "triton-plan-atomic": _triton_with(impl_triton_plan, BWD_DQ_MODE="atomic"),
         "triton-plan-atomic-element": _triton_with(impl_triton_plan, BWD_DQ_MODE="atomic", BWD_DQ_REDUCE="element"),
         **{f"triton-plan-atomic-kvf{c[0]}x{c[1]}w{c[2]}s{c[3]}": _triton_with(
             impl_triton_plan, BWD_DQ_MODE="atomic", CONFIG_OVERRIDE={"kvf": c})
            for c in ((32, 64, 4, 3), (32, 64, 4, 2), (64, 64, 4, 2), (64, 128, 8, 2), (32, 128, 8, 2))},
         # dQ read back from the dS the tl dK/dV kernel stores (jfa.BWD_DQ_MODE "ds"); -q<BM>x<BN>w<warps>s<stages>:
         # other tiles of its dQ kernel; -kv...: other tiles of the dK/dV kernel that stores dS
         "triton-plan-ds": _triton_with(impl_triton_plan, BWD_DQ_MODE="ds"),
         **{f"triton-plan-ds-q{c[0]}x{c[1]}w{c[2]}s{c[3]}": _triton_with(
             impl_triton_plan, BWD_DQ_MODE="ds", CONFIG_OVERRIDE={"qds": c})
            for c in ((64, 64, 4, 3), (128, 64, 4, 3), (128, 128, 8, 2), (64, 128, 4, 3), (128, 32, 4, 4))},
         **{f"triton-plan-ds-kv{c[0]}x{c[1]}w{c[2]}s{c[3]}": _triton_with(
             impl_triton_plan, BWD_DQ_MODE="ds", CONFIG_OVERRIDE={"kv": c})
            for c in ((32, 64, 4, 2), (64, 128, 8, 2), (32, 128, 8, 3))},
         "fa4": impl_fa4, "flex": impl_flex, "sdpa": impl_sdpa}


# ---------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------
def warm_clocks(seconds=0.5):
    """Keep the GPU busy with bf16 matmuls for a moment, so the first implementation timed after the
    host-side set-up of a shape does not run while the clocks are still ramping (v2's spread)."""
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


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--impls", default="triton,fa4,flex,sdpa")
    ap.add_argument("--shapes", default="S1,S1c,S2,S3,S4a,S4b")
    ap.add_argument("--tag", default="")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every impl this many times, interleaved; report the median and the rounds")
    ap.add_argument("--fwd-only", default="",
                    help="impls whose backward is not timed (e.g. forward variants that share the shipped backward)")
    ap.add_argument("--once", default="",
                    help="impls timed in the first round only (slow baselines whose spread is not in question)")
    ap.add_argument("--cfg", default="", help="json {kind: [BM,BN,warps,stages]} config override for triton")
    ap.add_argument("--fwd-tma", action="store_true",
                    help="triton forward loads K/V through TMA descriptors (jfa.FWD_TMA)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.fwd_tma:
        from kernels import jfa
        jfa.FWD_TMA = True
    if args.cfg and os.path.exists(args.cfg):
        from kernels import jfa
        with open(args.cfg) as fh:
            jfa.CONFIG_OVERRIDE.update({kk: tuple(vv) for kk, vv in json.load(fh).items()})
        print("config override:", jfa.CONFIG_OVERRIDE, flush=True)
    shapes = make_shapes()
    tag = ("_" + args.tag) if args.tag else ""
    impls = args.impls.split(",")
    # a misspelt name would otherwise cost a GPU call an error row
    unknown = [n for n in impls + [x for x in (args.fwd_only + "," + args.once).split(",") if x] if n not in IMPLS]
    unknown += [n for n in args.shapes.split(",") if n not in shapes]
    if unknown:
        ap.error(f"unknown impls or shapes: {', '.join(unknown)} "
                 f"(impls: {', '.join(IMPLS)}; shapes: {', '.join(shapes)})")
    rows = []
    dev = torch.cuda.get_device_name(0)
    print(f"device: {dev}; torch {torch.__version__}", flush=True)
    for sname in args.shapes.split(","):
        shape = shapes[sname]
        D, H = 128, shape["H"]
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
                    if name.startswith("triton"):  # the paths that ran: a fallback cannot pass as a variant
                        from kernels import jfa
                        rec["fwd_path"] = jfa.LAST_FWD_PATH
                        if name not in args.fwd_only.split(","):
                            rec["bwd_path"] = jfa.last_backward_paths()
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
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(args.out, f"bench{tag}.md"), "w") as f:
        f.write(f"device: {dev}\n\n" + table + "\n")
    with open(os.path.join(args.out, f"bench{tag}.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
