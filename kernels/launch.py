"""Launching a planned call (plan.LaunchPlan): the forward and the backward, kernel by kernel.

Forward: the Gluon forward over the long sequences' tiles, the tl forward over the rest.
Backward, Gluon path: the Gluon dQ kernel (it also writes delta and the statistics), then the Gluon dK/dV
kernel.  Elsewhere: the preprocess pass (delta, and the statistics where the Gluon dK/dV kernel runs), the
dK/dV kernel, then the tl dQ kernel.
"""
from __future__ import annotations

import torch

from . import reuse, tl
from .plan import backward_lists, gluon_programs, tma_refusal


def _dot_prec(dtype):
    return "ieee" if dtype == torch.float32 else "tf32"


def _cdiv(a, b):
    return (a + b - 1) // b


def kernel_view(t):
    """``t`` with the stride of each size-1 dimension (of every dimension, if ``t`` is empty) set to what a
    dense layout would give: the same elements. Such strides address nothing, but Triton compiles a variant
    per kind of stride value (1, a multiple of 16, other), and torch leaves them as they fall (a permuted
    one-head dO, an empty one whose ``contiguous()`` is itself): they would compile kernels of their own,
    inside a run whose warm-up did not foresee them."""
    size, stride = t.shape, t.stride()
    empty = t.numel() == 0
    want = list(stride)
    for i in range(t.dim() - 1, -1, -1):
        if empty or size[i] == 1:
            want[i] = 1 if i == t.dim() - 1 else want[i + 1] * max(size[i + 1], 1)
    return t if tuple(want) == stride else t.as_strided(size, want)


def _descriptors(tensors_and_rows):
    """Gluon TMA descriptors of [rows, heads, dim] tensors: boxes of the given rows x dim."""
    from .gluon.pipeline import descriptor
    return tuple(descriptor(t.view(t.shape[0], -1), [rows, t.shape[2]]) for t, rows in tensors_and_rows)


def _grid(tiles, device, config):
    """(programs, dynamic, counter): the Gluon grid over a TileList and the dynamic deal's zeroed item
    counter."""
    n_programs, dynamic = gluon_programs(tiles.n_items, device, config)
    return n_programs, dynamic, torch.zeros(1, device=device, dtype=torch.int32) if dynamic else tiles.counts


def forward(q, k, v, cu_q, cu_k, plan):
    q, k, v = kernel_view(q), kernel_view(k), kernel_view(v)
    hq, d = q.shape[1], q.shape[2]
    hkv, dv = k.shape[1], v.shape[2]
    out = torch.empty((plan.n_out_rows, hq, dv), device=q.device, dtype=q.dtype)
    lse = torch.empty((hq, plan.n_out_rows), device=q.device, dtype=torch.float32)
    s = plan.schedule
    if plan.n_out_rows == 0:
        return out, lse
    t = s["fwd_gluon"]
    if t is not None and t.n_items > 0:  # the long sequences
        from .gluon import fwd
        qd, kd, vd = _descriptors(((q, fwd.HALF_M), (k, fwd.BLOCK_N), (v, fwd.BLOCK_N)))
        n_programs, dynamic, counter = _grid(t, q.device, plan.config)
        tma_store = d == dv  # O leaves through a Q buffer
        # (without TMA stores the kernel never touches o_desc: Q's descriptor stands in)
        od = _descriptors(((out, fwd.HALF_M),))[0] if tma_store else qd
        fwd.fwd_kernel[(n_programs,)](
            qd, kd, vd, out, lse, cu_q, cu_k, t.seq, t.blk, t.items, counter,
            out.stride(0), out.stride(1), lse.stride(0), plan.scale * tl.LOG2E, hq, hq // hkv, t.counts, od,
            BROADCAST=plan.broadcast, CAUSAL=plan.causal, BLOCK_N=fwd.BLOCK_N, HEAD_D=d, HEAD_DV=dv,
            STAGES=fwd.STAGES, TMA_STORE=tma_store, dynamic=int(dynamic), num_warps=4)
    t = s["fwd"]
    if t is not None and t.n_items > 0:
        bm, bn, w, st = plan.tiles.fwd
        tl._fwd_kernel[(t.n_items,)](
            q, k, v, out, lse, cu_q, cu_k, t.seq, t.blk, t.items, t.counts,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1), lse.stride(0), plan.scale * tl.LOG2E,
            H=hq, GROUP=hq // hkv, BROADCAST=plan.broadcast, CAUSAL=plan.causal,
            BLOCK_M=bm, BLOCK_N=bn, HEAD_D=d, HEAD_DV=dv, DOT_PREC=_dot_prec(q.dtype), num_warps=w, num_stages=st)
    return out, lse


def backward(do, q, k, v, out, lse, cu_q, cu_k, plan):
    hq, d = q.shape[1], q.shape[2]
    hkv, dvd = k.shape[1], v.shape[2]
    paths = plan.paths
    if "kv" in plan.schedule or "kv_gluon" in plan.schedule:  # a JaggedPlan's, or a compiled backward's
        s = plan.schedule
    else:  # a plain call's: built now, or kept from an earlier call with the same offsets (reuse.py)
        s = reuse.backward(plan.schedule.get("reuse"), (plan.paths, plan.tiles, plan.n_out_rows, tuple(q.shape),
                                                         tuple(k.shape)),
                           lambda: backward_lists(plan, q.shape, k.shape, q.device))
    n_out = out.shape[0]
    if do.stride(-1) != 1:
        do = do.contiguous()
    q, k, v, do, out = (kernel_view(t) for t in (q, k, v, do, out))
    if paths.dkdv == "gluon" and n_out > 0 and tma_refusal(do, 64):
        do = do.contiguous()  # a fresh tensor meets TMA's rules (the plan checked its size)
    # every key row of a sequence lies in one of its key blocks, and the kv lists hold the blocks of
    # sequences without queries too (written as zeros): no row of dK / dV is left unwritten
    dk = torch.empty(k.shape, device=k.device, dtype=k.dtype)
    dv = torch.empty(v.shape, device=v.device, dtype=v.dtype)
    delta = torch.empty_like(lse)  # (the tl kernels read LSE and delta with one row stride)
    # the Gluon dK/dV kernel's statistics, [2 * Hq, columns] fp32: LSE * log2(e), then delta
    columns = s.get("columns")
    stats = delta if columns is None else torch.empty((2 * hq, columns.n_cols), device=q.device, dtype=torch.float32)
    dq = None
    if paths.dq == "gluon":  # first: it writes delta and the statistics
        dq = _dq_gluon(q, k, v, do, out, lse, delta, stats, columns, cu_q, cu_k, s["q_gluon"], plan)
    elif n_out > 0:
        tl._bwd_preprocess[(_cdiv(n_out, 64), hq)](
            out, do, delta, lse, stats, cu_q if columns is None else columns.cols, n_out, out.stride(0),
            out.stride(1), do.stride(0), do.stride(1), delta.stride(0), stats.stride(0),
            BLOCK=64, HEAD_DV=dvd, WRITE_STATS=columns is not None, num_warps=4)
    if paths.dkdv == "gluon":
        _dkdv_gluon(q, k, v, do, stats, columns.cu, dk, dv, cu_q, cu_k, s["kv_gluon"], plan)
    elif s["kv"].n_items > 0 and k.shape[0] > 0:
        t = s["kv"]
        bm, bn, w, st = plan.tiles.kv
        tl._bwd_kv_kernel[(t.n_items,)](
            q, k, v, do, lse, delta, dk, dv, cu_q, cu_k, t.seq, t.blk, t.items, t.counts,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            do.stride(0), do.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), lse.stride(0),
            plan.scale, plan.scale * tl.LOG2E, HKV=hkv, GROUP=hq // hkv, BROADCAST=plan.broadcast,
            CAUSAL=plan.causal, BLOCK_M=bm, BLOCK_N=bn, HEAD_D=d, HEAD_DV=dvd, DOT_PREC=_dot_prec(q.dtype),
            num_warps=w, num_stages=st)
    if dq is None:
        dq = _dq_tl(q, k, v, do, lse, delta, cu_q, cu_k, s, plan)
    return dq, dk, dv


def _dq_tl(q, k, v, do, lse, delta, cu_q, cu_k, s, plan):
    """The tl dQ kernel; under broadcast-Q each batch chunk writes an fp32 partial, summed in a fixed order."""
    hq, d = q.shape[1], q.shape[2]
    hkv, dvd = k.shape[1], v.shape[2]
    if plan.broadcast:
        c = s["chunks"]
        tiles, n_programs, counts = (c.b_lo, c.b_hi, c.blk, c.slot, c.b_lo), c.n_tiles * hq, c.b_lo
        dq_buf = torch.empty((c.n_slots,) + tuple(q.shape), device=q.device, dtype=torch.float32)
    else:
        t = s["q"]
        # (one sequence per tile, in TILE_BLO; TILE_BHI and TILE_SLOT are not read)
        tiles, n_programs, counts = (t.seq, t.seq, t.blk, t.blk, t.items), t.n_items, t.counts
        dq_buf = torch.empty(q.shape, device=q.device, dtype=q.dtype).unsqueeze(0)
    if n_programs > 0 and q.shape[0] > 0:
        bm, bn, w, st = plan.tiles.q
        tl._bwd_q_kernel[(n_programs,)](
            q, k, v, do, lse, delta, dq_buf, cu_q, cu_k, *tiles, counts,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            do.stride(0), do.stride(1), dq_buf.stride(0), dq_buf.stride(1), dq_buf.stride(2),
            lse.stride(0), plan.scale, plan.scale * tl.LOG2E,
            H=hq, GROUP=hq // hkv, BROADCAST=plan.broadcast, CAUSAL=plan.causal,
            BLOCK_M=bm, BLOCK_N=bn, HEAD_D=d, HEAD_DV=dvd, DOT_PREC=_dot_prec(q.dtype),
            num_warps=w, num_stages=st)
    elif dq_buf.numel() > 0:
        dq_buf.zero_()
    if plan.broadcast:  # fixed-order fp32 reduction over the chunk partials: deterministic
        return (dq_buf[0] if dq_buf.shape[0] == 1 else dq_buf.sum(0)).to(q.dtype)  # 0 chunks: an empty batch
    return dq_buf[0]


def _dkdv_gluon(q, k, v, do, stats, cu_cols, dk, dv, cu_q, cu_k, t, plan):
    """The Gluon dK/dV kernel.  ``stats`` [2 * Hq, columns] holds LSE * log2(e) and delta (written by the Gluon
    dQ kernel or by tl's preprocess pass), each sequence from column ``cu_cols`` (Columns.cu) on."""
    from .gluon import dkdv
    from .gluon.pipeline import TensorDescriptor
    hq, d = q.shape[1], q.shape[2]
    hkv, dvd = k.shape[1], v.shape[2]
    if t.n_items == 0 or k.shape[0] == 0:
        return
    m, n = dkdv.BLOCK_M.value, dkdv.HALF_N.value
    qd, kd, vd, dod = _descriptors(((q, m), (k, n), (v, n), (do, m)))
    n_programs, dynamic, counter = _grid(t, q.device, plan.config)
    statsd = TensorDescriptor.from_tensor(stats, [1, m], dkdv.STATS_LAYOUT)
    dk_desc, dv_desc = _descriptors(((dk, n), (dv, n)))
    dkdv.dkdv_kernel[(n_programs,)](
        qd, kd, vd, dod, statsd, dk, dv, cu_q, cu_k, t.seq, t.blk, t.items, counter,
        dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), plan.scale, plan.scale * tl.LOG2E,
        hkv, hq // hkv, t.counts, cu_cols, dk_desc, dv_desc,
        BROADCAST=plan.broadcast, CAUSAL=plan.causal, HEAD_D=d, HEAD_DV=dvd, STAGES=dkdv.STAGES, dynamic=int(dynamic),
        num_warps=4)


def _dq_gluon(q, k, v, do, out, lse, delta, stats, columns, cu_q, cu_k, t, plan):
    """The Gluon dQ kernel; it also computes delta from dO and out and writes it into ``delta`` and, at the
    aligned ``columns``, into the dK/dV kernel's ``stats``."""
    from .gluon import dq as gdq
    hq, d = q.shape[1], q.shape[2]
    hkv, dvd = k.shape[1], v.shape[2]
    dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)  # every row with queries is in exactly one tile
    if t.n_items == 0 or q.shape[0] == 0:
        return dq
    m, n = gdq.HALF_M.value, gdq.BLOCK_N.value
    qd, kd, vd, dod, dqd = _descriptors(((q, m), (k, n), (v, n), (do, m), (dq, m)))
    n_programs, dynamic, counter = _grid(t, q.device, plan.config)
    gdq.dq_kernel[(n_programs,)](
        qd, kd, vd, dod, dq, lse, delta, cu_q, cu_k, t.seq, t.blk, t.items, counter,
        dq.stride(0), dq.stride(1), lse.stride(0), plan.scale, plan.scale * tl.LOG2E, hq, hq // hkv, t.counts, dqd,
        out, stats, columns.cols, out.stride(0), out.stride(1), stats.stride(0),
        CAUSAL=plan.causal, HEAD_D=d, HEAD_DV=dvd, STAGES=gdq.STAGES, dynamic=int(dynamic), num_warps=4)
    return dq
