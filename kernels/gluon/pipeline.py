"""What the three Hopper (sm_90) Gluon kernels share: Triton-version shims, TMA descriptors, the item
hand-off between the loader warp and the consumer warp groups, the query-tile decoder, ragged-tile
zeroing, output stores, and compiling a kernel for sm_90 without a GPU.

Every kernel here is laid out the same way (as FA3 lays out its Hopper kernels): a one-warp loader
partition streams tiles through TMA into rings of shared-memory buffers with ready / empty mbarriers, and
two 4-warp consumer groups run ``wgmma`` on 64 rows each.  Program p takes launch position p first, then
p + P, ... (round-robin) or, when the launch says ``dynamic`` (a runtime flag: one compiled variant serves
both deals), whichever position it claims next from an atomic counter;
the loader names each position to the consumers through a small shared buffer published with the item's
first tile, and a position past the end stops them.  TMA descriptors cover the packed 2-D views
``[rows, heads * dim]``, so one descriptor serves every sequence; rows past a sequence end are the next
sequence's (or zero fill past the tensor end) and are masked or zeroed where they could reach a result.
"""
import functools

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# TMA global -> shared copy: Triton 3.6 names it async_copy_global_to_shared, later versions async_load
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
# ... and shared -> global: async_copy_shared_to_global in Triton 3.6, async_store later (3.9 removed the old name)
tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
# a barrier over the calling partition's threads: thread_barrier in Triton 3.6, barrier later
partition_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier

SMEM_BYTES = 232448  # sm_90's shared memory per block


def nvmma_layout(block_shape, torch_dtype):
    return _nvmma_layout(tuple(block_shape), str(torch_dtype))


@functools.lru_cache(maxsize=None)
def _nvmma_layout(block_shape, dtype_name):
    # cached: building a layout runs about fifty Python calls, and a backward asks for twelve of the few
    # distinct ones (on short batches the host's time per call is close to the GPU's)
    gdt = {"torch.bfloat16": gl.bfloat16, "torch.float16": gl.float16, "torch.float32": gl.float32}[dtype_name]
    return gl.NVMMASharedLayout.get_default_for(list(block_shape), gdt)


def descriptor(t2d, block_shape):
    """Host TMA descriptor over a 2-D [rows, heads * dim] view."""
    return TensorDescriptor.from_tensor(t2d, list(block_shape), nvmma_layout(block_shape, t2d.dtype))


@gluon.jit
def query_tile(pos, ITEMS, H, GROUP, TILE_SEQ, TILE_BLK, CU_Q, CU_K,
               BROADCAST: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr):
    # where the item at launch position ``pos`` (ITEMS[pos] = tile * H + q head, the host's launch order) of a
    # 128-row query tile reads and writes, and how many BLOCK_N-key blocks it takes (n_full unmasked ones)
    item = gl.load(ITEMS + pos)
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
def next_pos(pos, COUNTER, dynamic):
    # the loader's next launch position: round-robin, or (dynamic != 0) the next one nobody has claimed;
    # the first P positions are the programs' own, so the counter counts from P.  ``dynamic`` is a runtime
    # value (one compiled variant serves both deals), read once per item by the loader alone
    nxt = pos + gl.num_programs(0)
    if dynamic != 0:
        nxt = gl.num_programs(0) + gl.atomic_add(COUNTER, 1, sem="relaxed")
    return nxt


@gluon.jit
def publish_pos(pos_smem, buf, pos):
    # the loader tells the consumers which launch position buffer ``buf`` holds (>= n_items: stop); the
    # ready arrive that follows publishes it
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    pos_smem.index(buf).store(gl.full([32], pos, gl.int32, layout))
    partition_barrier()


@gluon.jit
def read_pos(pos_smem, buf):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    return gl.max(pos_smem.index(buf).load(layout), 0)


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
def zero_rows_from(buf, first_row, BLOCK_N: gl.constexpr, HEAD_DV: gl.constexpr):
    # One warp rewrites rows >= first_row of a [BLOCK_N, HEAD_DV] shared tile as zeros, 8 rows at a
    # time (the loader partition runs on few registers).  0 * inf inside an MMA is NaN, so rows of the next
    # sequence must be zeros, not merely masked, wherever an MMA sums over them.
    CHUNK: gl.constexpr = 8
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [1, 1], [1, 0])
    rows = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, layout))
    for c in gl.static_range(BLOCK_N // CHUNK):
        part = buf.slice(c * CHUNK, CHUNK)
        x = part.load(layout)
        keep = gl.expand_dims(rows + c * CHUNK < first_row, 1)
        x = gl.where(keep, x, gl.zeros_like(x))
        part.store(x)


def desc_type(dtype, rows, cols):
    """A compile signature's TMA descriptor type: ``dtype`` "bf16", "fp16" or "fp32", [rows, cols] boxes."""
    gdt = {"bf16": gl.bfloat16, "fp16": gl.float16, "fp32": gl.float32}[dtype]
    return f"tensordesc<{dtype}[{rows}, {cols}],{gl.NVMMASharedLayout.get_default_for([rows, cols], gdt)!r}>"


def compile_sm90(kernel, types, constexprs):
    """Compile ``kernel`` for sm_90 without a GPU (Triton's bundled ptxas); ``types`` gives every runtime
    argument's type, ``constexprs`` every compile-time one's value.  Returns the compiled kernel, whose
    ``asm`` holds the PTX and the cubin: for checking a Triton upgrade and reading the generated code on a
    machine without a Hopper GPU (tests/test_gluon_compile.py)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    names = list(kernel.arg_names)
    signature = {n: "constexpr" if n in constexprs else types[n] for n in names}
    values = {(names.index(n),): v for n, v in constexprs.items()}
    return triton.compile(GluonASTSource(kernel, signature, values), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4})
