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
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.language.core import _aggregate as aggregate

from .pipeline import (compile_sm90 as _compile, desc_type, next_pos, publish_pos, read_pos, release_after_stores,
                       store_rows, tma_load, zero_rows_from)

# (constexpr globals: the jitted code reads them; the host reads .value)
HALF_N = gl.constexpr(64)  # keys per consumer warp group: one wgmma M-extent
BLOCK_N = gl.constexpr(128)  # keys per item
BLOCK_M = gl.constexpr(32)  # query rows per streamed block
STAGES = 3  # Q/dO blocks in flight
HEAD_DIMS = (64, 128)  # where the host runs it (D == Dv)
# the [1, BLOCK_M] fp32 boxes of the backward statistics: unswizzled, since a stage's box is 128 bytes and a
# swizzled TMA destination must start on a 1,024-byte boundary
STATS_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def smem_bytes(head_d, head_dv, stages=STAGES):
    """Shared memory the kernel allocates (bf16/fp16), without its barriers and alignment (which
    tests/test_gluon_compile.py bounds by 1 KB)."""
    # the Q/dO ring, the two K/V buffers, the position buffer
    size = 2 * (stages * BLOCK_M.value * (head_d + head_dv) + 4 * 64 * (head_d + head_dv)) + 2 * 32 * 4
    return size + stages * 2 * BLOCK_M.value * 4  # each stage's LSE and delta


@aggregate
class BwdFlags:
    """Compile-time flags for the partitions (worker partitions receive only IR values)."""
    WG: gl.constexpr
    BROADCAST: gl.constexpr
    CAUSAL: gl.constexpr
    HEAD_D: gl.constexpr
    HEAD_DV: gl.constexpr
    STAGES: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, WG, BROADCAST, CAUSAL, HEAD_D, HEAD_DV, STAGES):
        self.WG = gl.constexpr(WG)
        self.BROADCAST = gl.constexpr(BROADCAST)
        self.CAUSAL = gl.constexpr(CAUSAL)
        self.HEAD_D = gl.constexpr(HEAD_D)
        self.HEAD_DV = gl.constexpr(HEAD_DV)
        self.STAGES = gl.constexpr(STAGES)


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
           CAUSAL: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr, ds_layout: gl.constexpr):
    # one query block against this group's 64 keys: S^T and dP^T first (k_a: K as S^T's A operand, in
    # registers), then the two accumulating MMAs
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
    dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, p_op, ds_op))
    return dk, dv


@gluon.jit
def _consumer(q_smem, do_smem, stats_smem, k_smem, v_smem, pos_smem, kv_ready, kv_empty, qdo_ready, qdo_empty,
              DK, DV, ITEMS, TILE_SEQ, TILE_BLK, CU_Q, CU_K, HKV, GROUP, n_items,
              stride_dkt, stride_dkh, stride_dvt, stride_dvh, sm_scale, qk_scale, dk_desc, dv_desc, flags):
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
        # the item's K half as S^T's A operand in registers, loaded once per item
        k_a = k_half.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
        dk = gl.zeros([HALF_N, HEAD_D], gl.float32, dk_layout)
        dv = gl.zeros([HALF_N, HEAD_DV], gl.float32, dv_layout)
        for g in range(GROUP):
            for j in range(n_steps):
                m = m_lo + j * BLOCK_M
                s = r % STAGES
                mbarrier.wait(qdo_ready.index(s), (r // STAGES) & 1)
                rows = m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
                dk, dv = _block(dk, dv, k_a, v_half, q_smem.index(s), do_smem.index(s), stats_smem, s, keys, rows,
                                lq, diag, qk_scale, CAUSAL, s_layout, p_layout, ds_layout)
                mbarrier.arrive(qdo_empty.index(s))
                r += 1
        # every MMA reading this item's K/V is done
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
@gluon.jit(do_not_specialize=['HKV', 'GROUP', 'dynamic'])
def dkdv_kernel(q_desc, k_desc, v_desc, do_desc, stats_desc, DK, DV, CU_Q, CU_K, TILE_SEQ, TILE_BLK, ITEMS,
                COUNTER, stride_dkt, stride_dkh, stride_dvt, stride_dvh, sm_scale, qk_scale,
                HKV, GROUP, N_ITEMS, CU_COLS, dk_desc, dv_desc, dynamic,
                BROADCAST: gl.constexpr, CAUSAL: gl.constexpr, HEAD_D: gl.constexpr, HEAD_DV: gl.constexpr,
                STAGES: gl.constexpr):
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
    mbarrier.init(tail_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)  # both consumer groups release a K/V buffer
    for i in gl.static_range(STAGES):
        mbarrier.init(qdo_ready.index(i), count=1)
        mbarrier.init(qdo_empty.index(i), count=2)  # ... and every Q/dO buffer
    fence_async_shared()
    shared = (q_smem, do_smem, stats_smem, k_smem, v_smem, pos_smem, kv_ready, kv_empty, qdo_ready, qdo_empty,
              DK, DV, ITEMS, TILE_SEQ, TILE_BLK, CU_Q, CU_K, HKV, GROUP, n_items,
              stride_dkt, stride_dkh, stride_dvt, stride_dvh, sm_scale, qk_scale, dk_desc, dv_desc)
    gl.warp_specialize([
        (_consumer, shared + (BwdFlags(0, BROADCAST, CAUSAL, HEAD_D, HEAD_DV, STAGES), )),
        (_consumer, shared + (BwdFlags(1, BROADCAST, CAUSAL, HEAD_D, HEAD_DV, STAGES), )),
        (_loader, (q_desc, k_desc, v_desc, do_desc, stats_desc, q_smem, do_smem, stats_smem, k_smem, v_smem, pos_smem,
                   kv_ready, kv_empty, qdo_ready, qdo_empty, tail_bar,
                   ITEMS, COUNTER, TILE_SEQ, TILE_BLK, CU_Q, CU_K, CU_COLS, HKV, GROUP, n_items, dynamic,
                   BwdFlags(2, BROADCAST, CAUSAL, HEAD_D, HEAD_DV, STAGES))),
    ], [4, 1], [232, 40])


def compile_sm90(head_d=128, head_dv=128, stages=STAGES, causal=False, broadcast=False, dtype="bf16"):
    """``dkdv_kernel`` compiled for sm_90 on any machine (pipeline.compile_sm90)."""
    m, n = BLOCK_M.value, HALF_N.value
    types = {"q_desc": desc_type(dtype, m, head_d), "k_desc": desc_type(dtype, n, head_d),
             "v_desc": desc_type(dtype, n, head_dv), "do_desc": desc_type(dtype, m, head_dv),
             "stats_desc": f"tensordesc<fp32[1, {m}],{STATS_LAYOUT!r}>", "DK": "*" + dtype, "DV": "*" + dtype,
             "CU_Q": "*i32", "CU_K": "*i32", "TILE_SEQ": "*i32", "TILE_BLK": "*i32", "ITEMS": "*i32",
             "COUNTER": "*i32", "stride_dkt": "i32", "stride_dkh": "i32", "stride_dvt": "i32", "stride_dvh": "i32",
             "sm_scale": "fp32", "qk_scale": "fp32", "HKV": "i32", "GROUP": "i32", "N_ITEMS": "*i32",
             "CU_COLS": "*i32", "dk_desc": desc_type(dtype, n, head_d), "dv_desc": desc_type(dtype, n, head_dv),
             "dynamic": "i32"}
    return _compile(dkdv_kernel, types, dict(BROADCAST=broadcast, CAUSAL=causal, HEAD_D=head_d, HEAD_DV=head_dv,
                                             STAGES=stages))
