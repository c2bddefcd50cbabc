"""The Hopper (sm_90) dK/dV kernel in Gluon, laid out like the forward (pipeline.py).

* A work item is one 128-key block of one sequence and one kv head.  The two consumer warp groups own 64
  keys each: their K and V halves stay in shared memory for the whole item (double-buffered across items,
  so the loader fetches the next item's K/V while the consumers finish the current one), their dK / dV
  accumulators in registers, and K also in registers as S^T's A operand (loaded once per item: S^T's MMAs
  then read only Q^T from shared memory, whose bandwidth these tile shapes strain).  For every query head
  of the kv head's group and every 32-row query block that sees the keys, the loader streams the Q block,
  the dO block and the block's two statistics rows through TMA into a ring of ``STAGES`` buffers.
* Per block and group (keys x rows, all transposed so the keys stay the MMA's M extent):
  S^T = K Q^T, P^T = exp2(S^T * scale * log2(e) - LSE * log2(e)), dV += P^T dO, dP^T = V dO^T,
  dS^T = P^T (dP^T - delta), dK += dS^T Q; dK is scaled once at the end.  dQ is the dQ kernel's (one writer
  per element: deterministic).  Each block's four MMAs retire inside it: with an MMA in flight across the
  loop's back edge ptxas serializes every wgmma of the kernel (tests/test_gluon_compile.py pins it).
* The statistics (LSE * log2(e) and delta, [2 * Hq, columns] fp32, each sequence from a 16-byte aligned
  column: plan.AlignedColumns) are written by the dQ kernel, which runs first, or by tl's preprocess pass;
  they come by TMA with each block because a global load there costs a full memory latency per block.
* Rows past a sequence end: a ragged last query block reads the next sequence's rows (or zero fill past the
  tensor end).  P^T is masked to 0 there, and the loader zeroes the Q and dO rows past the end before
  publishing the block, since ``0 * inf`` inside an MMA is NaN.  Key rows past the end are computed and never
  stored (each key's dK / dV row depends on that key's row of S^T only).
* Whole 64-row dK / dV tiles leave by TMA stores from the group's own K / V half (no MMA reads it any more);
  ragged tiles by masked stores.

Conventions as the rest of kernels/: natural-log LSE [Hq, rows] with -inf for rows that see no key,
bottom-right causal, broadcast-Q output (and dO) row b * Lq + i.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.language.core import _aggregate as aggregate

from .pipeline import (bulk_wait_all, bulk_wait_older, compile_sm90 as _compile, desc_type, next_pos, partition_barrier, publish_pos,
                       read_pos, release_after_stores, store_rows, tma_load, tma_reduce_add, tma_store, zero_rows_from)

# (constexpr globals: the jitted code reads them; the host reads .value)
HALF_N = gl.constexpr(64)  # keys per consumer warp group: one wgmma M-extent
BLOCK_N = gl.constexpr(128)  # keys per item
BLOCK_M = gl.constexpr(32)  # query rows per streamed block
STAGES = 3  # Q/dO blocks in flight
HEAD_DIMS = (64, 128)  # where the host runs it (D == Dv)
FUSED_HEAD_DIMS = (64, 128)  # where it can also compute dQ (FUSE_DQ)
DQ_ROWS = gl.constexpr(64)  # FUSE_DQ: head-dim rows of one dQ^T part (one wgmma M extent, one TMA add)
# the [1, BLOCK_M] fp32 boxes of the backward statistics: unswizzled, since a stage's box is 128 bytes and a
# swizzled TMA destination must start on a 1,024-byte boundary
STATS_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def smem_bytes(head_d, head_dv, stages=STAGES, fuse_dq=False):
    """Shared memory the kernel allocates (bf16/fp16), without its barriers and alignment (which
    tests/test_gluon_compile.py bounds by 1 KB)."""
    # the Q/dO ring, the two K/V buffers, the position buffer
    size = 2 * (stages * BLOCK_M.value * (head_d + head_dv) + 4 * 64 * (head_d + head_dv)) + 2 * 32 * 4
    size += stages * 2 * BLOCK_M.value * 4  # each stage's LSE and delta
    if fuse_dq:  # two dS^T buffers (bf16, every key of the item), two fp32 dQ^T parts per 64 head-dim rows
        size += 2 * BLOCK_N.value * BLOCK_M.value * 2 + 2 * head_d * BLOCK_M.value * 4
    return size


@aggregate
class BwdFlags:
    """Compile-time flags for the partitions (worker partitions receive only IR values)."""
    WG: gl.constexpr
    BROADCAST: gl.constexpr
    CAUSAL: gl.constexpr
    HEAD_D: gl.constexpr
    HEAD_DV: gl.constexpr
    STAGES: gl.constexpr
    FUSE_DQ: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, WG, BROADCAST, CAUSAL, HEAD_D, HEAD_DV, STAGES, FUSE_DQ):
        self.WG = gl.constexpr(WG)
        self.BROADCAST = gl.constexpr(BROADCAST)
        self.CAUSAL = gl.constexpr(CAUSAL)
        self.HEAD_D = gl.constexpr(HEAD_D)
        self.HEAD_DV = gl.constexpr(HEAD_DV)
        self.STAGES = gl.constexpr(STAGES)
        self.FUSE_DQ = gl.constexpr(FUSE_DQ)


@gluon.jit
def _kv_item(pos, ITEMS, HKV, TILE_SEQ, TILE_BLK, CU_Q, CU_K, BROADCAST: gl.constexpr, CAUSAL: gl.constexpr):
    # where the item at launch position ``pos`` (ITEMS[pos] = tile * HKV + kv head) reads and writes, and
    # the query blocks it visits: m_lo, m_lo + BLOCK_M, ... below lq
    item = gl.load(ITEMS + pos)
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
def _row_block(m_lo, j, n_steps, FUSE_DQ: gl.constexpr):
    # the item's j-th query block: first to last, or (FUSE_DQ) last to first, so that every key block of a
    # sequence starts at the row block all of them see and adds in step with the key block before
    if FUSE_DQ:
        return m_lo + (n_steps - 1 - j) * BLOCK_M
    else:
        return m_lo + j * BLOCK_M


@gluon.jit
def _loader(q_desc, k_desc, v_desc, do_desc, stats_desc, q_smem, do_smem, stats_smem, k_smem, v_smem, pos_smem,
            kv_ready, kv_empty, qdo_ready, qdo_empty, tail_bar,
            ITEMS, COUNTER, TILE_SEQ, TILE_BLK, CU_Q, CU_K, CU_COLS, HKV, GROUP, n_items, dynamic, flags):
    HEAD_D: gl.constexpr = flags.HEAD_D
    HEAD_DV: gl.constexpr = flags.HEAD_DV
    STAGES: gl.constexpr = flags.STAGES
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
            pos, ITEMS, HKV, TILE_SEQ, TILE_BLK, CU_Q, CU_K, flags.BROADCAST, flags.CAUSAL)
        col0 = gl.load(CU_COLS + b)  # the sequence's first column of the statistics
        kb = tk % 2
        # a fresh barrier counts as having completed the phase before 0, so first rounds do not wait
        mbarrier.wait(kv_empty.index(kb), ((tk // 2) & 1) ^ 1)
        publish_pos(pos_smem, kb, pos)
        kv_bytes: gl.constexpr = 2 * (k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        if flags.FUSE_DQ and n0 + BLOCK_N > lk:
            # a ragged key block with dQ fused: dQ^T = K^T dS^T sums over every key row of the block, so the
            # rows past lk (the next sequence's, maybe not finite) are zeroed first (0 * inf inside an MMA is NaN)
            mbarrier.expect(tail_bar, kv_bytes)
            for half in gl.static_range(2):
                tma_load(k_desc, [k_start + n0 + half * HALF_N, hk * HEAD_D], tail_bar, k_smem.index(2 * kb + half))
                tma_load(v_desc, [k_start + n0 + half * HALF_N, hk * HEAD_DV], tail_bar,
                         v_smem.index(2 * kb + half))
            mbarrier.wait(tail_bar, n_tails & 1)
            for half in gl.static_range(2):
                zero_rows_from(k_smem.index(2 * kb + half), lk - n0 - half * HALF_N, HALF_N, HEAD_D)
                zero_rows_from(v_smem.index(2 * kb + half), lk - n0 - half * HALF_N, HALF_N, HEAD_DV)
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
                m = _row_block(m_lo, j, n_steps, flags.FUSE_DQ)
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
                    zero_rows_from(q_smem.index(s), lq - m, BLOCK_M, HEAD_D)
                    zero_rows_from(do_smem.index(s), lq - m, BLOCK_M, HEAD_DV)
                    fence_async_shared()
                    mbarrier.arrive(qdo_ready.index(s))
                    n_tails += 1
                r += 1
        tk += 1
        pos = next_pos(pos, COUNTER, dynamic)
    # no more items: a K/V buffer holding a position past the end stops the consumers
    kb = tk % 2
    mbarrier.wait(kv_empty.index(kb), ((tk // 2) & 1) ^ 1)
    publish_pos(pos_smem, kb, n_items)
    mbarrier.arrive(kv_ready.index(kb))


@gluon.jit
def _load_block(q_desc, do_desc, stats_desc, q_smem, do_smem, stats_smem, s, q_row, o_row, col, h, HQ,
                HEAD_D: gl.constexpr, HEAD_DV: gl.constexpr, bar):
    tma_load(q_desc, [q_row, h * HEAD_D], bar, q_smem.index(s))
    tma_load(do_desc, [o_row, h * HEAD_DV], bar, do_smem.index(s))
    # LSE and delta come with the block, as FA3 loads them: read from global memory by the consumers they
    # would be a full memory latency on every block's critical path.  Their column (a sequence starts at a
    # multiple of 4, see plan.AlignedColumns) keeps the TMA coordinate 16-byte aligned: unaligned, the H200
    # stops the kernel with an illegal instruction
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
def _block(dk, dv, k_a, v_half, q_s, do_s, stats_smem, s, keys, rows, lq, diag, qk_scale,
           CAUSAL: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr, ds_layout: gl.constexpr,
           FUSE_DQ: gl.constexpr, WG: gl.constexpr, r, k_lo, k_hi, ds_smem, ds_ready, dq_smem, dq_full, dq_empty):
    # one query block against this group's 64 keys: S^T and dP^T first (k_a: K as S^T's A operand, in
    # registers or shared memory), then the two accumulating MMAs (and, FUSE_DQ, this group's half of dQ^T)
    st = warpgroup_mma(k_a, q_s.permute((1, 0)), gl.zeros([HALF_N, BLOCK_M], gl.float32, s_layout),
                       use_acc=False, is_async=True)
    dpt = warpgroup_mma(v_half, do_s.permute((1, 0)), gl.zeros([HALF_N, BLOCK_M], gl.float32, s_layout),
                        use_acc=False, is_async=True)
    row_ok = rows < lq
    lse2, delta = _row_stats(stats_smem, s, row_ok, s_layout)
    st, dpt = warpgroup_mma_wait(0, deps=(st, dpt))
    pt = gl.exp2(st * qk_scale - lse2)
    # Every block is masked, also those that need no mask: with a separate unmasked path, Triton 3.6
    # compiled that path wrong on the H200 once the Q/dO ring had two or more stages and D == Dv; the
    # selects cost little next to the four MMAs.
    keep = gl.expand_dims(row_ok, 0)
    if CAUSAL:
        keep = keep & (gl.expand_dims(keys, 1) <= gl.expand_dims(rows, 0) + diag)
    pt = gl.where(keep, pt, 0.0)
    p_op = gl.convert_layout(pt.to(do_s.dtype), p_layout)
    dv = warpgroup_mma(p_op, do_s, dv, is_async=True)
    dst = pt * (dpt - delta)
    ds_op = gl.convert_layout(dst.to(q_s.dtype), ds_layout)
    dk = warpgroup_mma(ds_op, q_s, dk, is_async=True)
    if FUSE_DQ:
        # dQ^T (head dim x rows) = K^T dS^T over the item's 128 keys: both groups write their dS^T rows into one
        # shared [128 keys, rows] buffer (two, alternating by block) and meet at an mbarrier; at head dim 128
        # each group computes 64 head-dim rows, at 64 the group of the block's parity all of them.  Group A
        # can only write buffer r % 2 again at block r + 2 once group B has arrived at block r + 1's barrier,
        # which B does after its MMAs of block r have read the buffer.
        SPLIT: gl.constexpr = q_s.shape[1] // DQ_ROWS
        buf = r % 2
        ds_all = ds_smem.index(buf)
        ds_all.slice(WG * HALF_N, HALF_N).store(dst.to(q_s.dtype))
        fence_async_shared()
        if FUSE_DQ >= 3 and SPLIT == 2:
            # the dQ^T MMAs issued behind dV / dK, one wait for all of them
            partition_barrier()
            mbarrier.arrive(ds_ready.index(buf))
            mbarrier.wait(ds_ready.index(buf), (r // 2) & 1)
            d0: gl.constexpr = WG * DQ_ROWS
            dqt = warpgroup_mma(k_lo.permute((1, 0)).slice(d0, DQ_ROWS), ds_all.slice(0, HALF_N),
                                gl.zeros([DQ_ROWS, BLOCK_M], gl.float32, s_layout), use_acc=False, is_async=True)
            dqt = warpgroup_mma(k_hi.permute((1, 0)).slice(d0, DQ_ROWS), ds_all.slice(HALF_N, HALF_N), dqt,
                                is_async=True)
            dv, dk, p_op, ds_op, dqt = warpgroup_mma_wait(0, deps=(dv, dk, p_op, ds_op, dqt))
            dqt = gl.where(gl.expand_dims(rows < lq, 0), dqt, 0.0)
            mbarrier.wait(dq_empty.index(buf), ((r // 2) & 1) ^ 1)
            dq_smem.index(2 * WG + buf).store(dqt)
            fence_async_shared()
            partition_barrier()
            mbarrier.arrive(dq_full.index(buf))
        else:
            # dV / dK retire first: their register operands beside the dQ^T accumulator spill
            dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, p_op, ds_op))
            partition_barrier()
            mbarrier.arrive(ds_ready.index(buf))
            mbarrier.wait(ds_ready.index(buf), (r // 2) & 1)
            if SPLIT == 2:
                _dq_part(k_lo, k_hi, ds_all, WG * DQ_ROWS, rows, lq, dq_smem.index(2 * WG + buf), dq_empty, dq_full,
                         buf, r, s_layout)
            elif r % 2 == WG:
                _dq_part(k_lo, k_hi, ds_all, 0, rows, lq, dq_smem.index(buf), dq_empty, dq_full, buf, r, s_layout)
    else:
        dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, p_op, ds_op))
    return dk, dv


@gluon.jit
def _dq_part(k_lo, k_hi, ds_all, d0, rows, lq, dq_s, dq_empty, dq_full, buf, r, s_layout: gl.constexpr):
    # head-dim rows d0 .. d0 + 63 of the block's dQ^T over both K halves, handed to the writer warp through
    # staging buffer dq_s once the writer has added what it held two blocks ago
    dqt = warpgroup_mma(k_lo.permute((1, 0)).slice(d0, DQ_ROWS), ds_all.slice(0, HALF_N),
                        gl.zeros([DQ_ROWS, BLOCK_M], gl.float32, s_layout), use_acc=False, is_async=True)
    dqt = warpgroup_mma(k_hi.permute((1, 0)).slice(d0, DQ_ROWS), ds_all.slice(HALF_N, HALF_N), dqt, is_async=True)
    dqt = warpgroup_mma_wait(0, deps=(dqt,))
    # the columns past lq are this sequence's padding (plan.Columns): zeros, whatever the rows read held
    dqt = gl.where(gl.expand_dims(rows < lq, 0), dqt, 0.0)
    mbarrier.wait(dq_empty.index(buf), ((r // 2) & 1) ^ 1)
    dq_s.store(dqt)
    fence_async_shared()
    partition_barrier()
    mbarrier.arrive(dq_full.index(buf))


@gluon.jit
def _dq_writer(dq_smem, pos_smem, kv_ready, kv_empty, dq_full, dq_empty, dq_desc, SEM, sem_stride, ITEMS,
               TILE_SEQ, TILE_BLK, CU_Q, CU_K, CU_COLS, HKV, GROUP, n_items, flags):
    # FUSE_DQ: one warp adds the consumers' dQ^T parts into the fp32 buffer [Hq * D, columns], block by block
    # in the consumers' order.  Deterministic: the parts of one (query head, 32-row block) go in in key-block
    # order, 0 first; SEM counts, per (query head, block), the key blocks whose parts are in.  Key block 0
    # stores its part (nothing to wait for; the buffer needs no zeroing), key block n > 0 waits until the
    # count is n, adds, waits for the add to have reached global memory and counts itself.  Every key block
    # below n sees a row block that key block n sees (causal or not), and items are claimed in key-block
    # order within a (sequence, kv head), so the item waited for is always already running: no deadlock.
    HEAD_D: gl.constexpr = flags.HEAD_D
    SPLIT: gl.constexpr = HEAD_D // DQ_ROWS  # parts per block, one per head-dim half at 128
    r = 0
    tk = 0
    pend = 0  # FUSE_DQ == 4: a block's adds still in flight (its count and staging buffer not yet released)
    pend_idx = 0
    pend_buf = 0
    mbarrier.wait(kv_ready.index(0), 0)
    pos = read_pos(pos_smem, 0, 1)
    while pos < n_items:
        # the position is read: the loader may refill this K/V buffer once the consumers are done with it too
        mbarrier.arrive(kv_empty.index(tk % 2))
        q_start, o_start, lq, k_start, lk, hk, n0, diag, m_lo, n_steps, b = _kv_item(
            pos, ITEMS, HKV, TILE_SEQ, TILE_BLK, CU_Q, CU_K, flags.BROADCAST, flags.CAUSAL)
        col0 = gl.load(CU_COLS + b)
        nblk = n0 // BLOCK_N
        for g in range(GROUP):
            h = hk * GROUP + g
            for j in range(n_steps):
                m = _row_block(m_lo, j, n_steps, flags.FUSE_DQ)
                buf = r % 2
                mbarrier.wait(dq_full.index(buf), (r // 2) & 1)
                idx = h * sem_stride + (col0 + m) // BLOCK_M
                sem = SEM + idx
                if flags.FUSE_DQ == 4:
                    if pend != 0:
                        if pend_idx == idx:  # the same row block: its count must be in before this one waits
                            bulk_wait_all(nblk)
                            partition_barrier()
                            gl.atomic_add(SEM + pend_idx, 1, sem="release", scope="gpu")
                            mbarrier.arrive(dq_empty.index(pend_buf))
                            pend = 0
                if flags.FUSE_DQ == 2:
                    tma_reduce_add(dq_desc, [h * HEAD_D, col0 + m], dq_smem.index(buf))
                    if SPLIT == 2:
                        tma_reduce_add(dq_desc, [h * HEAD_D + DQ_ROWS, col0 + m], dq_smem.index(2 + buf))
                    tma.store_wait(0)
                elif nblk == 0:
                    tma_store(dq_desc, [h * HEAD_D, col0 + m], dq_smem.index(buf))
                    if SPLIT == 2:
                        tma_store(dq_desc, [h * HEAD_D + DQ_ROWS, col0 + m], dq_smem.index(2 + buf))
                else:
                    seen = gl.atomic_add(sem, 0, sem="acquire", scope="gpu")
                    while seen != nblk:
                        seen = gl.atomic_add(sem, 0, sem="acquire", scope="gpu")
                    tma_reduce_add(dq_desc, [h * HEAD_D, col0 + m], dq_smem.index(buf))
                    if SPLIT == 2:
                        tma_reduce_add(dq_desc, [h * HEAD_D + DQ_ROWS, col0 + m], dq_smem.index(2 + buf))
                if flags.FUSE_DQ == 4:
                    # the block before has completed (bulk groups complete in order; this block's SPLIT are
                    # the most recent): release it, keep this one in flight
                    if pend != 0:
                        bulk_wait_older(nblk, SPLIT)
                        partition_barrier()
                        gl.atomic_add(SEM + pend_idx, 1, sem="release", scope="gpu")
                        mbarrier.arrive(dq_empty.index(pend_buf))
                    pend = 1
                    pend_idx = idx
                    pend_buf = buf
                else:
                    if flags.FUSE_DQ != 2:
                        bulk_wait_all(nblk)
                        partition_barrier()
                        gl.atomic_add(sem, 1, sem="release", scope="gpu")
                    mbarrier.arrive(dq_empty.index(buf))
                r += 1
        tk += 1
        mbarrier.wait(kv_ready.index(tk % 2), (tk // 2) & 1)
        pos = read_pos(pos_smem, tk % 2, 1)
    if pend != 0:
        bulk_wait_all(pend)
        partition_barrier()
        gl.atomic_add(SEM + pend_idx, 1, sem="release", scope="gpu")
        mbarrier.arrive(dq_empty.index(pend_buf))


@gluon.jit
def _consumer(q_smem, do_smem, stats_smem, k_smem, v_smem, pos_smem, kv_ready, kv_empty, qdo_ready, qdo_empty,
              DK, DV, ITEMS, TILE_SEQ, TILE_BLK, CU_Q, CU_K, HKV, GROUP, n_items,
              stride_dkt, stride_dkh, stride_dvt, stride_dvh, sm_scale, qk_scale, dk_desc, dv_desc,
              ds_smem, ds_ready, dq_smem, dq_full, dq_empty, k_read, flags):
    WG: gl.constexpr = flags.WG
    CAUSAL: gl.constexpr = flags.CAUSAL
    HEAD_D: gl.constexpr = flags.HEAD_D
    HEAD_DV: gl.constexpr = flags.HEAD_DV
    STAGES: gl.constexpr = flags.STAGES
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
    pos = read_pos(pos_smem, 0)
    while pos < n_items:
        q_start, o_start, lq, k_start, lk, hk, n0, diag, m_lo, n_steps, b = _kv_item(
            pos, ITEMS, HKV, TILE_SEQ, TILE_BLK, CU_Q, CU_K, flags.BROADCAST, CAUSAL)
        kb = tk % 2
        k_half = k_smem.index(2 * kb + WG)
        v_half = v_smem.index(2 * kb + WG)
        kw = n0 + WG * HALF_N  # this group's first key
        keys = kw + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, s_layout))
        if flags.FUSE_DQ:
            k_a = k_half  # (K in registers beside the dQ^T tile spills)
        else:
            # the item's K half as S^T's A operand in registers, loaded once per item
            k_a = k_half.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
        dk = gl.zeros([HALF_N, HEAD_D], gl.float32, dk_layout)
        dv = gl.zeros([HALF_N, HEAD_DV], gl.float32, dv_layout)
        for g in range(GROUP):
            for j in range(n_steps):
                m = _row_block(m_lo, j, n_steps, flags.FUSE_DQ)
                s = r % STAGES
                mbarrier.wait(qdo_ready.index(s), (r // STAGES) & 1)
                rows = m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
                dk, dv = _block(dk, dv, k_a, v_half, q_smem.index(s), do_smem.index(s), stats_smem, s, keys, rows,
                                lq, diag, qk_scale, CAUSAL, s_layout, p_layout, ds_layout, flags.FUSE_DQ, WG, r,
                                k_smem.index(2 * kb), k_smem.index(2 * kb + 1), ds_smem, ds_ready, dq_smem, dq_full,
                                dq_empty)
                mbarrier.arrive(qdo_empty.index(s))
                r += 1
        # every MMA of this group reading this item's K/V is done
        if flags.FUSE_DQ:
            # ... and, before dK leaves through this group's K half, the other group's dQ MMAs reading it
            mbarrier.arrive(k_read.index(kb))
            mbarrier.wait(k_read.index(kb), (tk // 2) & 1)
        dk = (dk * sm_scale).to(DK.dtype.element_ty)
        dv = dv.to(DV.dtype.element_ty)
        # whole tiles leave through this group's own K / V half (no MMA reads it any more; the other group
        # reads only its own half), released once the TMA stores have read it
        store_rows(dk, k_half, dk_desc, DK + hk * stride_dkh, k_start + kw, lk - kw, hk * HEAD_D, stride_dkt,
                   True, dk_layout)
        store_rows(dv, v_half, dv_desc, DV + hk * stride_dvh, k_start + kw, lk - kw, hk * HEAD_DV, stride_dvt,
                   True, dv_layout)
        release_after_stores(kv_empty.index(kb))
        tk += 1
        mbarrier.wait(kv_ready.index(tk % 2), (tk // 2) & 1)
        pos = read_pos(pos_smem, tk % 2)


# the head counts and the deal are not specialized on: one variant per config
@gluon.jit(do_not_specialize=['HKV', 'GROUP', 'dynamic', 'sem_stride'])
def dkdv_kernel(q_desc, k_desc, v_desc, do_desc, stats_desc, DK, DV, CU_Q, CU_K, TILE_SEQ, TILE_BLK, ITEMS,
                COUNTER, stride_dkt, stride_dkh, stride_dvt, stride_dvh, sm_scale, qk_scale,
                HKV, GROUP, N_ITEMS, CU_COLS, dk_desc, dv_desc, dynamic, dq_desc, SEM, sem_stride,
                BROADCAST: gl.constexpr, CAUSAL: gl.constexpr, HEAD_D: gl.constexpr, HEAD_DV: gl.constexpr,
                STAGES: gl.constexpr, FUSE_DQ: gl.constexpr = False):
    # work items: (128-key block, kv head) in ITEMS' order; program p runs the launch positions p, then
    # p + P, ... (dynamic != 0: those it claims from COUNTER)
    n_items = gl.load(N_ITEMS)  # the item count, written on the device by the schedule's builder
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_M, HEAD_D], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, HEAD_DV], do_desc.layout)
    # per stage: the block's log2-domain LSE, then its delta (the backward statistics buffer)
    stats_smem = gl.allocate_shared_memory(gl.float32, [2 * STAGES, 1, BLOCK_M], stats_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [4, HALF_N, HEAD_D], k_desc.layout)  # 2 buffers x 2 halves
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [4, HALF_N, HEAD_DV], v_desc.layout)
    pos_smem = gl.allocate_shared_memory(gl.int32, [2, 32], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    qdo_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    qdo_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    tail_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    # FUSE_DQ: dS^T (the dQ^T MMAs' B operand: both groups' rows, two buffers alternating by block) and the fp32
    # dQ^T parts (group WG's of block parity p in buffer 2 * WG + p), with their barriers
    if FUSE_DQ:
        gl.static_assert((HEAD_D == 64 or HEAD_D == 128) and HEAD_DV == HEAD_D and not BROADCAST,
                         "the fused dQ takes head dim 64 or 128, D == Dv, not broadcast-Q")
        ds_smem = gl.allocate_shared_memory(q_desc.dtype, [2, BLOCK_N, BLOCK_M],
                                            gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], q_desc.dtype))
        dq_smem = gl.allocate_shared_memory(gl.float32, [2 * (HEAD_D // DQ_ROWS), DQ_ROWS, BLOCK_M], dq_desc.layout)
    else:  # never touched; one element each
        ds_smem = gl.allocate_shared_memory(gl.float32, [2, 1, 1], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        dq_smem = gl.allocate_shared_memory(gl.float32, [4, 1, 1], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_read = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(tail_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(kv_ready.index(i), count=1)
        # both consumer groups release a K/V buffer (FUSE_DQ: and the writer, once it has read the position)
        mbarrier.init(kv_empty.index(i), count=3 if FUSE_DQ else 2)
        mbarrier.init(ds_ready.index(i), count=2)  # both groups' dS^T rows are in
        mbarrier.init(dq_full.index(i), count=HEAD_D // DQ_ROWS)  # the block's dQ^T parts are in
        mbarrier.init(dq_empty.index(i), count=1)  # the writer has added them
        mbarrier.init(k_read.index(i), count=2)  # both groups' MMAs of the item are done
    for i in gl.static_range(STAGES):
        mbarrier.init(qdo_ready.index(i), count=1)
        mbarrier.init(qdo_empty.index(i), count=2)  # ... and every Q/dO buffer
    fence_async_shared()
    shared = (q_smem, do_smem, stats_smem, k_smem, v_smem, pos_smem, kv_ready, kv_empty, qdo_ready, qdo_empty,
              DK, DV, ITEMS, TILE_SEQ, TILE_BLK, CU_Q, CU_K, HKV, GROUP, n_items,
              stride_dkt, stride_dkh, stride_dvt, stride_dvh, sm_scale, qk_scale, dk_desc, dv_desc,
              ds_smem, ds_ready, dq_smem, dq_full, dq_empty, k_read)
    loader_args = (q_desc, k_desc, v_desc, do_desc, stats_desc, q_smem, do_smem, stats_smem, k_smem, v_smem,
                   pos_smem, kv_ready, kv_empty, qdo_ready, qdo_empty, tail_bar,
                   ITEMS, COUNTER, TILE_SEQ, TILE_BLK, CU_Q, CU_K, CU_COLS, HKV, GROUP, n_items, dynamic,
                   BwdFlags(2, BROADCAST, CAUSAL, HEAD_D, HEAD_DV, STAGES, FUSE_DQ))
    group0 = shared + (BwdFlags(0, BROADCAST, CAUSAL, HEAD_D, HEAD_DV, STAGES, FUSE_DQ), )
    group1 = shared + (BwdFlags(1, BROADCAST, CAUSAL, HEAD_D, HEAD_DV, STAGES, FUSE_DQ), )
    if FUSE_DQ:
        writer_args = (dq_smem, pos_smem, kv_ready, kv_empty, dq_full, dq_empty, dq_desc, SEM, sem_stride,
                       ITEMS, TILE_SEQ, TILE_BLK, CU_Q, CU_K, CU_COLS, HKV, GROUP, n_items,
                       BwdFlags(3, BROADCAST, CAUSAL, HEAD_D, HEAD_DV, STAGES, FUSE_DQ))
        gl.warp_specialize([(_consumer, group0), (_consumer, group1), (_loader, loader_args),
                            (_dq_writer, writer_args)], [4, 1, 1], [232, 40, 40])
    else:
        gl.warp_specialize([(_consumer, group0), (_consumer, group1), (_loader, loader_args)], [4, 1], [232, 40])


def compile_sm90(head_d=128, head_dv=128, stages=STAGES, causal=False, broadcast=False, dtype="bf16", fuse_dq=False):
    """``dkdv_kernel`` compiled for sm_90 on any machine (pipeline.compile_sm90)."""
    m, n = BLOCK_M.value, HALF_N.value
    types = {"q_desc": desc_type(dtype, m, head_d), "k_desc": desc_type(dtype, n, head_d),
             "v_desc": desc_type(dtype, n, head_dv), "do_desc": desc_type(dtype, m, head_dv),
             "stats_desc": f"tensordesc<fp32[1, {m}],{STATS_LAYOUT!r}>", "DK": "*" + dtype, "DV": "*" + dtype,
             "CU_Q": "*i32", "CU_K": "*i32", "TILE_SEQ": "*i32", "TILE_BLK": "*i32", "ITEMS": "*i32",
             "COUNTER": "*i32", "stride_dkt": "i32", "stride_dkh": "i32", "stride_dvt": "i32", "stride_dvh": "i32",
             "sm_scale": "fp32", "qk_scale": "fp32", "HKV": "i32", "GROUP": "i32", "N_ITEMS": "*i32",
             "CU_COLS": "*i32", "dk_desc": desc_type(dtype, n, head_d), "dv_desc": desc_type(dtype, n, head_dv),
             "dynamic": "i32", "dq_desc": desc_type("fp32", DQ_ROWS.value, m) if fuse_dq else desc_type(dtype, n, head_d),
             "SEM": "*i32", "sem_stride": "i32"}
    return _compile(dkdv_kernel, types, dict(BROADCAST=broadcast, CAUSAL=causal, HEAD_D=head_d, HEAD_DV=head_dv,
                                             STAGES=stages, FUSE_DQ=fuse_dq))
