"""The Hopper (sm_90) dQ kernel in Gluon, laid out like the forward (pipeline.py).  It runs first in the
backward and also computes delta = rowsum(dO * O) and the dK/dV kernel's statistics.

* A work item is one 128-row query tile of one sequence and one query head (the forward's tiles).  The
  two consumer warp groups own 64 rows each: their Q and dO halves stay in shared memory for the whole
  item (double-buffered across items), Q also in registers as S's A operand (S's MMAs then read only K
  from shared memory; dO stays there: with both in registers ptxas runs short and serializes the wgmma),
  their dQ accumulator, LSE and delta rows in registers.  The loader streams the item's 64-key K and V
  blocks through TMA into rings shared by both groups: ``STAGES`` V buffers and one K buffer more.
* Per key block j and group (_key_blocks): S = Q K^T and dP = dO V^T of block j issued, then block
  j-1's dQ += dS K; a wait for S and dP alone; P = exp2(S * scale * log2(e) - LSE * log2(e)) and
  dS = P (dP - delta), masked to 0 outside the sequence and the causal triangle, while dQ(j-1) runs; a
  wait for dQ(j-1).  dQ is scaled once and stored by its one owner: no atomics, deterministic, the
  same answer on any grid.
* delta: each group issues the read of its 64 O rows at the item's start and forms the row sums from its dO
  half while block 0's S and dP run; it writes delta to DELTA and, with LSE * log2(e), into the statistics
  columns COLS the dK/dV kernel reads (what tl's preprocess pass writes elsewhere).  An item that sees no
  key block writes delta 0: all its rows see no key, so their O is 0.
* Only rows and keys inside the sequence reach dQ: the selects zero dS outside it, and the loader zeroes
  the K rows past a ragged key end before publishing the block (dS is 0 there, but 0 * inf inside an
  MMA is NaN).  Q / dO rows past the sequence end only feed rows that are masked and never stored.
* Every block is masked (no separate unmasked path): dkdv.py's note on Triton 3.6.
* Whole 64-row dQ tiles leave by TMA stores from the group's own Q half; ragged tiles by masked stores.

Conventions as the rest of kernels/: natural-log LSE [Hq, rows], bottom-right causal.  Not for
broadcast-Q (its dQ sums over the batch: the tl chunked kernel does that).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.language.core import _aggregate as aggregate

from .pipeline import (compile_sm90 as _compile, desc_type, next_pos, publish_pos, query_tile, read_pos,
                       release_after_stores, store_rows, tma_load, zero_rows_from)

HALF_M = gl.constexpr(64)  # query rows per consumer warp group: one wgmma M-extent
BLOCK_N = gl.constexpr(64)  # keys per streamed block
LOG2E = gl.constexpr(1.4426950408889634)
STAGES = 2  # K/V blocks in flight: two fill sm_90's shared memory at head dim 128


@aggregate
class DqFlags:
    """Compile-time flags for the partitions (worker partitions receive only IR values)."""
    WG: gl.constexpr
    CAUSAL: gl.constexpr
    HEAD_D: gl.constexpr
    HEAD_DV: gl.constexpr
    STAGES: gl.constexpr
    K_STAGES: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, WG, CAUSAL, HEAD_D, HEAD_DV, STAGES):
        self.WG = gl.constexpr(WG)
        self.CAUSAL = gl.constexpr(CAUSAL)
        self.HEAD_D = gl.constexpr(HEAD_D)
        self.HEAD_DV = gl.constexpr(HEAD_DV)
        self.STAGES = gl.constexpr(STAGES)
        # block j-1's K stays for its dQ MMA while block j's K is read and block j+1's is loaded
        self.K_STAGES = gl.constexpr(STAGES + 1)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_smem, v_smem, pos_smem,
            q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, tail_bar,
            ITEMS, COUNTER, TILE_SEQ, TILE_BLK, CU_Q, CU_K, H, GROUP, n_items, dynamic, flags):
    HEAD_D: gl.constexpr = flags.HEAD_D
    HEAD_DV: gl.constexpr = flags.HEAD_DV
    STAGES: gl.constexpr = flags.STAGES
    KS: gl.constexpr = flags.K_STAGES
    r0 = 0  # ring position of the item's first key block (runs on across items)
    n_tails = 0
    tq = 0  # items so far: Q/dO buffer tq % 2
    pos = gl.program_id(0)
    while pos < n_items:
        q_start, o_start, lq, k_start, lk, h, hk, m0, diag, n_full, n_blocks = query_tile(
            pos, ITEMS, H, GROUP, TILE_SEQ, TILE_BLK, CU_Q, CU_K, False, flags.CAUSAL, BLOCK_N)
        qb = tq % 2
        # a fresh barrier counts as having completed the phase before 0, so first rounds do not wait
        mbarrier.wait(q_empty.index(qb), ((tq // 2) & 1) ^ 1)
        publish_pos(pos_smem, qb, pos)
        mbarrier.expect(q_ready.index(qb), 2 * (q_desc.block_type.nbytes + do_desc.block_type.nbytes))
        for half in gl.static_range(2):
            tma_load(q_desc, [q_start + m0 + half * HALF_M, h * HEAD_D], q_ready.index(qb),
                     q_smem.index(2 * qb + half))
            tma_load(do_desc, [q_start + m0 + half * HALF_M, h * HEAD_DV], q_ready.index(qb),
                     do_smem.index(2 * qb + half))
        for j in range(n_blocks):
            r = r0 + j
            s = r % STAGES
            start = j * BLOCK_N
            mbarrier.wait(v_empty.index(s), ((r // STAGES) & 1) ^ 1)
            mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
            tma_load(v_desc, [k_start + start, hk * HEAD_DV], v_ready.index(s), v_smem.index(s))
            sk = r % KS
            mbarrier.wait(k_empty.index(sk), ((r // KS) & 1) ^ 1)
            if start + BLOCK_N <= lk:
                mbarrier.expect(k_ready.index(sk), k_desc.block_type.nbytes)
                tma_load(k_desc, [k_start + start, hk * HEAD_D], k_ready.index(sk), k_smem.index(sk))
            else:
                # the ragged last block (at most one per item): zero the key rows past lk
                mbarrier.expect(tail_bar, k_desc.block_type.nbytes)
                tma_load(k_desc, [k_start + start, hk * HEAD_D], tail_bar, k_smem.index(sk))
                mbarrier.wait(tail_bar, n_tails & 1)
                zero_rows_from(k_smem.index(sk), lk - start, BLOCK_N, HEAD_D)
                fence_async_shared()
                mbarrier.arrive(k_ready.index(sk))
                n_tails += 1
        r0 += n_blocks
        tq += 1
        pos = next_pos(pos, COUNTER, dynamic)
    # no more items: a Q buffer holding a position past the end stops the consumers
    qb = tq % 2
    mbarrier.wait(q_empty.index(qb), ((tq // 2) & 1) ^ 1)
    publish_pos(pos_smem, qb, n_items)
    mbarrier.arrive(q_ready.index(qb))


@gluon.jit
def _load_o_rows(O, o_start, first, lq, stride_ot, HEAD_DV: gl.constexpr, o_layout: gl.constexpr):
    # this group's O rows [HALF_M, HEAD_DV] for delta (0 past the sequence end); the read is issued here, at
    # the item's start, and waited for only where delta is first needed
    rows = first + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, HEAD_DV, layout=gl.SliceLayout(0, o_layout))
    ptrs = O + gl.expand_dims((o_start + rows).to(gl.int64) * stride_ot, 1) + gl.expand_dims(cols, 0)
    return gl.load(ptrs, mask=gl.expand_dims(rows < lq, 1), other=0.0)


@gluon.jit
def _row_delta(o, do, row_ok, o_layout: gl.constexpr, s_layout: gl.constexpr):
    # delta = rowsum(dO * O) in fp32, as tl's preprocess pass computes it; rows past the end give 0 (their
    # dO in shared memory may be a neighbour's inf / NaN)
    delta = gl.sum(o.to(gl.float32) * do.load(o_layout).to(gl.float32), axis=1)
    return gl.where(row_ok, gl.convert_layout(delta, gl.SliceLayout(1, s_layout)), 0.0)


@gluon.jit
def _ds_block(st, dp, j, rows, row_ok, lse2, delta, cols0, lk, diag, qk_scale, dtype: gl.constexpr,
              CAUSAL: gl.constexpr, ds_layout: gl.constexpr):
    # dS of key block j as the dQ MMA's register operand, 0 outside the sequence and the causal triangle
    cols = j * BLOCK_N + cols0
    keep = gl.expand_dims(row_ok, 1) & gl.expand_dims(cols < lk, 0)
    if CAUSAL:
        keep = keep & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1) + diag)
    p = gl.exp2(st * qk_scale - lse2)
    ds = gl.where(keep, p * (dp - delta), 0.0)
    return gl.convert_layout(ds.to(dtype), ds_layout)


@gluon.jit
def _issue_s_dp(r, q, do, k_smem, v_smem, k_ready, v_ready, STAGES: gl.constexpr, KS: gl.constexpr,
                s_layout: gl.constexpr):
    # S = Q K^T and dP = dO V^T of the block at ring position r, issued asynchronously
    sk = r % KS
    mbarrier.wait(k_ready.index(sk), (r // KS) & 1)
    st = warpgroup_mma(q, k_smem.index(sk).permute((1, 0)), gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout),
                       use_acc=False, is_async=True)
    s = r % STAGES
    mbarrier.wait(v_ready.index(s), (r // STAGES) & 1)
    dp = warpgroup_mma(do, v_smem.index(s).permute((1, 0)), gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout),
                       use_acc=False, is_async=True)
    return st, dp


@gluon.jit
def _key_blocks(q, do, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, r0, n_blocks, rows, row_ok, lse2,
                delta, cols0, lk, diag, qk_scale, o, CAUSAL: gl.constexpr, STAGES: gl.constexpr, KS: gl.constexpr,
                HEAD_D: gl.constexpr, s_layout: gl.constexpr, dq_layout: gl.constexpr,
                ds_layout: gl.constexpr, o_layout: gl.constexpr):
    # The forward's order (FA3's intra-warpgroup overlap): block j's S and dP are issued, then block
    # j-1's dQ MMA; one wait for S and dP alone (dQ(j-1) stays in flight) and dS(j) is computed while
    # dQ(j-1) runs; a second wait retires dQ(j-1), whose K buffer is freed there (so K has one buffer
    # more than V).  No MMA is in flight across the loop's back edge: ptxas serializes every wgmma of
    # the kernel when an accumulator is.  delta is computed from ``o`` while block 0's S and dP run, and
    # returned (0 where no key block is seen: O is 0 there).
    dq = gl.zeros([HALF_M, HEAD_D], gl.float32, dq_layout)
    delta_rows = gl.zeros([HALF_M], gl.float32, gl.SliceLayout(1, s_layout))
    if n_blocks > 0:
        st, dp = _issue_s_dp(r0, q, do, k_smem, v_smem, k_ready, v_ready, STAGES, KS, s_layout)
        delta_rows = _row_delta(o, do, row_ok, o_layout, s_layout)
        delta = gl.expand_dims(delta_rows, 1)
        st, dp = warpgroup_mma_wait(0, deps=(st, dp))
        mbarrier.arrive(v_empty.index(r0 % STAGES))
        ds_prev = _ds_block(st, dp, 0, rows, row_ok, lse2, delta, cols0, lk, diag, qk_scale, k_smem.dtype,
                            CAUSAL, ds_layout)
        for j in range(1, n_blocks):
            r = r0 + j
            st, dp = _issue_s_dp(r, q, do, k_smem, v_smem, k_ready, v_ready, STAGES, KS, s_layout)
            dq_run = warpgroup_mma(ds_prev, k_smem.index((r - 1) % KS), dq, is_async=True)
            st, dp = warpgroup_mma_wait(1, deps=(st, dp))
            mbarrier.arrive(v_empty.index(r % STAGES))
            ds = _ds_block(st, dp, j, rows, row_ok, lse2, delta, cols0, lk, diag, qk_scale, k_smem.dtype,
                           CAUSAL, ds_layout)
            dq, ds_prev = warpgroup_mma_wait(0, deps=(dq_run, ds_prev))
            mbarrier.arrive(k_empty.index((r - 1) % KS))
            ds_prev = ds
        last = r0 + n_blocks - 1
        dq_run = warpgroup_mma(ds_prev, k_smem.index(last % KS), dq, is_async=True)
        dq, ds_prev = warpgroup_mma_wait(0, deps=(dq_run, ds_prev))
        mbarrier.arrive(k_empty.index(last % KS))
    return dq, delta_rows


@gluon.jit
def _consumer(q_smem, do_smem, k_smem, v_smem, pos_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
              DQ, LSE, DELTA, ITEMS, TILE_SEQ, TILE_BLK, CU_Q, CU_K, H, GROUP, n_items,
              stride_dqt, stride_dqh, stride_lh, sm_scale, qk_scale, dq_desc, O, STATS, COLS, stride_ot, stride_oh,
              stride_sh, flags):
    WG: gl.constexpr = flags.WG
    CAUSAL: gl.constexpr = flags.CAUSAL
    HEAD_D: gl.constexpr = flags.HEAD_D
    STAGES: gl.constexpr = flags.STAGES
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_D, 16])
    ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
    o_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # 16-byte pieces of O / dO rows
    r0 = 0
    tq = 0
    mbarrier.wait(q_ready.index(0), 0)
    pos = read_pos(pos_smem, 0)
    while pos < n_items:
        q_start, o_start, lq, k_start, lk, h, hk, m0, diag, n_full, n_blocks = query_tile(
            pos, ITEMS, H, GROUP, TILE_SEQ, TILE_BLK, CU_Q, CU_K, False, CAUSAL, BLOCK_N)
        qb = tq % 2
        q = q_smem.index(2 * qb + WG)
        do = do_smem.index(2 * qb + WG)
        first = m0 + WG * HALF_M
        rows = first + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, s_layout))
        row_ok = rows < lq
        lse_ptrs = h.to(gl.int64) * stride_lh + o_start + rows
        o = _load_o_rows(O + h * stride_oh, o_start, first, lq, stride_ot, flags.HEAD_DV, o_layout)
        delta = gl.expand_dims(gl.zeros([HALF_M], gl.float32, gl.SliceLayout(1, s_layout)), 1)
        stat_cols = gl.load(COLS + o_start + rows, mask=row_ok, other=0).to(gl.int64)
        lse = gl.load(LSE + lse_ptrs, mask=row_ok, other=float("inf"))
        # rows that see no key carry -inf: their P must be 0
        lse2_rows = gl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
        lse2 = gl.expand_dims(lse2_rows, 1)
        cols0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        # the item's Q half as S's A operand in registers, loaded once per item
        q_a = q.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
        dq, delta_rows = _key_blocks(q_a, do, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, r0, n_blocks,
                                     rows, row_ok, lse2, delta, cols0, lk, diag, qk_scale, o, CAUSAL, STAGES,
                                     flags.K_STAGES, HEAD_D, s_layout, dq_layout, ds_layout, o_layout)
        # what the preprocess pass would have written: delta, and the dK/dV kernel's statistics
        gl.store(DELTA + lse_ptrs, delta_rows, mask=row_ok)
        gl.store(STATS + h.to(gl.int64) * stride_sh + stat_cols, lse2_rows, mask=row_ok)
        gl.store(STATS + (H + h).to(gl.int64) * stride_sh + stat_cols, delta_rows, mask=row_ok)
        # every MMA reading this item's Q / dO is done
        dq = (dq * sm_scale).to(DQ.dtype.element_ty)
        # a whole tile leaves through this group's own Q half, released once the store has read it
        store_rows(dq, q, dq_desc, DQ + h * stride_dqh, q_start + first, lq - first, h * HEAD_D, stride_dqt,
                   True, dq_layout)
        release_after_stores(q_empty.index(qb))
        r0 += n_blocks
        tq += 1
        mbarrier.wait(q_ready.index(tq % 2), (tq // 2) & 1)
        pos = read_pos(pos_smem, tq % 2)


# arguments that follow the batch (token totals, sequence counts) or the head counts are not specialized on: one
# variant per config
@gluon.jit(do_not_specialize=['stride_lh', 'stride_sh', 'H', 'GROUP', 'dynamic'])
def dq_kernel(q_desc, k_desc, v_desc, do_desc, DQ, LSE, DELTA, CU_Q, CU_K, TILE_SEQ, TILE_BLK, ITEMS, COUNTER,
              stride_dqt, stride_dqh, stride_lh, sm_scale, qk_scale, H, GROUP, N_ITEMS, dq_desc,
              O, STATS, COLS, stride_ot, stride_oh, stride_sh, dynamic,
              CAUSAL: gl.constexpr, HEAD_D: gl.constexpr, HEAD_DV: gl.constexpr, STAGES: gl.constexpr):
    # work items: (128-row query tile, query head) in ITEMS' order; program p runs the launch positions p,
    # then p + P, ... (dynamic != 0: those it claims from COUNTER)
    n_items = gl.load(N_ITEMS)  # the item count, written on the device by the schedule's builder
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [4, HALF_M, HEAD_D], q_desc.layout)  # 2 buffers x 2 halves
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [4, HALF_M, HEAD_DV], do_desc.layout)
    KS: gl.constexpr = STAGES + 1  # as DqFlags.K_STAGES
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [KS, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DV], v_desc.layout)
    pos_smem = gl.allocate_shared_memory(gl.int32, [2, 32], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [KS, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [KS, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    tail_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(tail_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)  # both consumer groups release a Q/dO buffer
    for i in gl.static_range(KS):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # ... and every K and V buffer
    for i in gl.static_range(STAGES):
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=2)
    fence_async_shared()
    shared = (q_smem, do_smem, k_smem, v_smem, pos_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
              DQ, LSE, DELTA, ITEMS, TILE_SEQ, TILE_BLK, CU_Q, CU_K, H, GROUP, n_items,
              stride_dqt, stride_dqh, stride_lh, sm_scale, qk_scale, dq_desc, O, STATS, COLS, stride_ot, stride_oh,
              stride_sh)
    gl.warp_specialize([
        (_consumer, shared + (DqFlags(0, CAUSAL, HEAD_D, HEAD_DV, STAGES), )),
        (_consumer, shared + (DqFlags(1, CAUSAL, HEAD_D, HEAD_DV, STAGES), )),
        (_loader, (q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_smem, v_smem, pos_smem,
                   q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, tail_bar,
                   ITEMS, COUNTER, TILE_SEQ, TILE_BLK, CU_Q, CU_K, H, GROUP, n_items, dynamic,
                   DqFlags(2, CAUSAL, HEAD_D, HEAD_DV, STAGES))),
    ], [4, 1], [232, 40])


def compile_sm90(head_d=128, head_dv=128, stages=STAGES, causal=False, dtype="bf16"):
    """``dq_kernel`` compiled for sm_90 on any machine (pipeline.compile_sm90)."""
    m, n = HALF_M.value, BLOCK_N.value
    types = {"q_desc": desc_type(dtype, m, head_d), "k_desc": desc_type(dtype, n, head_d),
             "v_desc": desc_type(dtype, n, head_dv), "do_desc": desc_type(dtype, m, head_dv), "DQ": "*" + dtype,
             "LSE": "*fp32", "DELTA": "*fp32", "CU_Q": "*i32", "CU_K": "*i32", "TILE_SEQ": "*i32",
             "TILE_BLK": "*i32", "ITEMS": "*i32", "COUNTER": "*i32", "stride_dqt": "i32", "stride_dqh": "i32",
             "stride_lh": "i32", "sm_scale": "fp32", "qk_scale": "fp32", "H": "i32", "GROUP": "i32",
             "N_ITEMS": "*i32", "dq_desc": desc_type(dtype, m, head_d), "O": "*" + dtype, "STATS": "*fp32",
             "COLS": "*i32", "stride_ot": "i32", "stride_oh": "i32", "stride_sh": "i32", "dynamic": "i32"}
    return _compile(dq_kernel, types, dict(CAUSAL=causal, HEAD_D=head_d, HEAD_DV=head_dv, STAGES=stages))
