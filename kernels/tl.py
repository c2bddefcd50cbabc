"""The tl (portable Triton) kernels: forward, backward preprocess, dK/dV and dQ.  They run on any GPU Triton
supports, at every declared dtype and head dim, and on the CPU under ``TRITON_INTERPRET=1``; on sm_90 the
Gluon kernels (kernels/gluon/) take the shapes they serve.

Conventions (launch.py launches these):
* q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv], last dim contiguous.
* Tiles come from lists built on the device (schedule.py); one program per (tile, head) item, program p
  running item ITEMS[p] of the sequence-major launch order (the hardware block scheduler then hands the
  items to SMs as they free up, heavy sequences first).  The grid is a bound on the item count, which the
  kernels read from N_ITEMS[0]: programs past it return at once.
* Causal masking is bottom-right aligned: key j visible to query i iff j <= i + (Lk - Lq).  Key loops are
  peeled: an unmasked bulk loop and a masked tail over the diagonal / ragged end.
* Softmax runs in base 2: qk_scale = softmax_scale * log2(e); LSE is stored in natural log.  Rows with no
  visible key: out 0, LSE -inf.
* BROADCAST: one dense q [Lq, Hq, D] shared by all B K/V sequences; the output row of (batch b, query i)
  is b * Lq + i.
"""
import os

import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

LOG2E = 1.4426950408889634


@triton.jit
def _seq_info(CU_Q, CU_K, b, BROADCAST: tl.constexpr):
    k_start = tl.load(CU_K + b).to(tl.int64)
    lk = (tl.load(CU_K + b + 1).to(tl.int64) - k_start).to(tl.int32)
    if BROADCAST:
        q_start = tl.load(CU_Q).to(tl.int64) * 0
        lq = tl.load(CU_Q + 1).to(tl.int32)
        o_start = lq.to(tl.int64) * b
    else:
        q_start = tl.load(CU_Q + b).to(tl.int64)
        lq = (tl.load(CU_Q + b + 1).to(tl.int64) - q_start).to(tl.int32)
        o_start = q_start
    return q_start, o_start, lq, k_start, lk


# ----------------------------------------------------------------------------
# forward
# ----------------------------------------------------------------------------
@triton.jit
def _key_range(m0, lq, lk, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # the keys that query rows [m0, m0 + BLOCK_M) see (bottom-right causal): [0, full_hi) whole key
    # blocks with no masking, [full_hi, hi) the masked rest; diag = lk - lq
    diag = lk - lq
    if CAUSAL:
        hi = tl.maximum(tl.minimum(lk, m0 + BLOCK_M + diag), 0)
        full_hi = tl.maximum(tl.minimum(lk, m0 + 1 + diag), 0)
    else:
        hi = lk
        full_hi = lk
    return (full_hi // BLOCK_N) * BLOCK_N, hi, diag


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_src, v_src, stride_kt, stride_vt, offs_m, lo, hi, lk, diag, qk_scale,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr,
               HEAD_DV: tl.constexpr, DOT_PREC: tl.constexpr):
    # k_src / v_src point to row 0 of this sequence and kv head
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_D)
    offs_dv = tl.arange(0, HEAD_DV)
    for start_n in tl.range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k_ptrs = k_src + cols[:, None].to(tl.int64) * stride_kt + offs_d[None, :]
        v_ptrs = v_src + cols[:, None].to(tl.int64) * stride_vt + offs_dv[None, :]
        if MASKED:
            k = tl.load(k_ptrs, mask=cols[:, None] < lk, other=0.0)
        else:
            k = tl.load(k_ptrs)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
        if MASKED:
            mask = cols[None, :] < lk
            if CAUSAL:
                mask = mask & (cols[None, :] <= offs_m[:, None] + diag)
            qk = tl.where(mask, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_use = m_new
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(qk - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if MASKED:
            v = tl.load(v_ptrs, mask=cols[:, None] < lk, other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


# arguments that follow the batch (token totals, sequence counts) or the head counts are not specialized on: one
# variant per config
@triton.jit(do_not_specialize=['stride_lh', 'H', 'GROUP'])
def _fwd_kernel(Q, K, V, O, LSE, CU_Q, CU_K, TILE_SEQ, TILE_BLK, ITEMS, N_ITEMS,
                stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                stride_ot, stride_oh, stride_lh,
                qk_scale,
                H, GROUP,
                BROADCAST: tl.constexpr, CAUSAL: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                DOT_PREC: tl.constexpr):
    # one output tile: q block ``mblk`` of sequence ``b``, q head ``h`` (item ITEMS[pid] = tile * H + h).  Q
    # loads and O / LSE stores are masked pointer ops: a full-tile store would write into the next sequence.
    # The grid is a bound: programs past the item count (N_ITEMS[0]) have nothing to do.
    if tl.program_id(0) >= tl.load(N_ITEMS):
        return
    item = tl.load(ITEMS + tl.program_id(0))
    tile = item // H
    h = item % H
    b = tl.load(TILE_SEQ + tile)
    mblk = tl.load(TILE_BLK + tile).to(tl.int32)
    q_start, o_start, lq, k_start, lk = _seq_info(CU_Q, CU_K, b, BROADCAST)
    hk = h // GROUP
    m0 = mblk * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    offs_dv = tl.arange(0, HEAD_DV)
    row_ok = offs_m < lq

    q_ptrs = Q + (q_start + offs_m[:, None].to(tl.int64)) * stride_qt + h * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)

    full_hi, hi, diag = _key_range(m0, lq, lk, CAUSAL, BLOCK_M, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DV], tl.float32)
    k_src = K + k_start * stride_kt + hk * stride_kh
    v_src = V + k_start * stride_vt + hk * stride_vh
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_src, v_src, stride_kt, stride_vt, offs_m, 0, full_hi, lk, diag,
                               qk_scale, False, CAUSAL, BLOCK_N, HEAD_D, HEAD_DV, DOT_PREC)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_src, v_src, stride_kt, stride_vt, offs_m, full_hi, hi, lk, diag,
                               qk_scale, True, CAUSAL, BLOCK_N, HEAD_D, HEAD_DV, DOT_PREC)
    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(has, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    o_ptrs = O + (o_start + offs_m[:, None].to(tl.int64)) * stride_ot + h * stride_oh + offs_dv[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + h * stride_lh + o_start + offs_m, lse, mask=row_ok)


# ----------------------------------------------------------------------------
# backward: delta = rowsum(dO * O); with WRITE_STATS also the Gluon dK/dV kernel's
# statistics: row h = LSE * log2(e) (+inf where LSE is -inf), row H + h = delta,
# output row t in column COLS[t] (plan.AlignedColumns)
# ----------------------------------------------------------------------------
# arguments that follow the batch (token totals, sequence counts) are not specialized on: one variant per config
@triton.jit(do_not_specialize=['n_rows', 'stride_dh', 'stride_sh'])
def _bwd_preprocess(O, DO, DELTA, LSE, STATS, COLS, n_rows, stride_ot, stride_oh, stride_dot, stride_doh,
                    stride_dh, stride_sh, BLOCK: tl.constexpr, HEAD_DV: tl.constexpr, WRITE_STATS: tl.constexpr):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    offs = tl.arange(0, HEAD_DV)
    ok = rows < n_rows
    r64 = rows[:, None].to(tl.int64)
    o = tl.load(O + r64 * stride_ot + h * stride_oh + offs[None, :], mask=ok[:, None], other=0.0)
    do = tl.load(DO + r64 * stride_dot + h * stride_doh + offs[None, :], mask=ok[:, None], other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + h * stride_dh + rows, delta, mask=ok)
    if WRITE_STATS:
        lse = tl.load(LSE + h * stride_dh + rows, mask=ok, other=0.0)
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
        cols = tl.load(COLS + rows, mask=ok, other=0)
        h64 = h.to(tl.int64)  # (2 * Hq rows of about as many columns as output rows)
        tl.store(STATS + h64 * stride_sh + cols, lse2, mask=ok)
        tl.store(STATS + (tl.num_programs(1) + h64) * stride_sh + cols, delta, mask=ok)


# ----------------------------------------------------------------------------
# backward: dK, dV (one program per (k-block tile, kv head); loops over the
# query-head group and the query blocks that see the key block)
# ----------------------------------------------------------------------------
@triton.jit
def _bwd_kv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qt, stride_dot, offs_n, lo, hi, lq,
                  diag, qk_scale, MASKED: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_D: tl.constexpr,
                  HEAD_DV: tl.constexpr, DOT_PREC: tl.constexpr):
    offs_d = tl.arange(0, HEAD_D)
    offs_dv = tl.arange(0, HEAD_DV)
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        rok = rows < lq
        r64 = rows.to(tl.int64)
        q = tl.load(q_base + r64[:, None] * stride_qt + offs_d[None, :], mask=rok[:, None], other=0.0)
        lse = tl.load(lse_base + rows, mask=rok, other=float("inf"))
        # lse is natural log; rows with no visible key carry -inf -> p must be 0
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
        qkT = tl.dot(k, tl.trans(q), input_precision=DOT_PREC)  # [BN, BM]
        pT = tl.math.exp2(qkT * qk_scale - lse2[None, :])
        if MASKED:
            pT = tl.where(offs_n[:, None] <= rows[None, :] + diag, pT, 0.0)
        do = tl.load(do_base + r64[:, None] * stride_dot + offs_dv[None, :], mask=rok[:, None], other=0.0)
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PREC)
        delta = tl.load(delta_base + rows, mask=rok, other=0.0)
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)  # [BN, BM]
        dsT = pT * (dpT - delta[None, :])
        ds_lo = dsT.to(q.dtype)
        dk = tl.dot(ds_lo, q, dk, input_precision=DOT_PREC)
    return dk, dv


# arguments that follow the batch (token totals, sequence counts) or the head counts are not specialized on: one
# variant per config
@triton.jit(do_not_specialize=['stride_lh', 'HKV', 'GROUP'])
def _bwd_kv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, CU_Q, CU_K, TILE_SEQ, TILE_BLK, ITEMS, N_ITEMS,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                   stride_dot, stride_doh, stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_lh,
                   sm_scale, qk_scale,
                   HKV, GROUP,
                   BROADCAST: tl.constexpr, CAUSAL: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                   DOT_PREC: tl.constexpr):
    # dK, dV of key block ``nblk`` of sequence ``b``, kv head ``hk`` (item ITEMS[pid] = tile * HKV + hk),
    # summed over its query heads; a sequence with no queries gets zeros.  Programs past N_ITEMS[0]: none.
    if tl.program_id(0) >= tl.load(N_ITEMS):
        return
    item = tl.load(ITEMS + tl.program_id(0))
    tile = item // HKV
    hk = item % HKV
    b = tl.load(TILE_SEQ + tile)
    nblk = tl.load(TILE_BLK + tile).to(tl.int32)
    q_start, o_start, lq, k_start, lk = _seq_info(CU_Q, CU_K, b, BROADCAST)
    n0 = nblk * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_D)
    offs_dv = tl.arange(0, HEAD_DV)
    nok = offs_n < lk
    n64 = offs_n.to(tl.int64)
    k = tl.load(K + (k_start + n64[:, None]) * stride_kt + hk * stride_kh + offs_d[None, :],
                mask=nok[:, None], other=0.0)
    v = tl.load(V + (k_start + n64[:, None]) * stride_vt + hk * stride_vh + offs_dv[None, :],
                mask=nok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_D], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DV], tl.float32)
    diag = lk - lq
    if CAUSAL:
        # rows < n0 - diag see nothing of this block; rows >= n0 + BN - 1 - diag see all of it
        m_lo = (tl.maximum(n0 - diag, 0) // BLOCK_M) * BLOCK_M
        m_full = tl.maximum(n0 + BLOCK_N - 1 - diag, 0)
        m_full = ((m_full + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
        m_full = tl.minimum(tl.maximum(m_full, m_lo), ((lq + BLOCK_M - 1) // BLOCK_M) * BLOCK_M)
    else:
        m_lo = 0
        m_full = 0
    for g in range(GROUP):
        h = hk * GROUP + g
        q_base = Q + q_start * stride_qt + h * stride_qh
        do_base = DO + o_start * stride_dot + h * stride_doh
        lse_base = LSE + h * stride_lh + o_start
        delta_base = DELTA + h * stride_lh + o_start
        if CAUSAL:
            dk, dv = _bwd_kv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qt, stride_dot,
                                   offs_n, m_lo, m_full, lq, diag, qk_scale, True, BLOCK_M, HEAD_D, HEAD_DV,
                                   DOT_PREC)
        dk, dv = _bwd_kv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qt, stride_dot,
                               offs_n, m_full, lq, lq, diag, qk_scale, False, BLOCK_M, HEAD_D, HEAD_DV, DOT_PREC)
    dk = dk * sm_scale
    tl.store(DK + (k_start + n64[:, None]) * stride_dkt + hk * stride_dkh + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=nok[:, None])
    tl.store(DV + (k_start + n64[:, None]) * stride_dvt + hk * stride_dvh + offs_dv[None, :],
             dv.to(DV.dtype.element_ty), mask=nok[:, None])


# ----------------------------------------------------------------------------
# backward: dQ (one program per (q-block tile, q head)).  A tile covers the
# batches [b_lo, b_hi): one batch for ordinary packed inputs, a contiguous
# chunk of batches for broadcast-Q, whose fp32 partial goes to DQ[slot]
# (reduced afterwards in a fixed order: deterministic).
# ----------------------------------------------------------------------------
@triton.jit
def _dq_tile(ITEMS, TILE_BLO, TILE_BHI, TILE_BLK, TILE_SLOT, H, GROUP, BLOCK_M: tl.constexpr,
             BROADCAST: tl.constexpr):
    # this program's dQ tile: (q head, kv head, batches [b_lo, b_hi), first row, partial slot).  Broadcast-Q:
    # program p runs chunk tile p // H (already heaviest first); else the item ITEMS[p] (sequence-major), one
    # sequence (TILE_BLO holds the tiles' sequences) and slot 0
    pid = tl.program_id(0)
    if BROADCAST:
        tile = pid // H
        h = pid % H
        b_lo = tl.load(TILE_BLO + tile)
        b_hi = tl.load(TILE_BHI + tile)
        slot = tl.load(TILE_SLOT + tile).to(tl.int64)
    else:
        item = tl.load(ITEMS + pid)
        tile = item // H
        h = item % H
        b_lo = tl.load(TILE_BLO + tile)
        b_hi = b_lo + 1
        slot = (b_lo * 0).to(tl.int64)
    m0 = tl.load(TILE_BLK + tile).to(tl.int32) * BLOCK_M
    return h, h // GROUP, b_lo, b_hi, m0, slot


@triton.jit
def _dq_store(DQ, dq, slot, q_start, m64, row_ok, h, stride_dqs, stride_dqt, stride_dqh,
              BROADCAST: tl.constexpr, HEAD_D: tl.constexpr):
    # broadcast-Q: rows of the shared query block, in this chunk's partial slot
    if BROADCAST:
        q_row = m64
    else:
        q_row = q_start + m64
    offs_d = tl.arange(0, HEAD_D)
    tl.store(DQ + slot * stride_dqs + q_row[:, None] * stride_dqt + h * stride_dqh + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _bwd_q_inner(dq, q, do, lse2, delta, k_base, v_base, stride_kt, stride_vt,
                 offs_m, lo, hi, lk, diag, qk_scale,
                 MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
                 HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, DOT_PREC: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_D)
    offs_dv = tl.arange(0, HEAD_DV)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        c64 = cols.to(tl.int64)
        if MASKED:
            k = tl.load(k_base + c64[:, None] * stride_kt + offs_d[None, :], mask=cols[:, None] < lk, other=0.0)
            v = tl.load(v_base + c64[:, None] * stride_vt + offs_dv[None, :], mask=cols[:, None] < lk, other=0.0)
        else:
            k = tl.load(k_base + c64[:, None] * stride_kt + offs_d[None, :])
            v = tl.load(v_base + c64[:, None] * stride_vt + offs_dv[None, :])
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASKED:
            mask = cols[None, :] < lk
            if CAUSAL:
                mask = mask & (cols[None, :] <= offs_m[:, None] + diag)
            p = tl.where(mask, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PREC)
    return dq


# arguments that follow the batch (token totals, sequence counts) or the head counts are not specialized on: one
# variant per config
@triton.jit(do_not_specialize=['stride_dqs', 'stride_lh', 'H', 'GROUP'])
def _bwd_q_kernel(Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K,
                  TILE_BLO, TILE_BHI, TILE_BLK, TILE_SLOT, ITEMS, N_ITEMS,
                  stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                  stride_dot, stride_doh, stride_dqs, stride_dqt, stride_dqh,
                  stride_lh,
                  sm_scale, qk_scale,
                  H, GROUP,
                  BROADCAST: tl.constexpr, CAUSAL: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                  DOT_PREC: tl.constexpr):
    # one program per (tile, q head); the grid is a bound except under broadcast-Q (programs past N_ITEMS[0]:
    # nothing to do)
    if not BROADCAST:
        if tl.program_id(0) >= tl.load(N_ITEMS):
            return
    h, hk, b_lo, b_hi, m0, slot = _dq_tile(ITEMS, TILE_BLO, TILE_BHI, TILE_BLK, TILE_SLOT, H, GROUP, BLOCK_M,
                                           BROADCAST)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    offs_dv = tl.arange(0, HEAD_DV)
    m64 = offs_m.to(tl.int64)
    dq = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    q_start, o_start, lq, k_start, lk = _seq_info(CU_Q, CU_K, b_lo, BROADCAST)
    row_ok = offs_m < lq
    q = tl.load(Q + (q_start + m64[:, None]) * stride_qt + h * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    for b in range(b_lo, b_hi):
        q_start, o_start, lq, k_start, lk = _seq_info(CU_Q, CU_K, b, BROADCAST)
        do = tl.load(DO + (o_start + m64[:, None]) * stride_dot + h * stride_doh + offs_dv[None, :],
                     mask=row_ok[:, None], other=0.0)
        lse = tl.load(LSE + h * stride_lh + o_start + offs_m, mask=row_ok, other=float("inf"))
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
        delta = tl.load(DELTA + h * stride_lh + o_start + offs_m, mask=row_ok, other=0.0)
        full_hi, hi, diag = _key_range(m0, lq, lk, CAUSAL, BLOCK_M, BLOCK_N)
        k_base = K + k_start * stride_kt + hk * stride_kh
        v_base = V + k_start * stride_vt + hk * stride_vh
        dq = _bwd_q_inner(dq, q, do, lse2, delta, k_base, v_base, stride_kt, stride_vt,
                          offs_m, 0, full_hi, lk, diag, qk_scale,
                          False, CAUSAL, BLOCK_N, HEAD_D, HEAD_DV, DOT_PREC)
        dq = _bwd_q_inner(dq, q, do, lse2, delta, k_base, v_base, stride_kt, stride_vt,
                          offs_m, full_hi, hi, lk, diag, qk_scale,
                          True, CAUSAL, BLOCK_N, HEAD_D, HEAD_DV, DOT_PREC)
    _dq_store(DQ, dq * sm_scale, slot, q_start, m64, row_ok, h, stride_dqs, stride_dqt, stride_dqh, BROADCAST, HEAD_D)
