"""Hopper (sm_90) forward written in Gluon: one loader warp and two consumer warp groups per CTA.

Triton's ``tl`` cannot say which warps load and which compute on sm_90 (its automatic warp
specialization failed or was slower, kernels/PERF.md v4).  Gluon can, so this kernel is laid out
the way FA3 lays out its Hopper forward:

* A work item is one 128-row query tile of one sequence and one query head; program p takes the
  items p, p + P, p + 2P, ... of the launch order (jfa.ITEM_ORDER: sequence-major, or heaviest
  tile first; P programs: one per item, or one per SM for the persistent grids, where the loader
  fetches the next item's Q and K/V while the consumers finish the current one; Q is double-buffered
  for that).  Under ``DYNAMIC`` a program takes p first and then whichever position it claims next
  from an atomic counter.  The loader names each item to the consumers through a small shared buffer
  published with the Q buffer, and a position past the end stops them.  Two consumer warp groups
  (4 warps each) take 64 rows each: one is the default partition, one a worker.  They share the
  K/V tiles, and being separate warp groups they can run one's softmax while the other's
  ``wgmma`` keeps the tensor cores busy.
* A one-warp loader partition streams K and V blocks through TMA into a ring of ``STAGES``
  shared-memory buffers, with ready / empty mbarriers per buffer (empty needs both consumers).
* TMA descriptors cover the packed 2-D views ``[rows, heads * dim]``, so one descriptor serves
  every sequence.  Reading past a sequence end reads the next sequence's rows (or zero fill past
  the tensor end): query rows past ``lq`` are computed and never stored; key scores past ``lk``
  are masked to -inf; and because ``0 * inf`` is NaN inside the MMA, the loader zeroes value rows
  past ``lk`` in the ragged last block before publishing it.
* Schedules (``SCHEDULE``): "overlap" runs block j's softmax while block j-1's PV is in flight;
  "pingpong" adds FA3's hand-off: the two consumer groups take turns to issue their MMAs (a token
  passed through two mbarriers).  (A third, "plain": QK^T, softmax and PV in turn, was removed: never
  faster on the H200, and after the persistent rewrite it made an out-of-range shared-memory access,
  kernels/PERF.md v7.)
* Softmax in base 2 with the scale folded into one FMA per score (``s * scale - m``, valid because
  the scale is positive; the host refuses any other).  Output rows and LSE are stored with masked pointer stores (a TMA
  store would write into the next sequence).

Same conventions as kernels/triton_kernels.py: bottom-right causal, natural-log LSE [Hq, rows],
rows with no visible key give 0 and -inf, broadcast-Q output row b * Lq + i.
"""
import functools

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.language.core import _aggregate as aggregate

# TMA global -> shared copy: Triton 3.6 names it async_copy_global_to_shared, later versions async_load
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
# ... and shared -> global: async_copy_shared_to_global in Triton 3.6, async_store later (3.9 removed the old name)
tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
# a barrier over the calling partition's threads: thread_barrier in Triton 3.6, barrier later
partition_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier

HALF_M = 64  # rows per consumer warp group: one wgmma M-extent
BLOCK_M = 2 * HALF_M


def nvmma_layout(block_shape, torch_dtype):
    return _nvmma_layout(tuple(block_shape), str(torch_dtype))


@functools.lru_cache(maxsize=None)
def _nvmma_layout(block_shape, dtype_name):
    # cached: building a layout runs about fifty Python calls, and a backward asks for twelve of the few
    # distinct ones (the host's time per call is near the GPU's on short batches, PERF.md v19)
    gdt = {"torch.bfloat16": gl.bfloat16, "torch.float16": gl.float16, "torch.float32": gl.float32}[dtype_name]
    return gl.NVMMASharedLayout.get_default_for(list(block_shape), gdt)


def descriptor(t2d, block_shape):
    """Host TMA descriptor over a 2-D [rows, heads * dim] view."""
    return TensorDescriptor.from_tensor(t2d, list(block_shape), nvmma_layout(block_shape, t2d.dtype))


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
    SCHEDULE: gl.constexpr
    GROUPED: gl.constexpr
    DYNAMIC: gl.constexpr
    TMA_STORE: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, WG, BROADCAST, CAUSAL, BLOCK_N, HEAD_D, HEAD_DV, STAGES, SCHEDULE, GROUPED, DYNAMIC,
                 TMA_STORE):
        self.WG = gl.constexpr(WG)
        self.BROADCAST = gl.constexpr(BROADCAST)
        self.CAUSAL = gl.constexpr(CAUSAL)
        self.BLOCK_N = gl.constexpr(BLOCK_N)
        self.HEAD_D = gl.constexpr(HEAD_D)
        self.HEAD_DV = gl.constexpr(HEAD_DV)
        self.STAGES = gl.constexpr(STAGES)
        self.SCHEDULE = gl.constexpr(SCHEDULE)
        self.GROUPED = gl.constexpr(GROUPED)
        self.DYNAMIC = gl.constexpr(DYNAMIC)
        self.TMA_STORE = gl.constexpr(TMA_STORE)


@gluon.jit
def _tile(pos, ITEMS, H, GROUP, TILE_SEQ, TILE_BLK, CU_Q, CU_K,
          BROADCAST: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, GROUPED: gl.constexpr):
    # where the item at launch position ``pos`` (item = tile * H + q head; ITEMS[pos] under GROUPED,
    # the host's sequence-major order, else pos itself) reads and writes, and how many key blocks it takes
    if GROUPED:
        item = gl.load(ITEMS + pos)
    else:
        item = pos
    tile = item // H
    h = item % H
    b = gl.load(TILE_SEQ + tile)
    mblk = gl.load(TILE_BLK + tile)
    # offsets may be int64; rows fit in int32 (the host checks the TMA rules), TMA coordinates are int32
    k_start = gl.load(CU_K + b).to(gl.int32)
    lk = gl.load(CU_K + b + 1).to(gl.int32) - k_start
    if BROADCAST:
        q_start = k_start * 0
        lq = gl.load(CU_Q + 1).to(gl.int32)
        o_start = lq.to(gl.int64) * b
    else:
        q_start = gl.load(CU_Q + b).to(gl.int32)
        lq = gl.load(CU_Q + b + 1).to(gl.int32) - q_start
        o_start = q_start.to(gl.int64)
    m0 = mblk * 128
    diag = lk - lq
    if CAUSAL:
        hi = gl.maximum(gl.minimum(lk, m0 + 128 + diag), 0)
        full_hi = gl.maximum(gl.minimum(lk, m0 + 1 + diag), 0)
    else:
        hi = lk
        full_hi = lk
    n_full = full_hi // BLOCK_N
    n_blocks = (hi + BLOCK_N - 1) // BLOCK_N
    return q_start, o_start, lq, k_start, lk, h, h // GROUP, m0, diag, n_full, n_blocks


@gluon.jit
def _next_pos(pos, COUNTER, DYNAMIC: gl.constexpr):
    # the loader's next launch position: round-robin, or (dynamic) the next one nobody has claimed;
    # the first P positions are the programs' own, so the counter counts from P
    if DYNAMIC:
        return gl.num_programs(0) + gl.atomic_add(COUNTER, 1, sem="relaxed")
    else:
        return pos + gl.num_programs(0)


@gluon.jit
def _publish_pos(pos_smem, qb, pos):
    # the loader tells the consumers which launch position Q buffer qb holds (>= n_items: stop); the
    # q_ready arrive that follows publishes it
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    pos_smem.index(qb).store(gl.full([32], pos, gl.int32, layout))
    partition_barrier()


@gluon.jit
def _read_pos(pos_smem, qb):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    return gl.max(pos_smem.index(qb).load(layout), 0)


@gluon.jit
def store_rows(x, buf, desc, base, row0, n_rows, col, stride_row, BY_TMA: gl.constexpr, layout: gl.constexpr):
    # Writes x ([R, C] in ``layout``, already in the output's dtype) to rows row0 .. row0 + R - 1 of a
    # [rows, heads * C] output, from column ``col`` of a row (``base`` points at that column of row 0).
    # BY_TMA and a tile wholly inside its sequence (n_rows >= R): through ``buf`` (shared memory nothing
    # reads any more, x's shape, desc's layout) by one TMA store; the caller waits for it (tma.store_wait)
    # before buf is reused.  Otherwise masked stores of rows < n_rows: a TMA store of a ragged tile would
    # write into the next sequence's rows, whose owner may already have written them.
    R: gl.constexpr = x.shape[0]
    C: gl.constexpr = x.shape[1]
    if BY_TMA and n_rows >= R:
        buf.store(x)
        fence_async_shared()
        partition_barrier()
        tma_store(desc, [row0.to(gl.int32), col.to(gl.int32)], buf)  # (TMA coordinates are 32-bit)
    else:
        rows = gl.arange(0, R, layout=gl.SliceLayout(1, layout))
        cols = gl.arange(0, C, layout=gl.SliceLayout(0, layout))
        ptrs = base + gl.expand_dims((row0 + rows).to(gl.int64) * stride_row, 1) + gl.expand_dims(cols, 0)
        gl.store(ptrs, x, mask=gl.expand_dims(rows < n_rows, 1) & gl.expand_dims(cols < C, 0))


@gluon.jit
def release_after_stores(empty_bar):
    # the TMA stores issued from a buffer (store_rows) have read it: hand it back to the loader
    tma.store_wait(0)
    partition_barrier()
    mbarrier.arrive(empty_bar)


@gluon.jit
def _zero_rows_from(buf, first_row, BLOCK_N: gl.constexpr, HEAD_DV: gl.constexpr):
    # One warp rewrites rows >= first_row of a [BLOCK_N, HEAD_DV] shared tile as zeros, 8 rows at a
    # time (the loader partition runs on few registers).
    CHUNK: gl.constexpr = 8
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [1, 1], [1, 0])
    rows = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, layout))
    for c in gl.static_range(BLOCK_N // CHUNK):
        part = buf.slice(c * CHUNK, CHUNK)
        x = part.load(layout)
        keep = gl.expand_dims(rows + c * CHUNK < first_row, 1)
        x = gl.where(keep, x, gl.zeros_like(x))
        part.store(x)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, pos_smem, q_ready, q_empty, k_ready, v_ready,
            k_empty, v_empty, tail_bar, ITEMS, COUNTER, TILE_SEQ, TILE_BLK, CU_Q, CU_K, H, GROUP, n_items, flags):
    BLOCK_N: gl.constexpr = flags.BLOCK_N
    HEAD_D: gl.constexpr = flags.HEAD_D
    HEAD_DV: gl.constexpr = flags.HEAD_DV
    STAGES: gl.constexpr = flags.STAGES
    r0 = 0  # ring position of the current item's first key block (the ring runs on across items)
    n_tails = 0
    tq = 0  # items so far: Q buffer tq % 2
    pos = gl.program_id(0)
    while pos < n_items:
        q_start, o_start, lq, k_start, lk, h, hk, m0, diag, n_full, n_blocks = _tile(
            pos, ITEMS, H, GROUP, TILE_SEQ, TILE_BLK, CU_Q, CU_K, flags.BROADCAST, flags.CAUSAL, BLOCK_N,
            flags.GROUPED)
        qb = tq % 2
        # a fresh barrier counts as having completed the phase before 0, so first rounds do not wait
        mbarrier.wait(q_empty.index(qb), ((tq // 2) & 1) ^ 1)
        _publish_pos(pos_smem, qb, pos)
        mbarrier.expect(q_ready.index(qb), 2 * q_desc.block_type.nbytes)
        tma_load(q_desc, [q_start + m0, h * HEAD_D], q_ready.index(qb), q_smem.index(2 * qb))
        tma_load(q_desc, [q_start + m0 + 64, h * HEAD_D], q_ready.index(qb),
                                        q_smem.index(2 * qb + 1))
        for j in range(n_blocks):
            r = r0 + j
            s = r % STAGES
            ph = (r // STAGES) & 1
            start = j * BLOCK_N
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
                _zero_rows_from(v_smem.index(s), lk - start, BLOCK_N, HEAD_DV)
                fence_async_shared()
                mbarrier.arrive(v_ready.index(s))
                n_tails += 1
        r0 += n_blocks
        tq += 1
        pos = _next_pos(pos, COUNTER, flags.DYNAMIC)
    # no more items: a Q buffer holding a position past the end stops the consumers
    qb = tq % 2
    mbarrier.wait(q_empty.index(qb), ((tq // 2) & 1) ^ 1)
    _publish_pos(pos_smem, qb, n_items)
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
def _my_turn(turn, t, WG: gl.constexpr, PINGPONG: gl.constexpr):
    # ping-pong: the two consumer groups take turns to issue their MMAs, so one group's softmax runs
    # while the other's MMAs use the tensor cores (left alone, they fall into step, since they wait
    # on the same K/V buffers).  Group 0 goes first: its first wait is on the phase before 0.
    if PINGPONG:
        mbarrier.wait(turn.index(WG), (t & 1) ^ (1 - WG))


@gluon.jit
def _pass_turn(turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - WG))


@gluon.jit
def _pipelined_block(j, r, t, acc, p_prev, l_i, m_i, q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                     turn, offs_m, offs_n, lk, diag, qk_scale,
                     MASKED: gl.constexpr, CAUSAL: gl.constexpr,
                     BLOCK_N: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr, PINGPONG: gl.constexpr,
                     s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr):
    # key block j (ring position r, turn t): its softmax runs while block j-1's PV is in flight
    # (FA3's intra-warpgroup overlap): issue QK^T(j), issue PV(j-1), wait for QK^T only, softmax(j),
    # then wait for PV and rescale.
    s = r % STAGES
    sp = (r - 1) % STAGES
    _my_turn(turn, t, WG, PINGPONG)
    qk = _issue_qk(r, q, k_smem, k_ready, BLOCK_N, STAGES, s_layout)
    mbarrier.wait(v_ready.index(sp), ((r - 1) // STAGES) & 1)
    pv = warpgroup_mma(p_prev, v_smem.index(sp), acc, is_async=True)
    _pass_turn(turn, WG, PINGPONG)
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
def _consumer(q_smem, k_smem, v_smem, pos_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turn,
              O, LSE, ITEMS, COUNTER, TILE_SEQ, TILE_BLK, CU_Q, CU_K, H, GROUP, n_items,
              stride_ot, stride_oh, stride_lh, qk_scale, o_desc, flags):
    WG: gl.constexpr = flags.WG
    CAUSAL: gl.constexpr = flags.CAUSAL
    BLOCK_N: gl.constexpr = flags.BLOCK_N
    HEAD_DV: gl.constexpr = flags.HEAD_DV
    STAGES: gl.constexpr = flags.STAGES
    PINGPONG: gl.constexpr = flags.SCHEDULE == "pingpong"
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DV, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    r0 = 0  # ring position of the item's first key block
    t0 = 0  # turns taken so far (ping-pong)
    tq = 0  # items so far: Q buffer tq % 2
    # the loader names each item it loads (and, last, a position past the end)
    mbarrier.wait(q_ready.index(0), 0)
    pos = _read_pos(pos_smem, 0)
    while pos < n_items:
        q_start, o_start, lq, k_start, lk, h, hk, m0, diag, n_full, n_blocks = _tile(
            pos, ITEMS, H, GROUP, TILE_SEQ, TILE_BLK, CU_Q, CU_K, flags.BROADCAST, CAUSAL, BLOCK_N,
            flags.GROUPED)
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
                _my_turn(turn, t0, WG, PINGPONG)
                qk = _issue_qk(r0, q, k_smem, k_ready, BLOCK_N, STAGES, s_layout)
                _pass_turn(turn, WG, PINGPONG)
                scores = warpgroup_mma_wait(0, deps=(qk, ))
                mbarrier.arrive(k_empty.index(r0 % STAGES))
                if n_full > 0:
                    p, alpha, l_i, m_i = _softmax_step(scores, m_i, l_i, 0, offs_m, offs_n, lk, diag,
                                                       qk_scale, False, CAUSAL, BLOCK_N)
                else:
                    p, alpha, l_i, m_i = _softmax_step(scores, m_i, l_i, 0, offs_m, offs_n, lk, diag,
                                                       qk_scale, True, CAUSAL, BLOCK_N)
                p_op = gl.convert_layout(p.to(v_smem.dtype), p_layout)
                for j in range(1, n_full):
                    acc, p_op, l_i, m_i = _pipelined_block(
                        j, r0 + j, t0 + j, acc, p_op, l_i, m_i, q, k_smem, v_smem, k_ready, v_ready,
                        k_empty, v_empty, turn, offs_m, offs_n, lk, diag, qk_scale, False, CAUSAL,
                        BLOCK_N, STAGES, WG, PINGPONG, s_layout, o_layout, p_layout)
                for j in range(gl.maximum(n_full, 1), n_blocks):
                    acc, p_op, l_i, m_i = _pipelined_block(
                        j, r0 + j, t0 + j, acc, p_op, l_i, m_i, q, k_smem, v_smem, k_ready, v_ready,
                        k_empty, v_empty, turn, offs_m, offs_n, lk, diag, qk_scale, True, CAUSAL,
                        BLOCK_N, STAGES, WG, PINGPONG, s_layout, o_layout, p_layout)
                last = r0 + n_blocks - 1
                _my_turn(turn, t0 + n_blocks, WG, PINGPONG)
                mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
                acc = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
                _pass_turn(turn, WG, PINGPONG)
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
            # no query row of this half is real: release every buffer and pass every turn, in the order
            # the active group's pipelined schedule takes them (turn t: K(t) and V(t-1)), so neither
            # group ever waits on something the other can only give after its own next turn
            if n_blocks > 0:  # with no key block the active group takes no turn either
                for t in range(0, n_blocks + 1):
                    _my_turn(turn, t0 + t, WG, PINGPONG)
                    _pass_turn(turn, WG, PINGPONG)
                    if t < n_blocks:
                        mbarrier.wait(k_ready.index((r0 + t) % STAGES), ((r0 + t) // STAGES) & 1)
                        mbarrier.arrive(k_empty.index((r0 + t) % STAGES))
                    if t > 0:
                        mbarrier.wait(v_ready.index((r0 + t - 1) % STAGES), ((r0 + t - 1) // STAGES) & 1)
                        mbarrier.arrive(v_empty.index((r0 + t - 1) % STAGES))
            mbarrier.arrive(q_empty.index(qb))
        r0 += n_blocks
        tq += 1
        if PINGPONG:
            if n_blocks > 0:
                t0 += n_blocks + 1
        mbarrier.wait(q_ready.index(tq % 2), (tq // 2) & 1)
        pos = _read_pos(pos_smem, tq % 2)


@gluon.jit
def fwd_kernel(q_desc, k_desc, v_desc, O, LSE, CU_Q, CU_K, TILE_SEQ, TILE_BLK, ITEMS, COUNTER,
               stride_ot, stride_oh, stride_lh, qk_scale, H, GROUP, n_items, o_desc,
               BROADCAST: gl.constexpr, CAUSAL: gl.constexpr,
               BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, HEAD_DV: gl.constexpr,
               STAGES: gl.constexpr, SCHEDULE: gl.constexpr, GROUPED: gl.constexpr = False,
               DYNAMIC: gl.constexpr = False, TMA_STORE: gl.constexpr = False):
    # work items: (128-row query tile, query head), heaviest first (or in ITEMS' order under GROUPED);
    # program p runs the launch positions p, p + P, ... (DYNAMIC: p, then those it claims from COUNTER,
    # a zeroed int32)
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
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    pos_smem = gl.allocate_shared_memory(gl.int32, [2, 32], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    mbarrier.init(tail_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)  # both consumer groups release a Q buffer
        mbarrier.init(turn.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # ... and every K/V buffer
        mbarrier.init(v_empty.index(i), count=2)
    fence_async_shared()
    # the two consumer groups differ only in which 64 rows they take (the flags' WG)
    shared = (q_smem, k_smem, v_smem, pos_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turn,
              O, LSE, ITEMS, COUNTER, TILE_SEQ, TILE_BLK, CU_Q, CU_K, H, GROUP, n_items, stride_ot, stride_oh, stride_lh,
              qk_scale, o_desc)
    gl.warp_specialize([
        (_consumer, shared + (PartitionFlags(0, BROADCAST, CAUSAL, BLOCK_N, HEAD_D, HEAD_DV, STAGES, SCHEDULE,
                                             GROUPED, DYNAMIC, TMA_STORE), )),
        (_consumer, shared + (PartitionFlags(1, BROADCAST, CAUSAL, BLOCK_N, HEAD_D, HEAD_DV, STAGES, SCHEDULE,
                                             GROUPED, DYNAMIC, TMA_STORE), )),
        (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, pos_smem, q_ready, q_empty, k_ready, v_ready,
                   k_empty, v_empty, tail_bar, ITEMS, COUNTER, TILE_SEQ, TILE_BLK, CU_Q, CU_K, H, GROUP, n_items,
                   PartitionFlags(2, BROADCAST, CAUSAL, BLOCK_N, HEAD_D, HEAD_DV, STAGES, SCHEDULE, GROUPED,
                                  DYNAMIC, TMA_STORE))),
    ], [4, 1], [232, 40])


def compile_sm90(block_n=128, head_d=128, head_dv=128, stages=2, schedule="overlap", causal=False,
                 broadcast=False, dtype="bf16", grouped=False, dynamic=False, tma_store=False):
    """Compile ``fwd_kernel`` for sm_90 without a GPU (Triton's bundled ptxas); returns the compiled
    kernel, whose ``asm`` holds the PTX and the cubin.  For checking a Triton upgrade and reading the
    generated code on a machine without a Hopper GPU."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    gdt = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]

    def desc(rows, cols):
        return f"tensordesc<{dtype}[{rows}, {cols}],{gl.NVMMASharedLayout.get_default_for([rows, cols], gdt)!r}>"

    signature = {
        "q_desc": desc(HALF_M, head_d), "k_desc": desc(block_n, head_d), "v_desc": desc(block_n, head_dv),
        "O": "*" + dtype, "LSE": "*fp32", "CU_Q": "*i32", "CU_K": "*i32", "TILE_SEQ": "*i32", "TILE_BLK": "*i32",
        "ITEMS": "*i32", "COUNTER": "*i32",
        "stride_ot": "i32", "stride_oh": "i32", "stride_lh": "i32", "qk_scale": "fp32", "H": "i32",
        "GROUP": "i32", "n_items": "i32", "o_desc": desc(HALF_M, head_dv),
        "BROADCAST": "constexpr", "CAUSAL": "constexpr", "BLOCK_N": "constexpr", "HEAD_D": "constexpr",
        "HEAD_DV": "constexpr", "STAGES": "constexpr", "SCHEDULE": "constexpr", "GROUPED": "constexpr",
        "DYNAMIC": "constexpr", "TMA_STORE": "constexpr",
    }
    values = dict(BROADCAST=broadcast, CAUSAL=causal, BLOCK_N=block_n, HEAD_D=head_d, HEAD_DV=head_dv,
                  STAGES=stages, SCHEDULE=schedule, GROUPED=grouped, DYNAMIC=dynamic, TMA_STORE=tma_store)
    names = list(signature)
    constexprs = {(names.index(k),): v for k, v in values.items()}
    return triton.compile(GluonASTSource(fwd_kernel, signature, constexprs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
