"""Hopper (sm_90) dK/dV pass written in Gluon, laid out like kernels/gluon_fwd.py.

* A work item is one 128-key block of one sequence and one kv head.  The two consumer warp groups
  own 64 keys each: their K and V halves stay in shared memory for the whole item, and their dK / dV
  accumulators in registers.  For every query head of the kv head's group and every query block
  (BLOCK_M rows, 32 or 64: jfa.GLUON_BWD_BLOCK_M) that sees the keys, a one-warp loader streams the Q
  block and the dO block through TMA into a ring of ``STAGES`` buffers shared by both groups (ready /
  empty mbarriers, empty needs both).
* Per block and group (keys x rows, all transposed so the keys stay the MMA's M extent):
  S^T = K Q^T, P^T = exp2(S^T * scale * log2(e) - LSE * log2(e)), dV += P^T dO, dP^T = V dO^T,
  dS^T = P^T (dP^T - delta), dK += dS^T Q; dK is scaled once at the end.  dQ is left to a dQ kernel,
  so the backward stays deterministic, unless ``FUSE_DQ`` (jfa.BWD_DQ_MODE = "atomic"): then each group
  also stores dS^T to shared memory and computes its part of dQ^T = K^T dS^T, adding each 64-row
  (head-dim) piece with one TMA reduce-add into a transposed fp32 buffer [Hq * D, columns] that the host
  scales and transposes at the end: five matmuls per block pair instead of the separate kernel's seven,
  summation order not fixed.  Every sequence starts at a column that is a multiple of 4: a TMA reduce-add
  whose innermost coordinate is not 16-byte aligned stops the kernel with an illegal instruction on the
  H200 (measured, PERF.md v14).  ``FUSE_DQ == 1``: each group covers the whole head dim over its own 64
  keys; ``FUSE_DQ == 2`` (head dim 128): each group one half of the head dim over all 128 keys, the two
  groups' dS^T meeting in shared memory at an mbarrier, which halves the reduce traffic (FA3's split).
  The loader then also zeroes the K / V rows past a ragged key block's end, and columns past a ragged
  query block's end are added as exact zeros.  ``DQ_BUFS`` (1 or 2) shared-memory buffers per group stage
  the fp32 parts: with two, writing one part does not wait for the TMA unit to have read the previous one.
* Items are claimed as in the forward (``DYNAMIC``: an atomic counter; else round-robin), and the
  loader names each item to the consumers through shared memory; K/V are double-buffered across
  items, so the loader fetches the next item's K/V while the consumers finish the current one.
* Rows past a sequence end: the descriptors cover the packed 2-D views, so a ragged last query block
  reads the next sequence's rows (or zero fill past the tensor end).  P^T is masked to 0 there, and the
  loader zeroes the Q and dO rows past the end before publishing the block, since ``0 * inf`` inside an
  MMA is NaN.  Key rows past the end are computed and never stored (each key's dK / dV row depends on
  that key's row of S^T only).

* Two block orders (jfa.GLUON_BWD_ORDER; ``ORDER`` 0, 1): ``plain`` (_block: each block's four MMAs
  retired inside it) and ``overlap`` (_overlapped_item: the forward's order, block t's S^T / dP^T ahead
  of block t-1's dV / dK).  Neither leaves an MMA in flight across a loop's back edge: ptxas then
  serializes every wgmma of the kernel (PERF.md v12, pinned by tests/test_gluon_compile.py).  A third,
  two blocks per iteration, was slower than ``overlap`` and wrong on two causal cases (PERF.md v18).

* Each block's LSE (log2 domain) and delta come with its Q and dO, by TMA into the same ring stage
  (the Gluon dQ kernel, run first, writes them, or else jfa's preprocess pass; each sequence from a 16-byte
  aligned column: jfa.AlignedColumns).
  Read by the consumers from global memory, they cost a full memory latency per block (PERF.md v17).

Status (H200, PERF.md v11-v17): exact against the float64 reference at 1-3 stages on all three grids,
with 32- or 64-row blocks and with dQ fused, once every block runs the masked code (see _block).  Since
v17 (statistics by TMA) faster than the tl dK/dV kernel on all six bench shapes in the plain order at
three stages (+3% to +14%), the default on sm_90 at head dim 128 (jfa.BWD_KV_KERNEL "auto"); the
overlapped order and 64-row blocks are level with it; the fused dQ was slower than the separate dQ
kernel on every bench shape (v15, before v17).

Conventions as the rest of kernels/: natural-log LSE [Hq, rows] with -inf for rows that see no key,
bottom-right causal, broadcast-Q output (and dO) row b * Lq + i.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.language.nvidia.hopper import tma
from triton.language.core import _aggregate as aggregate

from .gluon_fwd import (_next_pos, _publish_pos, _read_pos, _zero_rows_from, partition_barrier,
                        release_after_stores, store_rows, tma_load)


def _tma_reduce_add_builtin():
    # TMA bulk reduce-add of a shared tile into global memory.  Gluon in Triton 3.6 has the op
    # (GluonOpBuilder.create_async_tma_reduce, as tl's descriptor atomic_add uses) but no public name
    # for it yet, so it is wrapped here the way gluon's own tma.async_copy_shared_to_global is.
    from triton._C.libtriton import ir
    from triton.experimental.gluon.language._core import builtin

    @builtin
    def reduce_add(tensor_desc, coord, src, _semantic=None):
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                                  src.handle)
    return reduce_add


tma_reduce_add = _tma_reduce_add_builtin()

# (constexpr globals: the jitted code reads them; the host reads .value)
HALF_N = gl.constexpr(64)  # keys per consumer warp group: one wgmma M-extent
BLOCK_N = gl.constexpr(128)  # keys per item
DQ_ROWS = gl.constexpr(64)  # FUSE_DQ: head-dim rows of one dQ^T partial (one wgmma M-extent, one TMA add)
DQ_COLS = gl.constexpr(32)  # FUSE_DQ: its query rows, so BLOCK_M must be 32 then
# the [1, BLOCK_M] fp32 boxes of the backward statistics: unswizzled, since a stage's box is 128 or 256
# bytes and a swizzled TMA destination must start on a 1,024-byte boundary
STATS_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


@aggregate
class BwdFlags:
    """Compile-time flags for the partitions (worker partitions receive only IR values)."""
    WG: gl.constexpr
    BROADCAST: gl.constexpr
    CAUSAL: gl.constexpr
    HEAD_D: gl.constexpr
    HEAD_DV: gl.constexpr
    STAGES: gl.constexpr
    GROUPED: gl.constexpr
    DYNAMIC: gl.constexpr
    ORDER: gl.constexpr
    FUSE_DQ: gl.constexpr
    DQ_BUFS: gl.constexpr
    BLOCK_M: gl.constexpr
    TMA_STORE: gl.constexpr
    REG_OPERAND: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, WG, BROADCAST, CAUSAL, HEAD_D, HEAD_DV, STAGES, GROUPED, DYNAMIC, ORDER, FUSE_DQ,
                 DQ_BUFS, BLOCK_M, TMA_STORE, REG_OPERAND):
        self.WG = gl.constexpr(WG)
        self.BROADCAST = gl.constexpr(BROADCAST)
        self.CAUSAL = gl.constexpr(CAUSAL)
        self.HEAD_D = gl.constexpr(HEAD_D)
        self.HEAD_DV = gl.constexpr(HEAD_DV)
        self.STAGES = gl.constexpr(STAGES)
        self.GROUPED = gl.constexpr(GROUPED)
        self.DYNAMIC = gl.constexpr(DYNAMIC)
        self.ORDER = gl.constexpr(ORDER)
        self.FUSE_DQ = gl.constexpr(FUSE_DQ)
        self.DQ_BUFS = gl.constexpr(DQ_BUFS)
        self.BLOCK_M = gl.constexpr(BLOCK_M)
        self.TMA_STORE = gl.constexpr(TMA_STORE)
        self.REG_OPERAND = gl.constexpr(REG_OPERAND)


@gluon.jit
def _kv_item(pos, ITEMS, HKV, TILE_SEQ, TILE_BLK, CU_Q, CU_K,
             BROADCAST: gl.constexpr, CAUSAL: gl.constexpr, GROUPED: gl.constexpr, BLOCK_M: gl.constexpr):
    # where the item at launch position ``pos`` (item = tile * HKV + kv head) reads and writes, and
    # the query blocks it visits: m_lo, m_lo + BLOCK_M, ... below lq
    if GROUPED:
        item = gl.load(ITEMS + pos)
    else:
        item = pos
    tile = item // HKV
    hk = item % HKV
    b = gl.load(TILE_SEQ + tile)
    nblk = gl.load(TILE_BLK + tile)
    k_start = gl.load(CU_K + b).to(gl.int32)
    lk = gl.load(CU_K + b + 1).to(gl.int32) - k_start
    if BROADCAST:
        q_start = k_start * 0
        lq = gl.load(CU_Q + 1).to(gl.int32)
        o_start = lq * b
    else:
        q_start = gl.load(CU_Q + b).to(gl.int32)
        lq = gl.load(CU_Q + b + 1).to(gl.int32) - q_start
        o_start = q_start
    n0 = nblk * BLOCK_N
    diag = lk - lq
    if CAUSAL:
        # rows below n0 - diag see none of these keys
        m_lo = (gl.maximum(n0 - diag, 0) // BLOCK_M) * BLOCK_M
    else:
        m_lo = n0 * 0
    n_steps = gl.maximum(lq - m_lo + BLOCK_M - 1, 0) // BLOCK_M
    return q_start, o_start, lq, k_start, lk, hk, n0, diag, m_lo, n_steps, b


@gluon.jit
def _loader(q_desc, k_desc, v_desc, do_desc, stats_desc, q_smem, do_smem, stats_smem, k_smem, v_smem, pos_smem,
            kv_ready, kv_empty, qdo_ready, qdo_empty, tail_bar,
            ITEMS, COUNTER, TILE_SEQ, TILE_BLK, CU_Q, CU_K, CU_COLS, HKV, GROUP, n_items, flags):
    HEAD_D: gl.constexpr = flags.HEAD_D
    HEAD_DV: gl.constexpr = flags.HEAD_DV
    STAGES: gl.constexpr = flags.STAGES
    BLOCK_M: gl.constexpr = flags.BLOCK_M
    HQ = HKV * GROUP
    # one block's Q, dO and its rows' two statistics (log2-domain LSE, delta: rows h and HQ + h of stats_desc)
    block_bytes: gl.constexpr = (q_desc.block_type.nbytes + do_desc.block_type.nbytes
                                 + 2 * stats_desc.block_type.nbytes)
    r = 0  # ring position of the next Q/dO block (runs on across items)
    n_tails = 0
    tk = 0  # items so far: K/V buffer tk % 2
    pos = gl.program_id(0)
    while pos < n_items:
        q_start, o_start, lq, k_start, lk, hk, n0, diag, m_lo, n_steps, b = _kv_item(
            pos, ITEMS, HKV, TILE_SEQ, TILE_BLK, CU_Q, CU_K, flags.BROADCAST, flags.CAUSAL, flags.GROUPED,
            flags.BLOCK_M)
        col0 = gl.load(CU_COLS + b)  # the sequence's first column of the statistics
        kb = tk % 2
        # a fresh barrier counts as having completed the phase before 0, so first rounds do not wait
        mbarrier.wait(kv_empty.index(kb), ((tk // 2) & 1) ^ 1)
        _publish_pos(pos_smem, kb, pos)
        kv_bytes: gl.constexpr = 2 * (k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        if flags.FUSE_DQ and n0 + BLOCK_N > lk:
            # A ragged key block with dQ fused: dQ^T = K^T dS^T sums over every key row of the block, so
            # the rows past lk (the next sequence's, maybe not finite) are zeroed before the consumers
            # see them (0 * inf inside an MMA is NaN); zero K and V rows give finite dS^T rows there.
            mbarrier.expect(tail_bar, kv_bytes)
            for half in gl.static_range(2):
                tma_load(k_desc, [k_start + n0 + half * HALF_N, hk * HEAD_D], tail_bar, k_smem.index(2 * kb + half))
                tma_load(v_desc, [k_start + n0 + half * HALF_N, hk * HEAD_DV], tail_bar,
                         v_smem.index(2 * kb + half))
            mbarrier.wait(tail_bar, n_tails & 1)
            for half in gl.static_range(2):
                _zero_rows_from(k_smem.index(2 * kb + half), lk - n0 - half * HALF_N, HALF_N, HEAD_D)
                _zero_rows_from(v_smem.index(2 * kb + half), lk - n0 - half * HALF_N, HALF_N, HEAD_DV)
            fence_async_shared()
            mbarrier.arrive(kv_ready.index(kb))
            n_tails += 1
        else:
            mbarrier.expect(kv_ready.index(kb), kv_bytes)
            for half in gl.static_range(2):
                tma_load(k_desc, [k_start + n0 + half * HALF_N, hk * HEAD_D], kv_ready.index(kb),
                         k_smem.index(2 * kb + half))
                tma_load(v_desc, [k_start + n0 + half * HALF_N, hk * HEAD_DV], kv_ready.index(kb),
                         v_smem.index(2 * kb + half))
        for g in range(GROUP):
            h = hk * GROUP + g
            for j in range(n_steps):
                m = m_lo + j * BLOCK_M
                s = r % STAGES
                mbarrier.wait(qdo_empty.index(s), ((r // STAGES) & 1) ^ 1)
                if m + BLOCK_M <= lq:
                    mbarrier.expect(qdo_ready.index(s), block_bytes)
                    _load_block(q_desc, do_desc, stats_desc, q_smem, do_smem, stats_smem, s, q_start + m,
                                o_start + m, col0 + m, h, HQ, HEAD_D, HEAD_DV, qdo_ready.index(s))
                else:
                    # the ragged last block (one per query head and item): zero the rows past lq (the
                    # statistics past lq are masked where they are read)
                    mbarrier.expect(tail_bar, block_bytes)
                    _load_block(q_desc, do_desc, stats_desc, q_smem, do_smem, stats_smem, s, q_start + m,
                                o_start + m, col0 + m, h, HQ, HEAD_D, HEAD_DV, tail_bar)
                    mbarrier.wait(tail_bar, n_tails & 1)
                    _zero_rows_from(q_smem.index(s), lq - m, BLOCK_M, HEAD_D)
                    _zero_rows_from(do_smem.index(s), lq - m, BLOCK_M, HEAD_DV)
                    fence_async_shared()
                    mbarrier.arrive(qdo_ready.index(s))
                    n_tails += 1
                r += 1
        tk += 1
        pos = _next_pos(pos, COUNTER, flags.DYNAMIC)
    # no more items: a K/V buffer holding a position past the end stops the consumers
    kb = tk % 2
    mbarrier.wait(kv_empty.index(kb), ((tk // 2) & 1) ^ 1)
    _publish_pos(pos_smem, kb, n_items)
    mbarrier.arrive(kv_ready.index(kb))


@gluon.jit
def _load_block(q_desc, do_desc, stats_desc, q_smem, do_smem, stats_smem, s, q_row, o_row, col, h, HQ,
                HEAD_D: gl.constexpr, HEAD_DV: gl.constexpr, bar):
    tma_load(q_desc, [q_row, h * HEAD_D], bar, q_smem.index(s))
    tma_load(do_desc, [o_row, h * HEAD_DV], bar, do_smem.index(s))
    # LSE and delta come with the block, as FA3 loads them: read from global memory by the consumers,
    # they were a full memory latency on every block's critical path (ptxas issues the loads after the
    # wait for S^T / dP^T, next to their use).  Their column (a sequence starts at a multiple of 4, see
    # jfa.AlignedColumns) keeps the TMA coordinate 16-byte aligned: unaligned, the H200 stops the kernel
    # with an illegal instruction
    tma_load(stats_desc, [h, col], bar, stats_smem.index(2 * s))
    tma_load(stats_desc, [HQ + h, col], bar, stats_smem.index(2 * s + 1))


@gluon.jit
def _row_stats(stats_smem, s, row_ok, s_layout: gl.constexpr):
    # [1, BLOCK_M] log2-domain LSE (+inf where a row sees no key: its P is 0) and delta of ring buffer s;
    # rows past lq hold the next sequence's (or TMA's zero fill) and are masked here
    ok = gl.expand_dims(row_ok, 0)
    lse2 = gl.where(ok, stats_smem.index(2 * s).load(s_layout), float("inf"))
    delta = gl.where(ok, stats_smem.index(2 * s + 1).load(s_layout), 0.0)
    return lse2, delta


@gluon.jit
def _block(dk, dv, k_half, k_a, v_half, q_s, do_s, stats_smem, s, keys, rows, lq, diag, qk_scale,
           CAUSAL: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr,
           ds_layout: gl.constexpr, ds_s, dq_smem, dq_desc, dq_coord, FUSE_DQ: gl.constexpr, HEAD_D: gl.constexpr,
           WG: gl.constexpr, k_lo, k_hi, ds_ready, r, DQ_BUFS: gl.constexpr, BLOCK_M: gl.constexpr):
    # one query block against this group's 64 keys: S^T and dP^T first (k_a: K as S^T's A operand, in
    # shared memory or registers), then the two accumulating MMAs (and, FUSE_DQ, this group's share of the
    # block's dQ)
    st = warpgroup_mma(k_a, q_s.permute((1, 0)), gl.zeros([HALF_N, BLOCK_M], gl.float32, s_layout),
                       use_acc=False, is_async=True)
    dpt = warpgroup_mma(v_half, do_s.permute((1, 0)), gl.zeros([HALF_N, BLOCK_M], gl.float32, s_layout),
                        use_acc=False, is_async=True)
    row_ok = rows < lq
    lse2, delta = _row_stats(stats_smem, s, row_ok, s_layout)
    st, dpt = warpgroup_mma_wait(0, deps=(st, dpt))
    pt = gl.exp2(st * qk_scale - lse2)
    # Every block is masked, also those that need no mask: with a separate unmasked path, Triton 3.6
    # compiled that path wrong on the H200 once the Q/dO ring had two or more stages and D == Dv
    # (PERF.md v11); the selects cost little next to the four MMAs.
    keep = gl.expand_dims(row_ok, 0)
    if CAUSAL:
        keep = keep & (gl.expand_dims(keys, 1) <= gl.expand_dims(rows, 0) + diag)
    pt = gl.where(keep, pt, 0.0)
    p_op = gl.convert_layout(pt.to(do_s.dtype), p_layout)
    dv = warpgroup_mma(p_op, do_s, dv, is_async=True)
    dst = pt * (dpt - delta)
    ds_op = gl.convert_layout(dst.to(q_s.dtype), ds_layout)
    dk = warpgroup_mma(ds_op, q_s, dk, is_async=True)
    if FUSE_DQ == 1:
        # dQ^T (head dim x rows) = K^T dS^T over this group's 64 keys: dS^T goes through shared memory
        # (an MMA's B operand), and each 64-row half of the fp32 partial is added into the transposed dQ
        # buffer by one TMA reduce-add, as the other group's partial and every other key block's are.
        ds_s.store(dst.to(q_s.dtype))
        fence_async_shared()
        # dV / dK retire first: their register operands and the dQ^T accumulator together spill
        dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, p_op, ds_op))
        partition_barrier()
        HALVES: gl.constexpr = HEAD_D // DQ_ROWS
        for half in gl.static_range(HALVES):
            dqt = warpgroup_mma(k_half.permute((1, 0)).slice(half * DQ_ROWS, DQ_ROWS), ds_s,
                                gl.zeros([DQ_ROWS, BLOCK_M], gl.float32, s_layout), use_acc=False, is_async=True)
            dqt = warpgroup_mma_wait(0, deps=(dqt,))
            _add_dq_part(dqt, row_ok, _dq_buffer(dq_smem, WG, r * HALVES + half, DQ_BUFS), dq_desc,
                         [dq_coord[0] + half * DQ_ROWS, dq_coord[1]], DQ_BUFS)
    elif FUSE_DQ == 2:
        # dQ^T's head-dim half WG over all 128 keys: both groups write their dS^T rows into one shared
        # [128 keys, rows] buffer (two of them, alternating by block), meet at an mbarrier, and each adds
        # 64 x 32 fp32 per block: half the reduce traffic of FUSE_DQ == 1.  The barrier of block r + 1 also
        # tells a group that the other one has finished reading buffer r % 2.
        buf = r % 2
        ds_all = ds_s.index(buf)
        ds_all.slice(WG * HALF_N, HALF_N).store(dst.to(q_s.dtype))
        fence_async_shared()
        dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, p_op, ds_op))
        partition_barrier()
        mbarrier.arrive(ds_ready.index(buf))
        mbarrier.wait(ds_ready.index(buf), (r // 2) & 1)
        dqt = warpgroup_mma(k_lo.permute((1, 0)).slice(WG * DQ_ROWS, DQ_ROWS), ds_all.slice(0, HALF_N),
                            gl.zeros([DQ_ROWS, BLOCK_M], gl.float32, s_layout), use_acc=False, is_async=True)
        dqt = warpgroup_mma(k_hi.permute((1, 0)).slice(WG * DQ_ROWS, DQ_ROWS), ds_all.slice(HALF_N, HALF_N),
                            dqt, is_async=True)
        dqt = warpgroup_mma_wait(0, deps=(dqt,))
        _add_dq_part(dqt, row_ok, _dq_buffer(dq_smem, WG, r, DQ_BUFS), dq_desc,
                     [dq_coord[0] + WG * DQ_ROWS, dq_coord[1]], DQ_BUFS)
    else:
        dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, p_op, ds_op))
    return dk, dv


@gluon.jit
def _dq_buffer(dq_smem, WG: gl.constexpr, n_adds, DQ_BUFS: gl.constexpr):
    # the staging buffer of this group's add number n_adds: DQ_BUFS per group, in turn
    return dq_smem.index(WG * DQ_BUFS + n_adds % DQ_BUFS)


@gluon.jit
def _add_dq_part(dqt, row_ok, dq_s, dq_desc, coord, DQ_BUFS: gl.constexpr):
    # one [64 head-dim rows, 32 query rows] fp32 part of dQ^T, added into the global buffer by a TMA
    # reduce-add.  The block's columns past lq are the next sequence's rows: exact zeros go there (with
    # non-finite K here, K^T times a zero dS^T column is NaN).
    dqt = gl.where(gl.expand_dims(row_ok, 0), dqt, 0.0)
    # this buffer's previous add (DQ_BUFS adds ago; bulk groups finish in order) has read it; with two
    # buffers the add just issued from the other one stays in flight
    tma.store_wait(DQ_BUFS - 1)
    partition_barrier()
    dq_s.store(dqt)
    fence_async_shared()
    partition_barrier()
    tma_reduce_add(dq_desc, coord, dq_s)


@gluon.jit
def _p_ds(st, dpt, stats_smem, s, keys, rows, lq, diag, qk_scale, dtype: gl.constexpr,
          CAUSAL: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr, ds_layout: gl.constexpr):
    # P^T and dS^T of one block as the dV and dK MMAs' register operands (every block masked, as in _block)
    row_ok = rows < lq
    lse2, delta = _row_stats(stats_smem, s, row_ok, s_layout)
    pt = gl.exp2(st * qk_scale - lse2)
    keep = gl.expand_dims(row_ok, 0)
    if CAUSAL:
        keep = keep & (gl.expand_dims(keys, 1) <= gl.expand_dims(rows, 0) + diag)
    pt = gl.where(keep, pt, 0.0)
    dst = pt * (dpt - delta)
    return gl.convert_layout(pt.to(dtype), p_layout), gl.convert_layout(dst.to(dtype), ds_layout)


@gluon.jit
def _issue_st_dpt(k_a, v_half, q_s, do_s, s_layout: gl.constexpr, BLOCK_M: gl.constexpr):
    st = warpgroup_mma(k_a, q_s.permute((1, 0)), gl.zeros([HALF_N, BLOCK_M], gl.float32, s_layout),
                       use_acc=False, is_async=True)
    dpt = warpgroup_mma(v_half, do_s.permute((1, 0)), gl.zeros([HALF_N, BLOCK_M], gl.float32, s_layout),
                        use_acc=False, is_async=True)
    return st, dpt


@gluon.jit
def _block_rows(t, n_steps, m_lo, s_layout: gl.constexpr, BLOCK_M: gl.constexpr):
    # query rows of the item's block t (query head t // n_steps of the group, row block t % n_steps)
    return m_lo + (t % n_steps) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))


@gluon.jit
def _accumulate_and_drain(dk, dv, p_op, ds_op, q_s, do_s):
    # dV += P^T dO and dK += dS^T Q, then a wait for both: nothing of the group's is left in flight
    dv = warpgroup_mma(p_op, do_s, dv, is_async=True)
    dk = warpgroup_mma(ds_op, q_s, dk, is_async=True)
    dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, p_op, ds_op))
    return dk, dv


@gluon.jit
def _overlapped_item(dk, dv, k_a, v_half, q_smem, do_smem, stats_smem, qdo_ready, qdo_empty, r, keys,
                     lq, diag, qk_scale, m_lo, n_steps, n_blocks, STAGES: gl.constexpr,
                     CAUSAL: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr,
                     ds_layout: gl.constexpr, BLOCK_M: gl.constexpr):
    # The forward's order over the item's blocks t (query head t // n_steps, rows block t % n_steps):
    # block t's S^T and dP^T are issued, then block t-1's dV and dK; a wait for S^T and dP^T alone
    # (dV / dK of t-1 stay in flight) and block t's P / dS are computed while they run; a wait for
    # them, which frees block t-1's Q/dO buffer.  No MMA is in flight across the loop's back edge:
    # ptxas serializes every wgmma of the kernel when an accumulator is (PERF.md v12).
    if n_blocks > 0:
        s = r % STAGES
        mbarrier.wait(qdo_ready.index(s), (r // STAGES) & 1)
        st, dpt = _issue_st_dpt(k_a, v_half, q_smem.index(s), do_smem.index(s), s_layout, BLOCK_M)
        st, dpt = warpgroup_mma_wait(0, deps=(st, dpt))
        p_prev, ds_prev = _p_ds(st, dpt, stats_smem, s, keys, _block_rows(0, n_steps, m_lo, s_layout, BLOCK_M), lq,
                                diag, qk_scale, q_smem.dtype, CAUSAL, s_layout, p_layout, ds_layout)
        for t in range(1, n_blocks):
            rt = r + t
            s = rt % STAGES
            sp = (rt - 1) % STAGES
            mbarrier.wait(qdo_ready.index(s), (rt // STAGES) & 1)
            st, dpt = _issue_st_dpt(k_a, v_half, q_smem.index(s), do_smem.index(s), s_layout, BLOCK_M)
            dv_run = warpgroup_mma(p_prev, do_smem.index(sp), dv, is_async=True)
            dk_run = warpgroup_mma(ds_prev, q_smem.index(sp), dk, is_async=True)
            st, dpt = warpgroup_mma_wait(2, deps=(st, dpt))
            p_op, ds_op = _p_ds(st, dpt, stats_smem, s, keys, _block_rows(t, n_steps, m_lo, s_layout, BLOCK_M), lq,
                                diag, qk_scale, q_smem.dtype, CAUSAL, s_layout, p_layout, ds_layout)
            dv, dk, p_prev, ds_prev = warpgroup_mma_wait(0, deps=(dv_run, dk_run, p_prev, ds_prev))
            mbarrier.arrive(qdo_empty.index(sp))
            p_prev = p_op
            ds_prev = ds_op
        sl = (r + n_blocks - 1) % STAGES
        dk, dv = _accumulate_and_drain(dk, dv, p_prev, ds_prev, q_smem.index(sl), do_smem.index(sl))
        mbarrier.arrive(qdo_empty.index(sl))
    return dk, dv


@gluon.jit
def _consumer(q_smem, do_smem, stats_smem, k_smem, v_smem, pos_smem, kv_ready, kv_empty, qdo_ready, qdo_empty,
              DK, DV, ITEMS, TILE_SEQ, TILE_BLK, CU_Q, CU_K, HKV, GROUP, n_items,
              stride_dkt, stride_dkh, stride_dvt, stride_dvh, sm_scale, qk_scale, ds_smem, dq_smem,
              dq_desc, CU_COLS, ds_ready, dk_desc, dv_desc, flags):
    WG: gl.constexpr = flags.WG
    CAUSAL: gl.constexpr = flags.CAUSAL
    HEAD_D: gl.constexpr = flags.HEAD_D
    HEAD_DV: gl.constexpr = flags.HEAD_DV
    STAGES: gl.constexpr = flags.STAGES
    BLOCK_M: gl.constexpr = flags.BLOCK_M
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    dk_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_D, 16])
    dv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DV, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dv_layout, k_width=2)
    ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dk_layout, k_width=2)
    r = 0
    tk = 0
    mbarrier.wait(kv_ready.index(0), 0)
    pos = _read_pos(pos_smem, 0)
    while pos < n_items:
        q_start, o_start, lq, k_start, lk, hk, n0, diag, m_lo, n_steps, b = _kv_item(
            pos, ITEMS, HKV, TILE_SEQ, TILE_BLK, CU_Q, CU_K, flags.BROADCAST, CAUSAL, flags.GROUPED, BLOCK_M)
        # FUSE_DQ: the sequence's first column of the dQ^T buffer (a multiple of 4, see jfa.AlignedColumns)
        dq_col = o_start
        if flags.FUSE_DQ:
            dq_col = gl.load(CU_COLS + b)
        kb = tk % 2
        k_half = k_smem.index(2 * kb + WG)
        v_half = v_smem.index(2 * kb + WG)
        kw = n0 + WG * HALF_N  # this group's first key
        keys = kw + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, s_layout))
        if flags.REG_OPERAND:
            # the item's K half as S^T's A operand in registers (loaded once per item): S^T's MMAs then read
            # only Q^T from shared memory, whose bandwidth 32-row blocks otherwise strain
            k_a = k_half.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
        else:
            k_a = k_half
        dk = gl.zeros([HALF_N, HEAD_D], gl.float32, dk_layout)
        dv = gl.zeros([HALF_N, HEAD_DV], gl.float32, dv_layout)
        if flags.ORDER == 1:
            dk, dv = _overlapped_item(dk, dv, k_a, v_half, q_smem, do_smem, stats_smem, qdo_ready, qdo_empty,
                                      r, keys, lq, diag, qk_scale, m_lo, n_steps, GROUP * n_steps,
                                      STAGES, CAUSAL, s_layout, p_layout, ds_layout, BLOCK_M)
            r += GROUP * n_steps
        else:
            for g in range(GROUP):
                for j in range(n_steps):
                    m = m_lo + j * BLOCK_M
                    s = r % STAGES
                    mbarrier.wait(qdo_ready.index(s), (r // STAGES) & 1)
                    rows = m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
                    dk, dv = _block(dk, dv, k_half, k_a, v_half, q_smem.index(s), do_smem.index(s), stats_smem, s,
                                    keys, rows, lq, diag, qk_scale, CAUSAL, s_layout, p_layout,
                                    ds_layout, ds_smem if flags.FUSE_DQ == 2 else ds_smem.index(WG),
                                    dq_smem, dq_desc, [(hk * GROUP + g) * HEAD_D, dq_col + m],
                                    flags.FUSE_DQ, HEAD_D, WG, k_smem.index(2 * kb), k_smem.index(2 * kb + 1),
                                    ds_ready, r, flags.DQ_BUFS, BLOCK_M)
                    mbarrier.arrive(qdo_empty.index(s))
                    r += 1
        # every MMA reading this item's K/V is done
        dk = (dk * sm_scale).to(DK.dtype.element_ty)
        dv = dv.to(DV.dtype.element_ty)
        if not flags.TMA_STORE:
            mbarrier.arrive(kv_empty.index(kb))
        # TMA_STORE: whole tiles leave through this group's own K / V half (no MMA reads it any more; the
        # other group reads only its own half), released once the TMA stores have read it
        store_rows(dk, k_half, dk_desc, DK + hk * stride_dkh, k_start + kw, lk - kw, hk * HEAD_D, stride_dkt,
                   flags.TMA_STORE, dk_layout)
        store_rows(dv, v_half, dv_desc, DV + hk * stride_dvh, k_start + kw, lk - kw, hk * HEAD_DV, stride_dvt,
                   flags.TMA_STORE, dv_layout)
        if flags.TMA_STORE:
            release_after_stores(kv_empty.index(kb))
        tk += 1
        mbarrier.wait(kv_ready.index(tk % 2), (tk // 2) & 1)
        pos = _read_pos(pos_smem, tk % 2)
    if flags.FUSE_DQ:
        tma.store_wait(0)  # the last add has read shared memory before the CTA exits


@gluon.jit
def dkdv_kernel(q_desc, k_desc, v_desc, do_desc, stats_desc, DK, DV, CU_Q, CU_K, TILE_SEQ, TILE_BLK, ITEMS,
                COUNTER, stride_dkt, stride_dkh, stride_dvt, stride_dvh, sm_scale, qk_scale,
                HKV, GROUP, n_items, dq_desc, CU_COLS, dk_desc, dv_desc,
                BROADCAST: gl.constexpr, CAUSAL: gl.constexpr, HEAD_D: gl.constexpr, HEAD_DV: gl.constexpr,
                STAGES: gl.constexpr, GROUPED: gl.constexpr = False, DYNAMIC: gl.constexpr = False,
                ORDER: gl.constexpr = 0, FUSE_DQ: gl.constexpr = 0, DQ_BUFS: gl.constexpr = 1,
                BLOCK_M: gl.constexpr = 32, TMA_STORE: gl.constexpr = False, REG_OPERAND: gl.constexpr = False):
    # work items: (128-key block, kv head) in ITEMS' order under GROUPED (else heaviest first);
    # program p runs the launch positions p, then p + P, ... (DYNAMIC: those it claims from COUNTER)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_M, HEAD_D], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, HEAD_DV], do_desc.layout)
    # per stage: the block's log2-domain LSE, then its delta (jfa's backward statistics buffer)
    stats_smem = gl.allocate_shared_memory(gl.float32, [2 * STAGES, 1, BLOCK_M], stats_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [4, HALF_N, HEAD_D], k_desc.layout)  # 2 buffers x 2 halves
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [4, HALF_N, HEAD_DV], v_desc.layout)
    pos_smem = gl.allocate_shared_memory(gl.int32, [2, 32], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    # FUSE_DQ: dS^T (the dQ MMA's B operand: each group's, or both groups' in two alternating buffers) and
    # each group's fp32 dQ^T parts (the TMA adds' sources, DQ_BUFS per group)
    # TMA_STORE writes dK / dV through a group's K / V half, which FUSE_DQ == 2's dQ MMA reads from both groups
    gl.static_assert(not (TMA_STORE and FUSE_DQ == 2), "TMA_STORE needs FUSE_DQ != 2")
    # K in registers beside the overlapped order's, 64-row blocks' or the fused dQ's extra live tiles: Triton
    # 3.6's ptxas serializes every wgmma (overlapped; 64 rows, with ~100 spills) or spills ~50 registers (fused)
    gl.static_assert(not REG_OPERAND or (ORDER == 0 and FUSE_DQ == 0 and BLOCK_M == 32),
                     "REG_OPERAND needs the plain order, 32-row blocks, no FUSE_DQ")
    if FUSE_DQ:
        gl.static_assert(BLOCK_M == DQ_COLS, "the fused dQ adds 32-row parts")
        gl.static_assert(FUSE_DQ == 1 or HEAD_D == 2 * DQ_ROWS,
                         "FUSE_DQ == 2 splits a head dim of 128 between the groups")
        DS_ROWS: gl.constexpr = BLOCK_N if FUSE_DQ == 2 else HALF_N
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([DS_ROWS, BLOCK_M], q_desc.dtype)
        ds_smem = gl.allocate_shared_memory(q_desc.dtype, [2, DS_ROWS, BLOCK_M], ds_layout)
        dq_smem = gl.allocate_shared_memory(gl.float32, [2 * DQ_BUFS, DQ_ROWS, BLOCK_M], dq_desc.layout)
    else:  # never touched; one element each (Triton 3.9 refuses empty buffers)
        ds_smem = gl.allocate_shared_memory(gl.float32, [2, 1, 1], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        dq_smem = gl.allocate_shared_memory(gl.float32, [2, 1, 1], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    qdo_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    qdo_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    tail_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # FUSE_DQ == 2
    mbarrier.init(tail_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=2)  # both groups have written their dS^T rows
    for i in gl.static_range(2):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)  # both consumer groups release a K/V buffer
    for i in gl.static_range(STAGES):
        mbarrier.init(qdo_ready.index(i), count=1)
        mbarrier.init(qdo_empty.index(i), count=2)  # ... and every Q/dO buffer
    fence_async_shared()
    shared = (q_smem, do_smem, stats_smem, k_smem, v_smem, pos_smem, kv_ready, kv_empty, qdo_ready, qdo_empty,
              DK, DV, ITEMS, TILE_SEQ, TILE_BLK, CU_Q, CU_K, HKV, GROUP, n_items,
              stride_dkt, stride_dkh, stride_dvt, stride_dvh, sm_scale, qk_scale, ds_smem, dq_smem, dq_desc,
              CU_COLS, ds_ready, dk_desc, dv_desc)
    # 64-row blocks hold 64 x 64 S^T / dP^T: the consumer groups take 240 registers and the loader 24 (FA3's
    # split), which keeps most spills out of the per-block loop (at 232: 10-29 local accesses in it)
    CONSUMER_REGS: gl.constexpr = 240 if BLOCK_M == 64 else 232
    LOADER_REGS: gl.constexpr = 24 if BLOCK_M == 64 else 40
    gl.warp_specialize([
        (_consumer, shared + (BwdFlags(0, BROADCAST, CAUSAL, HEAD_D, HEAD_DV, STAGES, GROUPED, DYNAMIC, ORDER,
                                       FUSE_DQ, DQ_BUFS, BLOCK_M, TMA_STORE, REG_OPERAND), )),
        (_consumer, shared + (BwdFlags(1, BROADCAST, CAUSAL, HEAD_D, HEAD_DV, STAGES, GROUPED, DYNAMIC, ORDER,
                                       FUSE_DQ, DQ_BUFS, BLOCK_M, TMA_STORE, REG_OPERAND), )),
        (_loader, (q_desc, k_desc, v_desc, do_desc, stats_desc, q_smem, do_smem, stats_smem, k_smem, v_smem, pos_smem,
                   kv_ready, kv_empty, qdo_ready, qdo_empty, tail_bar,
                   ITEMS, COUNTER, TILE_SEQ, TILE_BLK, CU_Q, CU_K, CU_COLS, HKV, GROUP, n_items,
                   BwdFlags(2, BROADCAST, CAUSAL, HEAD_D, HEAD_DV, STAGES, GROUPED, DYNAMIC, ORDER, FUSE_DQ,
                            DQ_BUFS, BLOCK_M, TMA_STORE, REG_OPERAND))),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


def compile_sm90(head_d=128, head_dv=128, stages=2, causal=False, broadcast=False, dtype="bf16",
                 grouped=False, dynamic=False, order=0, fuse_dq=0, dq_bufs=1, block_m=32, tma_store=False,
                 reg_operand=False):
    """Compile ``dkdv_kernel`` for sm_90 without a GPU (Triton's bundled ptxas), as
    gluon_fwd.compile_sm90 does for the forward.  ``order`` is the kernel's ORDER (0 plain, 1 overlap:
    the index of jfa.GLUON_BWD_ORDER in jfa.GLUON_BWD_ORDERS)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    gdt = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]

    def desc(rows, cols, dt=dtype, gdt=gdt):
        return f"tensordesc<{dt}[{rows}, {cols}],{gl.NVMMASharedLayout.get_default_for([rows, cols], gdt)!r}>"

    signature = {
        "q_desc": desc(block_m, head_d), "k_desc": desc(HALF_N.value, head_d),
        "v_desc": desc(HALF_N.value, head_dv), "do_desc": desc(block_m, head_dv),
        "stats_desc": f"tensordesc<fp32[1, {block_m}],{STATS_LAYOUT!r}>", "DK": "*" + dtype, "DV": "*" + dtype,
        "CU_Q": "*i32", "CU_K": "*i32", "TILE_SEQ": "*i32", "TILE_BLK": "*i32", "ITEMS": "*i32", "COUNTER": "*i32",
        "stride_dkt": "i32", "stride_dkh": "i32", "stride_dvt": "i32", "stride_dvh": "i32",
        "sm_scale": "fp32", "qk_scale": "fp32", "HKV": "i32", "GROUP": "i32", "n_items": "i32",
        "dq_desc": desc(DQ_ROWS.value, DQ_COLS.value, "fp32", gl.float32), "CU_COLS": "*i32",
        "dk_desc": desc(HALF_N.value, head_d), "dv_desc": desc(HALF_N.value, head_dv),
        "BROADCAST": "constexpr", "CAUSAL": "constexpr", "HEAD_D": "constexpr", "HEAD_DV": "constexpr",
        "STAGES": "constexpr", "GROUPED": "constexpr", "DYNAMIC": "constexpr", "ORDER": "constexpr",
        "FUSE_DQ": "constexpr", "DQ_BUFS": "constexpr", "BLOCK_M": "constexpr", "TMA_STORE": "constexpr",
        "REG_OPERAND": "constexpr",
    }
    values = dict(BROADCAST=broadcast, CAUSAL=causal, HEAD_D=head_d, HEAD_DV=head_dv, STAGES=stages,
                  GROUPED=grouped, DYNAMIC=dynamic, ORDER=order,
                  FUSE_DQ=fuse_dq, DQ_BUFS=dq_bufs,
                  BLOCK_M=block_m, TMA_STORE=tma_store, REG_OPERAND=reg_operand)
    names = list(signature)
    constexprs = {(names.index(k),): v for k, v in values.items()}
    return triton.compile(GluonASTSource(dkdv_kernel, signature, constexprs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
