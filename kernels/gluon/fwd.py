"""The Hopper (sm_90) forward in Gluon: one loader warp and two consumer warp groups per CTA
(pipeline.py says how the three kernels are laid out).

* A work item is one 128-row query tile of one sequence and one query head.  The loader double-buffers Q
  across items (so it fetches the next item's Q and K/V while the consumers finish the current one) and
  streams K and V blocks of ``BLOCK_N`` keys through a ring of ``STAGES`` buffers (empty needs both
  consumer groups).  Each consumer group takes 64 query rows.
* Per key block the consumer runs FA3's intra-warpgroup overlap: QK^T(j) and PV(j-1) are issued, then a
  wait for QK^T alone, block j's softmax while PV(j-1) runs, a wait for PV and the rescale.  So the source;
  in the SASS ptxas moves the wait for PV into the row maximum's shuffles, above the exponentials, so
  within a group they do not overlap (the xfail in tests/test_gluon_compile.py).  The two groups are
  separate warp groups, so one's softmax runs while the other's ``wgmma`` keeps the tensor cores busy; the
  softmax in a basic block of its own keeps all of it under PV in the SASS, and measured no faster
  (``perf/LOG.md`` v34, v40, v41).
* Key block order: under causal masking first to last (the masked diagonal blocks last); without it last
  to first, so an item's ragged last block, which the loader must wait for and zero before publishing it,
  is loaded first, while the consumers still finish the item before (S5 forward 8% faster, S1 4%,
  ``perf/LOG.md`` v34).
* Softmax in base 2 with the scale folded into one FMA per score (``s * scale - m``, valid because the
  validator accepts positive scales only).
* Reading past a sequence end reads the next sequence's rows: query rows past ``lq`` are computed and never
  stored; key scores past ``lk`` are masked to -inf; and because ``0 * inf`` is NaN inside the MMA, the
  loader zeroes value rows past ``lk`` in the ragged last block before publishing it.
* ``TMA_STORE`` (where D == Dv): a whole 64-row O tile leaves by one TMA store from the group's Q half,
  which no MMA reads any more; ragged tiles and D != Dv by masked stores.

Same conventions as kernels/tl.py: bottom-right causal, natural-log LSE [Hq, rows], rows with no visible
key give 0 and -inf, broadcast-Q output row b * Lq + i.
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

HALF_M = 64  # rows per consumer warp group: one wgmma M-extent
BLOCK_M = 2 * HALF_M
BLOCK_N = 128  # keys per streamed block
STAGES = 2  # K/V ring depth: two Q buffers and this ring fill sm_90's shared memory at head dim 128
HEAD_DIMS = (64, 128)


@aggregate
class PartitionFlags:
    """Compile-time flags for the partitions.  Worker partitions receive only IR values, so their
    constexprs travel as the fields of this aggregate."""
    WG: gl.constexpr
    BROADCAST: gl.constexpr
    CAUSAL: gl.constexpr
    BLOCK_N: gl.constexpr
    HEAD_D: gl.constexpr
    HEAD_DV: gl.constexpr
    STAGES: gl.constexpr
    TMA_STORE: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, WG, BROADCAST, CAUSAL, BLOCK_N, HEAD_D, HEAD_DV, STAGES, TMA_STORE):
        self.WG = gl.constexpr(WG)
        self.BROADCAST = gl.constexpr(BROADCAST)
        self.CAUSAL = gl.constexpr(CAUSAL)
        self.BLOCK_N = gl.constexpr(BLOCK_N)
        self.HEAD_D = gl.constexpr(HEAD_D)
        self.HEAD_DV = gl.constexpr(HEAD_DV)
        self.STAGES = gl.constexpr(STAGES)
        self.TMA_STORE = gl.constexpr(TMA_STORE)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, pos_smem, q_ready, q_empty, k_ready, v_ready,
            k_empty, v_empty, tail_bar, ITEMS, COUNTER, TILE_SEQ, TILE_BLK, CU_Q, CU_K, H, GROUP, n_items, dynamic,
            flags):
    BLOCK_N: gl.constexpr = flags.BLOCK_N
    HEAD_D: gl.constexpr = flags.HEAD_D
    HEAD_DV: gl.constexpr = flags.HEAD_DV
    STAGES: gl.constexpr = flags.STAGES
    r0 = 0  # ring position of the current item's first key block (the ring runs on across items)
    n_tails = 0
    tq = 0  # items so far: Q buffer tq % 2
    pos = gl.program_id(0)
    while pos < n_items:
        q_start, o_start, lq, k_start, lk, h, hk, m0, diag, n_full, n_blocks = query_tile(
            pos, ITEMS, H, GROUP, TILE_SEQ, TILE_BLK, CU_Q, CU_K, flags.BROADCAST, flags.CAUSAL, BLOCK_N)
        qb = tq % 2
        # a fresh barrier counts as having completed the phase before 0, so first rounds do not wait
        mbarrier.wait(q_empty.index(qb), ((tq // 2) & 1) ^ 1)
        publish_pos(pos_smem, qb, pos)
        mbarrier.expect(q_ready.index(qb), 2 * q_desc.block_type.nbytes)
        tma_load(q_desc, [q_start + m0, h * HEAD_D], q_ready.index(qb), q_smem.index(2 * qb))
        tma_load(q_desc, [q_start + m0 + 64, h * HEAD_D], q_ready.index(qb),
                                        q_smem.index(2 * qb + 1))
        for j in range(n_blocks):
            r = r0 + j
            s = r % STAGES
            ph = (r // STAGES) & 1
            if flags.CAUSAL:
                start = j * BLOCK_N
            else:
                start = (n_blocks - 1 - j) * BLOCK_N  # last to first
            mbarrier.wait(k_empty.index(s), ph ^ 1)
            mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
            tma_load(k_desc, [k_start + start, hk * HEAD_D], k_ready.index(s), k_smem.index(s))
            mbarrier.wait(v_empty.index(s), ph ^ 1)
            if start + BLOCK_N <= lk:
                mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
                tma_load(v_desc, [k_start + start, hk * HEAD_DV], v_ready.index(s),
                                                v_smem.index(s))
            else:
                # the ragged last block (at most one per item)
                mbarrier.expect(tail_bar, v_desc.block_type.nbytes)
                tma_load(v_desc, [k_start + start, hk * HEAD_DV], tail_bar, v_smem.index(s))
                mbarrier.wait(tail_bar, n_tails & 1)
                zero_rows_from(v_smem.index(s), lk - start, BLOCK_N, HEAD_DV)
                fence_async_shared()
                mbarrier.arrive(v_ready.index(s))
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
def _softmax_step(scores, m_i, l_i, j, offs_m, offs_n, lk, diag, qk_scale,
                  MASKED: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr):
    # online softmax of key block j's [64, BLOCK_N] scores: (p, alpha, l, m)
    if MASKED:
        cols = j * BLOCK_N + offs_n
        keep = gl.expand_dims(cols < lk, 0)
        if CAUSAL:
            keep = keep & (gl.expand_dims(cols, 0) <= gl.expand_dims(offs_m, 1) + diag)
        scaled = gl.where(keep, scores * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(scaled, 1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(scaled - gl.expand_dims(m_use, 1))
    else:
        m_new = gl.maximum(m_i, gl.max(scores, 1) * qk_scale)
        m_use = m_new
        # one FMA per score: s * scale - m
        p = gl.exp2(scores * qk_scale - gl.expand_dims(m_use, 1))
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, alpha, l_i, m_new


@gluon.jit
def _issue_qk(r, q, k_smem, k_ready, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, s_layout: gl.constexpr):
    # QK^T against the K block at ring position r, issued asynchronously
    s = r % STAGES
    mbarrier.wait(k_ready.index(s), (r // STAGES) & 1)
    return warpgroup_mma(q, k_smem.index(s).permute((1, 0)), gl.zeros([64, BLOCK_N], gl.float32, s_layout),
                         use_acc=False, is_async=True)


@gluon.jit
def _pipelined_block(j, r, acc, p_prev, l_i, m_i, q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                     offs_m, offs_n, lk, diag, qk_scale,
                     MASKED: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr):
    # key block j (ring position r): its softmax runs while the previous block's PV (ring position r - 1) is in
    # flight (FA3's intra-warpgroup overlap): issue QK^T(j), issue that PV, wait for QK^T only, softmax(j),
    # then wait for PV and rescale.
    s = r % STAGES
    sp = (r - 1) % STAGES
    qk = _issue_qk(r, q, k_smem, k_ready, BLOCK_N, STAGES, s_layout)
    mbarrier.wait(v_ready.index(sp), ((r - 1) // STAGES) & 1)
    pv = warpgroup_mma(p_prev, v_smem.index(sp), acc, is_async=True)
    scores = warpgroup_mma_wait(1, deps=(qk, ))  # groups retire in order: QK^T(j) is done
    mbarrier.arrive(k_empty.index(s))
    p, alpha, l_i, m_new = _softmax_step(scores, m_i, l_i, j, offs_m, offs_n, lk, diag, qk_scale,
                                         MASKED, CAUSAL, BLOCK_N)
    acc, p_prev = warpgroup_mma_wait(0, deps=(pv, p_prev))
    mbarrier.arrive(v_empty.index(sp))
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
    p_next = gl.convert_layout(p.to(v_smem.dtype), p_layout)
    return acc, p_next, l_i, m_new


@gluon.jit
def _consumer(q_smem, k_smem, v_smem, pos_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
              O, LSE, ITEMS, COUNTER, TILE_SEQ, TILE_BLK, CU_Q, CU_K, H, GROUP, n_items,
              stride_ot, stride_oh, stride_lh, qk_scale, o_desc, flags):
    WG: gl.constexpr = flags.WG
    CAUSAL: gl.constexpr = flags.CAUSAL
    BLOCK_N: gl.constexpr = flags.BLOCK_N
    HEAD_DV: gl.constexpr = flags.HEAD_DV
    STAGES: gl.constexpr = flags.STAGES
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DV, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    r0 = 0  # ring position of the item's first key block
    tq = 0  # items so far: Q buffer tq % 2
    # the loader names each item it loads (and, last, a position past the end)
    mbarrier.wait(q_ready.index(0), 0)
    pos = read_pos(pos_smem, 0)
    while pos < n_items:
        q_start, o_start, lq, k_start, lk, h, hk, m0, diag, n_full, n_blocks = query_tile(
            pos, ITEMS, H, GROUP, TILE_SEQ, TILE_BLK, CU_Q, CU_K, flags.BROADCAST, CAUSAL, BLOCK_N)
        first = m0 + WG * 64
        offs_m = first + gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout))
        offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, s_layout))
        acc = gl.zeros([64, HEAD_DV], gl.float32, o_layout)
        qb = tq % 2
        q = q_smem.index(2 * qb + WG)
        if first < lq:
            if n_blocks > 0:
                qk = _issue_qk(r0, q, k_smem, k_ready, BLOCK_N, STAGES, s_layout)
                scores = warpgroup_mma_wait(0, deps=(qk, ))
                mbarrier.arrive(k_empty.index(r0 % STAGES))
                # the first block: block 0 under causal masking, else the last (masked where it is ragged)
                if CAUSAL:
                    j0 = 0
                    masked0 = n_full == 0
                else:
                    j0 = n_blocks - 1
                    masked0 = n_full < n_blocks
                if masked0:
                    p, alpha, l_i, m_i = _softmax_step(scores, m_i, l_i, j0, offs_m, offs_n, lk, diag,
                                                       qk_scale, True, CAUSAL, BLOCK_N)
                else:
                    p, alpha, l_i, m_i = _softmax_step(scores, m_i, l_i, j0, offs_m, offs_n, lk, diag,
                                                       qk_scale, False, CAUSAL, BLOCK_N)
                p_op = gl.convert_layout(p.to(v_smem.dtype), p_layout)
                if CAUSAL:
                    for j in range(1, n_full):
                        acc, p_op, l_i, m_i = _pipelined_block(
                            j, r0 + j, acc, p_op, l_i, m_i, q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                            offs_m, offs_n, lk, diag, qk_scale, False, CAUSAL, BLOCK_N, STAGES, s_layout, o_layout,
                            p_layout)
                    for j in range(gl.maximum(n_full, 1), n_blocks):
                        acc, p_op, l_i, m_i = _pipelined_block(
                            j, r0 + j, acc, p_op, l_i, m_i, q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                            offs_m, offs_n, lk, diag, qk_scale, True, CAUSAL, BLOCK_N, STAGES, s_layout, o_layout,
                            p_layout)
                else:
                    # the rest, last to first: without causal masking only the ragged last block is masked
                    for t in range(1, n_blocks):
                        acc, p_op, l_i, m_i = _pipelined_block(
                            n_blocks - 1 - t, r0 + t, acc, p_op, l_i, m_i, q, k_smem, v_smem, k_ready, v_ready,
                            k_empty, v_empty, offs_m, offs_n, lk, diag, qk_scale, False, CAUSAL, BLOCK_N, STAGES,
                            s_layout, o_layout, p_layout)
                last = r0 + n_blocks - 1
                mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
                acc = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
                acc = warpgroup_mma_wait(0, deps=(acc, ))
                mbarrier.arrive(v_empty.index(last % STAGES))
            if not flags.TMA_STORE:
                mbarrier.arrive(q_empty.index(qb))  # every QK^T of this item is done: Q may be reloaded
            has = l_i > 0.0
            l_safe = gl.where(has, l_i, 1.0)
            out = acc / gl.expand_dims(gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout)), 1)
            lse = gl.where(has, (m_i + gl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
            # TMA_STORE: a whole 64-row O tile leaves through this group's Q half (HEAD_DV == HEAD_D)
            store_rows(out.to(O.dtype.element_ty), q, o_desc, O + h * stride_oh, o_start + first, lq - first,
                       h * HEAD_DV, stride_ot, flags.TMA_STORE, o_layout)
            gl.store(LSE + h * stride_lh + o_start + offs_m, lse, mask=offs_m < lq)
            if flags.TMA_STORE:
                release_after_stores(q_empty.index(qb))  # Q may be reloaded
        else:
            # no query row of this half is real: release every buffer in the order the active group takes
            # them (step t: K(t) and V(t-1)), so neither group waits on something the other holds
            if n_blocks > 0:  # with no key block the active group takes no step either
                for t in range(0, n_blocks + 1):
                    if t < n_blocks:
                        mbarrier.wait(k_ready.index((r0 + t) % STAGES), ((r0 + t) // STAGES) & 1)
                        mbarrier.arrive(k_empty.index((r0 + t) % STAGES))
                    if t > 0:
                        mbarrier.wait(v_ready.index((r0 + t - 1) % STAGES), ((r0 + t - 1) // STAGES) & 1)
                        mbarrier.arrive(v_empty.index((r0 + t - 1) % STAGES))
            mbarrier.arrive(q_empty.index(qb))
        r0 += n_blocks
        tq += 1
        mbarrier.wait(q_ready.index(tq % 2), (tq // 2) & 1)
        pos = read_pos(pos_smem, tq % 2)


# arguments that follow the batch (token totals, sequence counts) or the head counts are not specialized on: one
# variant per config
@gluon.jit(do_not_specialize=['stride_lh', 'H', 'GROUP', 'dynamic'])
def fwd_kernel(q_desc, k_desc, v_desc, O, LSE, CU_Q, CU_K, TILE_SEQ, TILE_BLK, ITEMS, COUNTER,
               stride_ot, stride_oh, stride_lh, qk_scale, H, GROUP, N_ITEMS, o_desc, dynamic,
               BROADCAST: gl.constexpr, CAUSAL: gl.constexpr,
               BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, HEAD_DV: gl.constexpr,
               STAGES: gl.constexpr, TMA_STORE: gl.constexpr = False):
    # work items: (128-row query tile, query head) in ITEMS' order; program p runs the launch positions p,
    # p + P, ... (dynamic != 0: p, then those it claims from COUNTER, a zeroed int32)
    n_items = gl.load(N_ITEMS)  # the item count, written on the device by the schedule's builder
    gl.static_assert(not TMA_STORE or HEAD_D == HEAD_DV, "TMA_STORE sends O out through a Q buffer")
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [4, 64, HEAD_D], q_desc.layout)  # 2 buffers x 2 halves
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DV], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    tail_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    pos_smem = gl.allocate_shared_memory(gl.int32, [2, 32], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    mbarrier.init(tail_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)  # both consumer groups release a Q buffer
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # ... and every K/V buffer
        mbarrier.init(v_empty.index(i), count=2)
    fence_async_shared()
    # the two consumer groups differ only in which 64 rows they take (the flags' WG)
    shared = (q_smem, k_smem, v_smem, pos_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
              O, LSE, ITEMS, COUNTER, TILE_SEQ, TILE_BLK, CU_Q, CU_K, H, GROUP, n_items, stride_ot, stride_oh,
              stride_lh, qk_scale, o_desc)
    gl.warp_specialize([
        (_consumer, shared + (PartitionFlags(0, BROADCAST, CAUSAL, BLOCK_N, HEAD_D, HEAD_DV, STAGES, TMA_STORE), )),
        (_consumer, shared + (PartitionFlags(1, BROADCAST, CAUSAL, BLOCK_N, HEAD_D, HEAD_DV, STAGES, TMA_STORE), )),
        (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, pos_smem, q_ready, q_empty, k_ready, v_ready,
                   k_empty, v_empty, tail_bar, ITEMS, COUNTER, TILE_SEQ, TILE_BLK, CU_Q, CU_K, H, GROUP, n_items,
                   dynamic, PartitionFlags(2, BROADCAST, CAUSAL, BLOCK_N, HEAD_D, HEAD_DV, STAGES, TMA_STORE))),
    ], [4, 1], [232, 40])


def compile_sm90(block_n=BLOCK_N, head_d=128, head_dv=128, stages=STAGES, causal=False, broadcast=False,
                 dtype="bf16", tma_store=False):
    """``fwd_kernel`` compiled for sm_90 on any machine (pipeline.compile_sm90)."""
    types = {"q_desc": desc_type(dtype, HALF_M, head_d), "k_desc": desc_type(dtype, block_n, head_d),
             "v_desc": desc_type(dtype, block_n, head_dv), "O": "*" + dtype, "LSE": "*fp32", "CU_Q": "*i32",
             "CU_K": "*i32", "TILE_SEQ": "*i32", "TILE_BLK": "*i32", "ITEMS": "*i32", "COUNTER": "*i32",
             "stride_ot": "i32", "stride_oh": "i32", "stride_lh": "i32", "qk_scale": "fp32", "H": "i32",
             "GROUP": "i32", "N_ITEMS": "*i32", "o_desc": desc_type(dtype, HALF_M, head_dv), "dynamic": "i32"}
    return _compile(fwd_kernel, types, dict(BROADCAST=broadcast, CAUSAL=causal, BLOCK_N=block_n, HEAD_D=head_d,
                                            HEAD_DV=head_dv, STAGES=stages, TMA_STORE=tma_store))
