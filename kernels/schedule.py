"""Tile scheduling on the device: the tile lists and launch orders of a call, built by small Triton kernels
from the offsets where they are, so a call never waits for the GPU to read them on the host.

A *tile* is one (sequence, block) pair: a block of ``block`` query rows of one sequence (forward, dQ) or of
``block`` key rows (dK/dV).  A kernel runs one program (tl) or one loop iteration (Gluon) per (tile, head)
*item*; ``TileList.items[p]`` is the item at launch position p, ``tile * heads + head``, in this order:

* sequences by visible (query, key) pairs, heaviest first; equal pairs: the lower sequence index first.
  One order per call (``Order``), shared by the forward's and the backward's lists;
* then the sequence's tiles, heaviest first: the last query block first under causal masking (it sees the
  most keys), else in block order (a key block's query count falls with its index under causal masking, so
  dK/dV keeps block order too); and each tile's heads.  Without causal masking, or with
  ``ListSpec.group_rows`` 0, head by head (all of a head's tiles, then the next head's).  Under causal
  masking a sequence's heads go in groups, tile by tile across a group's heads (its heaviest tiles on
  every head, then the next heaviest, ...), so a launch ends on light tiles wherever a sequence ends
  (FA3's "LPT" order): a group holds as many heads as keep ``group_rows`` rows of the streamed side (keys
  for query tiles, queries for key tiles) of the sequence, at least one, at most ``heads``.

Programs in flight then read the same few (sequence, head) pairs' K/V (or Q/dO), which L2 serves, and the
hardware block scheduler (or a Gluon kernel's item counter) deals the items to SMs as they free up, the
longest first.  The sort key packs (2**41 - 1 - pairs) above the sequence index (22 bits), so one integer
sort orders both; on a GPU up to 4,096 sequences are sorted in the builder's registers, more (and every
batch under the interpreter, whose sort is slow) by ``torch.sort``.

Launches: the order and the lists in one program up to 512 sequences (one launch); up to 4,096, the order
and the lists' tiles in one program, then one grid writing the items (two launches); more sequences than the
register sort takes: four.  The backward's lists, from the forward's order: two more.

The host knows only bounds: at most ``cdiv(rows, block) + B`` tiles.  The actual counts land in
``TileList.counts`` ([items, tiles], int32, on the device); the kernels read the item count from there,
and launch positions past it do nothing.

Offsets are read *clamped*: each sequence's length is ``max(0, min(cu[i + 1], rows) - max(cu[i], 0))``
(entry 0 read as 0) and the clamped offsets are the running sums of these lengths, capped at ``rows``:
non-decreasing, within ``[0, rows]``, and the offsets themselves when they are well formed.  The order's builder writes these offsets (``Order.cu_q`` / ``cu_k``) and the kernels read only them,
so even malformed offsets (which the host checks only on request, validation.py) cannot send a kernel
outside q, k, v or the outputs.

``zigzag_assign`` / ``round_robin_assign`` / ``imbalance`` (numpy) deal tiles to a fixed number of bins and
measure such a deal: the static alternative to the dynamic deal, kept with the seed document's numbers as a
test; ``claim_assign`` models the dynamic deal itself (the causal head groups' test).
"""
from __future__ import annotations

import functools
import heapq
from typing import NamedTuple, Optional, Sequence

import numpy as np
import torch
import triton
import triton.language as tl

_REGISTER_SORTS = (256, 1024, 4096)  # sizes of the in-register sort (compiled once each)
MAX_SEQS = (1 << 22) - 1  # the sort key's index field
_EXPAND_SEQS = 32  # sequences per program of the grid writing the lists
_EXPAND_IN_BUILDER: tl.constexpr = tl.constexpr(64)  # sequences per step of the builder's own expansion
MAX_CHUNKS = 1023  # broadcast-Q dQ chunks (one histogram bin stays free for padding)

# which sequences a forward list takes, by their key count against the split (the Gluon forward's side)
ALL, KEYS_AT_LEAST, KEYS_BELOW = 0, 1, 2


class Order(NamedTuple):
    """The sequences of a call, heaviest first, and the clamped offsets the kernels read."""
    order: torch.Tensor  # int32 [B]
    cu_q: torch.Tensor  # [B + 1] (broadcast-Q: [0, Lq]), int32 where every offset fits
    cu_k: torch.Tensor
    rows_q: int  # query rows (broadcast-Q: Lq)
    rows_k: int

    @property
    def n_seqs(self) -> int:
        return self.cu_k.shape[0] - 1


class ListSpec(NamedTuple):
    """One kernel's tiles: query blocks (``kv`` False) or key blocks of ``block`` rows, ``heads`` items per
    tile; a forward list takes only the sequences on its ``side`` of ``split`` keys."""
    block: int
    heads: int
    kv: bool = False
    side: int = ALL
    split: int = 0
    group_rows: int = 0  # under causal masking, heads go in groups of this many streamed rows (docstring)


class TileList(NamedTuple):
    """One kernel's tiles and launch order, on the device (int32)."""
    seq: torch.Tensor  # [tile_bound]: each tile's sequence
    blk: torch.Tensor  # [tile_bound]: its block index within the sequence
    items: torch.Tensor  # [tile_bound * heads]: launch position -> tile * heads + head
    counts: torch.Tensor  # [4]: items, tiles (past them the arrays are unused), 2 unused
    heads: int
    n_items: int  # the item count where the host knows it (a JaggedPlan), else the bound

    def known(self) -> "TileList":
        """This list with its item count read back to the host (one wait for the GPU; plans do it once)."""
        return self._replace(n_items=int(self.counts[0]))


class Columns(NamedTuple):
    """Where each output row lies in the Gluon backward's fp32 statistics buffer (laid out [..., columns]).

    The Gluon dK/dV kernel moves 32 rows at a time from it to shared memory by TMA; a TMA copy whose
    innermost coordinate is not 16 bytes aligned stops the kernel with an illegal instruction (measured on
    the H200), so every sequence starts at a column that is a multiple of 4."""
    cu: torch.Tensor  # int32 [B + 1]: first column of each sequence
    cols: torch.Tensor  # int32 [rows]: column of each output row
    n_cols: int  # a bound, a multiple of 4: rows + 3 B rounded up, at least 4


class Chunks(NamedTuple):
    """Broadcast-Q's tl dQ tiles: each covers one query block over a contiguous chunk of batches (about equal
    work each), whose fp32 partial goes to the chunk's slot; chunk after chunk."""
    b_lo: torch.Tensor
    b_hi: torch.Tensor
    blk: torch.Tensor
    slot: torch.Tensor
    n_tiles: int
    n_slots: int


def _cdiv(a, b):
    return -(-a // b)


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _flag(like, value):
    # a runtime int as a boolean vector shaped like ``like`` (a mask under the interpreter too)
    return (like * 0 + value) != 0


@triton.jit
def _clamped_ends(CU, idx, ok, rows, carry):
    # the clamped offsets of sequences idx (their first and end rows): lengths max(0, min(cu[i + 1], rows) -
    # max(cu[i], 0)) (entry 0 read as 0), summed from ``carry`` (the lengths before idx[0]), capped at rows.
    # (For well-formed offsets: the offsets themselves.)
    lo = tl.load(CU + idx, mask=ok, other=0).to(tl.int64)
    lo = tl.where(idx == 0, 0, tl.maximum(lo, 0))
    hi = tl.minimum(tl.load(CU + idx + 1, mask=ok, other=0).to(tl.int64), rows)
    n = tl.where(ok, tl.maximum(hi - lo, 0), 0)
    end = carry + tl.cumsum(n, 0)
    return tl.minimum(end - n, rows), tl.minimum(end, rows), carry + tl.sum(n, 0)


@triton.jit
def _lengths(CU_Q, CU_K, seq, ok, broadcast):
    # lengths of sequences ``seq`` from the clamped offsets
    k0 = tl.load(CU_K + seq, mask=ok, other=0).to(tl.int64)
    lk = tl.load(CU_K + seq + 1, mask=ok, other=0).to(tl.int64) - k0
    lq_all = tl.load(CU_Q + seq * 0 + 1, mask=ok & broadcast, other=0).to(tl.int64)  # broadcast-Q: Lq
    q0 = tl.load(CU_Q + seq, mask=ok & ~broadcast, other=0).to(tl.int64)
    lq = tl.load(CU_Q + seq + 1, mask=ok & ~broadcast, other=0).to(tl.int64) - q0
    return tl.where(broadcast, lq_all, lq), lk


@triton.jit
def _sort_keys(CU_Q, CU_K, CU_Q_OUT, CU_K_OUT, idx, ok, carry_q, carry_k, lq_all, rows_q, rows_k, causal,
               broadcast):
    # sequences idx: lengths from the clamped offsets (written out), their sort keys; the new carries
    k_lo, k_hi, carry_k = _clamped_ends(CU_K, idx, ok, rows_k, carry_k)
    lk = k_hi - k_lo
    tl.store(CU_K_OUT + idx + 1, k_hi.to(CU_K_OUT.dtype.element_ty), mask=ok)
    q_lo, q_hi, carry_q = _clamped_ends(CU_Q, idx, ok & ~broadcast, rows_q, carry_q)
    tl.store(CU_Q_OUT + idx + 1, q_hi.to(CU_Q_OUT.dtype.element_ty), mask=ok & ~broadcast)
    lq = tl.where(broadcast, lq_all, q_hi - q_lo)
    # visible (query, key) pairs: every pair, or under bottom-right causal masking row i sees
    # max(0, i + 1 + lk - lq) keys
    causal_pairs = tl.where(lk >= lq, lq * (lk - lq) + lq * (lq + 1) // 2, lk * (lk + 1) // 2)
    pairs = tl.minimum(tl.where(causal, causal_pairs, lq * lk), 2199023255551)  # 2**41 - 1
    key = ((2199023255551 - pairs) << 22) | idx.to(tl.int64)
    return tl.where(ok, key, 9223372036854775807), carry_q, carry_k


@triton.jit
def _offsets_prologue(CU_Q, CU_Q_OUT, CU_K_OUT, rows_q, broadcast, BLOCK: tl.constexpr):
    # entry 0 of the clamped offsets (and broadcast-Q's [0, Lq]); returns Lq, clamped
    offs = tl.arange(0, BLOCK)
    bc = _flag(offs, broadcast)
    lq_all = tl.sum(tl.load(CU_Q + offs, mask=(offs == 1) & bc, other=0).to(tl.int64), 0)
    lq_all = tl.minimum(tl.maximum(lq_all, 0), rows_q)
    zero = tl.zeros([BLOCK], tl.int64)
    tl.store(CU_K_OUT + offs, zero.to(CU_K_OUT.dtype.element_ty), mask=offs == 0)
    tl.store(CU_Q_OUT + offs, tl.where(offs == 0, zero, lq_all).to(CU_Q_OUT.dtype.element_ty),
             mask=(offs == 0) | ((offs == 1) & bc))
    return lq_all


@triton.jit
def _list_tiles(lq, lk, ok, pos, NBLK, START, carry, block, kv, side, split):
    # one list's tiles of the sequences at sorted positions ``pos`` (lengths lq, lk): their count into
    # NBLK[pos], their first tile (a running prefix over the order) into START[pos]; the new carry.
    # kv: every key block, sequences with no queries too (their dK / dV are zeros); else the query blocks
    # of the sequences on this list's side of the split
    kvv = _flag(pos, kv)
    sd = pos * 0 + side
    n = (tl.where(kvv, lk, lq) + block - 1) // block
    n = tl.where(~kvv & (sd == 1) & (lk < split), 0, n)
    n = tl.where(~kvv & (sd == 2) & (lk >= split), 0, n)
    n = tl.where(ok, n, 0)
    tl.store(NBLK + pos, n.to(tl.int32), mask=ok)
    tl.store(START + pos, (carry + tl.cumsum(n, 0) - n).to(tl.int32), mask=ok)
    return carry + tl.sum(n, 0)


@triton.jit
def _lists_block(CU_Q, CU_K, ORDER, pos, ok, broadcast, NBLK_A, START_A, carry_a, block_a, kv_a, side_a,
                 NBLK_B, START_B, carry_b, block_b, kv_b, side_b, split, two):
    # both lists' tiles for sorted positions ``pos``
    seq = tl.load(ORDER + pos, mask=ok, other=0)
    lq, lk = _lengths(CU_Q, CU_K, seq, ok, _flag(pos, broadcast))
    carry_a = _list_tiles(lq, lk, ok, pos, NBLK_A, START_A, carry_a, block_a, kv_a, side_a, split)
    carry_b = _list_tiles(lq, lk, ok & _flag(pos, two), pos, NBLK_B, START_B, carry_b, block_b, kv_b, side_b,
                          split)
    return carry_a, carry_b


@triton.jit
def _store_counts(COUNTS_A, COUNTS_B, carry_a, carry_b, heads_a, heads_b, two, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(COUNTS_A + offs, tl.where(offs == 0, carry_a * heads_a, carry_a).to(tl.int32), mask=offs < 2)
    tl.store(COUNTS_B + offs, tl.where(offs == 0, carry_b * heads_b, carry_b).to(tl.int32),
             mask=(offs < 2) & _flag(offs, two))


@triton.jit
def _expand_one(s, pos, ok, lq, lk, NBLK, START, SEQ, BLK, ITEMS, heads, reverse, group_rows,
                TILES: tl.constexpr):
    # one list's tiles and items of the sequences s at sorted positions pos (lengths lq, lk): a
    # [sequences, TILES] block at a time, as far as the group's longest tile run.  reverse (query tiles
    # under causal masking): blocks last to first.  group_rows > 0 (causal masking only): heads in groups of
    # group_rows // (streamed rows) heads, tile-major within a group (module docstring)
    n = tl.load(NBLK + pos, mask=ok, other=0)
    t0 = tl.load(START + pos, mask=ok, other=0)
    n2, t2, s2 = n[:, None], t0[:, None], s[:, None]
    rev = _flag(n2, reverse)
    streamed = tl.where(_flag(lk, reverse), lk, lq)
    g = tl.where(_flag(lk, group_rows), group_rows // tl.maximum(streamed, 1), 1)
    g2 = tl.minimum(tl.maximum(g, 1), heads)[:, None]
    for j0 in range(0, tl.max(n, 0), TILES):
        j = j0 + tl.arange(0, TILES)[None, :]
        m = j < n2
        tl.store(SEQ + t2 + j, s2 + j * 0, mask=m)
        tl.store(BLK + t2 + j, tl.where(rev, n2 - 1 - j, j), mask=m)
        for h in range(heads):
            h0 = h // g2 * g2  # the head's group: heads h0 .. h0 + size - 1
            size = tl.minimum(g2, heads - h0)
            tl.store(ITEMS + t2 * heads + h0 * n2 + j * size + (h - h0), (t2 + j) * heads + h, mask=m)


# the builders' integer arguments are not specialized on (sizes follow the batch; flags, tiles and head counts the
# call): one variant per sort size
@triton.jit(do_not_specialize=['B', 'rows_q', 'rows_k', 'causal', 'broadcast', 'block_a', 'heads_a', 'kv_a', 'side_a',
                                  'block_b', 'heads_b', 'kv_b', 'side_b', 'split', 'two', 'reverse_a', 'reverse_b',
                                  'group_a', 'group_b', 'expand'])
def _order_kernel(CU_Q, CU_K, CU_Q_OUT, CU_K_OUT, ORDER, KEYS, B, rows_q, rows_k, causal, broadcast,
                  NBLK_A, START_A, COUNTS_A, block_a, heads_a, kv_a, side_a,
                  NBLK_B, START_B, COUNTS_B, block_b, heads_b, kv_b, side_b, split, two,
                  SEQ_A, BLK_A, ITEMS_A, reverse_a, group_a, SEQ_B, BLK_B, ITEMS_B, reverse_b, group_b, expand,
                  SORT: tl.constexpr, IN_REGISTERS: tl.constexpr):
    # one program.  IN_REGISTERS (B <= SORT): the clamped offsets, the order (sorted in registers) and both
    # lists' tiles, and with ``expand`` their items too (what _expand_kernel writes: one launch in all).
    # Else: the clamped offsets and the sort keys, for torch.sort (blocks of SORT).
    lq_all = _offsets_prologue(CU_Q, CU_Q_OUT, CU_K_OUT, rows_q, broadcast, SORT)
    offs = tl.arange(0, SORT)
    bc = _flag(offs, broadcast)
    cs = _flag(offs, causal)
    carry_q = tl.full([], 0, tl.int64)
    carry_k = tl.full([], 0, tl.int64)
    if IN_REGISTERS:
        ok = offs < B
        key, carry_q, carry_k = _sort_keys(CU_Q, CU_K, CU_Q_OUT, CU_K_OUT, offs, ok, carry_q, carry_k, lq_all,
                                           rows_q, rows_k, cs, bc)
        key = tl.sort(key)
        tl.store(ORDER + offs, (key & 4194303).to(tl.int32), mask=ok)
        tl.debug_barrier()  # the offsets and the order just stored, read back by other threads below
        carry_a, carry_b = _lists_block(CU_Q_OUT, CU_K_OUT, ORDER, offs, ok, broadcast,
                                        NBLK_A, START_A, carry_q * 0, block_a, kv_a, side_a,
                                        NBLK_B, START_B, carry_q * 0, block_b, kv_b, side_b, split, two)
        _store_counts(COUNTS_A, COUNTS_B, carry_a, carry_b, heads_a, heads_b, two, SORT)
        tl.debug_barrier()  # each sequence's tile count and first tile, read back by other threads below
        for e_base in range(0, B * expand, _EXPAND_IN_BUILDER):
            e_pos = e_base + tl.arange(0, _EXPAND_IN_BUILDER)
            e_ok = e_pos < B
            e_seq = tl.load(ORDER + e_pos, mask=e_ok, other=0)
            e_lq, e_lk = _lengths(CU_Q_OUT, CU_K_OUT, e_seq, e_ok, _flag(e_pos, broadcast))
            _expand_one(e_seq, e_pos, e_ok, e_lq, e_lk, NBLK_A, START_A, SEQ_A, BLK_A, ITEMS_A, heads_a, reverse_a,
                        group_a, 32)
            _expand_one(e_seq, e_pos, e_ok & _flag(e_pos, two), e_lq, e_lk, NBLK_B, START_B, SEQ_B, BLK_B, ITEMS_B,
                        heads_b, reverse_b, group_b, 32)
    else:
        for base in range(0, B, SORT):
            idx = base + offs
            ok = idx < B
            key, carry_q, carry_k = _sort_keys(CU_Q, CU_K, CU_Q_OUT, CU_K_OUT, idx, ok, carry_q, carry_k,
                                               lq_all, rows_q, rows_k, cs, bc)
            tl.store(KEYS + idx, key, mask=ok)


# the builders' integer arguments are not specialized on: one variant per block size
@triton.jit(do_not_specialize=['B', 'broadcast', 'from_keys', 'block_a', 'heads_a', 'kv_a', 'side_a', 'block_b', 'heads_b',
                                  'kv_b', 'side_b', 'split', 'two', 'write_columns'])
def _lists_kernel(CU_Q, CU_K, ORDER, KEYS, B, broadcast, from_keys,
                  NBLK_A, START_A, COUNTS_A, block_a, heads_a, kv_a, side_a,
                  NBLK_B, START_B, COUNTS_B, block_b, heads_b, kv_b, side_b, split, two,
                  CU_COLS, write_columns, BLOCK: tl.constexpr):
    # one program: one or two lists' tiles, a running prefix over the order in blocks (from_keys: the order
    # from sorted keys first); with write_columns, each sequence's first statistics column
    offs = tl.arange(0, BLOCK)
    carry_a = tl.full([], 0, tl.int64)
    carry_b = tl.full([], 0, tl.int64)
    for base in range(0, B, BLOCK):
        pos = base + offs
        ok = pos < B
        key = tl.load(KEYS + pos, mask=ok & _flag(pos, from_keys), other=0)
        tl.store(ORDER + pos, (key & 4194303).to(tl.int32), mask=ok & _flag(pos, from_keys))
    tl.debug_barrier()
    for base in range(0, B, BLOCK):
        pos = base + offs
        ok = pos < B
        carry_a, carry_b = _lists_block(CU_Q, CU_K, ORDER, pos, ok, broadcast,
                                        NBLK_A, START_A, carry_a, block_a, kv_a, side_a,
                                        NBLK_B, START_B, carry_b, block_b, kv_b, side_b, split, two)
    _store_counts(COUNTS_A, COUNTS_B, carry_a, carry_b, heads_a, heads_b, two, BLOCK)
    wc = _flag(offs, write_columns)
    carry_c = tl.full([], 0, tl.int64)
    tl.store(CU_COLS + offs, tl.zeros([BLOCK], tl.int32), mask=(offs == 0) & wc)
    for base in range(0, B, BLOCK):  # each sequence's output rows from a multiple of 4 on
        idx = base + offs
        ok = idx < B
        lq, _ = _lengths(CU_Q, CU_K, idx, ok & wc, _flag(idx, broadcast))
        width = tl.where(ok & wc, (lq + 3) // 4 * 4, 0)
        tl.store(CU_COLS + idx + 1, (carry_c + tl.cumsum(width, 0)).to(tl.int32), mask=ok & wc)
        carry_c += tl.sum(width, 0)


# the builders' integer arguments are not specialized on: one variant per block size
@triton.jit(do_not_specialize=['B', 'heads_a', 'reverse_a', 'group_a', 'heads_b', 'reverse_b', 'group_b', 'two',
                                  'broadcast', 'write_columns'])
def _expand_kernel(ORDER, B, NBLK_A, START_A, SEQ_A, BLK_A, ITEMS_A, heads_a, reverse_a, group_a,
                   NBLK_B, START_B, SEQ_B, BLK_B, ITEMS_B, heads_b, reverse_b, group_b, two,
                   CU_Q, CU_K, CU_COLS, COLS, broadcast, write_columns, SEQS: tl.constexpr, TILES: tl.constexpr):
    # program p: the lists' tiles and items of the sequences at sorted positions [p * SEQS, (p + 1) * SEQS),
    # and their rows' statistics columns
    pos = tl.program_id(0) * SEQS + tl.arange(0, SEQS)
    ok = pos < B
    s = tl.load(ORDER + pos, mask=ok, other=0)
    lq, lk = _lengths(CU_Q, CU_K, s, ok, _flag(pos, broadcast))
    _expand_one(s, pos, ok, lq, lk, NBLK_A, START_A, SEQ_A, BLK_A, ITEMS_A, heads_a, reverse_a, group_a, TILES)
    _expand_one(s, pos, ok & _flag(pos, two), lq, lk, NBLK_B, START_B, SEQ_B, BLK_B, ITEMS_B, heads_b, reverse_b,
                group_b, TILES)
    wc = ok & _flag(pos, write_columns)
    start = tl.where(_flag(pos, broadcast), lq * s, tl.load(CU_Q + s, mask=wc, other=0).to(tl.int64))
    col0 = tl.load(CU_COLS + s, mask=wc, other=0)
    lq = tl.where(wc, lq, 0)
    for r0 in range(0, tl.max(lq, 0), TILES):
        r = r0 + tl.arange(0, TILES)[None, :]
        tl.store(COLS + start[:, None] + r, col0[:, None] + r, mask=r < lq[:, None])


# arguments that follow the batch (token totals, sequence counts) are not specialized on: one variant per config
@triton.jit(do_not_specialize=['B', 'n_chunks', 'n_mblk'])
def _chunk_kernel(CU_K, PREFIX, B_LO, B_HI, BLK, SLOT, B, n_chunks, n_mblk,
                  SEQS: tl.constexpr, CHUNKS: tl.constexpr):
    # broadcast-Q dQ chunks: batches cut into n_chunks contiguous, non-empty chunks of about equal work
    # (keys + 16 per batch), the tiles chunk by chunk (about equal work already: no sort)
    offs = tl.arange(0, SEQS)
    tl.store(PREFIX + offs, tl.zeros([SEQS], tl.int64), mask=offs == 0)
    total = tl.full([], 0, tl.int64)
    for base in range(0, B, SEQS):  # PREFIX[b + 1]: work of batches 0..b
        idx = base + offs
        ok = idx < B
        lk = tl.load(CU_K + idx + 1, mask=ok, other=0).to(tl.int64) - tl.load(CU_K + idx, mask=ok, other=0)
        w = tl.where(ok, lk + 16, 0)
        tl.store(PREFIX + idx + 1, total + tl.cumsum(w, 0), mask=ok)
        total += tl.sum(w, 0)
    tl.debug_barrier()
    ks = tl.arange(0, CHUNKS)
    hist = tl.zeros([CHUNKS], tl.int32)
    for base in range(0, B, SEQS):  # chunk of batch b: its share of the work before it
        idx = base + offs
        ok = idx < B
        before = tl.load(PREFIX + idx, mask=ok, other=0)
        chunk = tl.minimum(before * n_chunks // tl.maximum(total, 1), n_chunks - 1)
        hist += tl.histogram(tl.where(ok, chunk, CHUNKS - 1).to(tl.int32), CHUNKS)
    # cut[k]: first batch of chunk k; made strictly increasing (no empty chunk) within [k, B - n + k]
    incl = tl.cumsum(tl.where(ks < n_chunks, hist, 0), 0)
    cut = incl - hist
    lo_run = tl.associative_scan(cut - ks, 0, _max)
    b_lo = tl.minimum(lo_run + ks, B - n_chunks + ks)
    b_hi = tl.minimum(tl.maximum(lo_run, incl - ks - 1) + ks + 1, B - n_chunks + ks + 1)
    b_hi = tl.where(ks == n_chunks - 1, B, b_hi)
    real = ks < n_chunks
    for m in range(0, n_mblk):
        t = ks * n_mblk + m
        tl.store(B_LO + t, b_lo.to(tl.int32), mask=real)
        tl.store(B_HI + t, b_hi.to(tl.int32), mask=real)
        tl.store(BLK + t, tl.zeros([CHUNKS], tl.int32) + m, mask=real)
        tl.store(SLOT + t, ks, mask=real)


def offsets_dtype(rows: int):
    """The dtype the kernels read offsets in: int32 where every offset fits."""
    return torch.int32 if rows < 2 ** 31 - 1 else torch.int64


class _Arrays(NamedTuple):
    counts: torch.Tensor
    seq: torch.Tensor
    blk: torch.Tensor
    items: torch.Tensor
    nblk: torch.Tensor
    start: torch.Tensor
    n_items: int


def _arrays(spec: ListSpec, n_seqs, rows_q, rows_k, broadcast, device) -> _Arrays:
    # one allocation, every array 16-byte aligned (Triton specializes kernels on pointer alignment):
    # counts (items, tiles, 2 unused) | seq | blk | items | tiles per sorted sequence | first tiles
    if broadcast and not spec.kv:
        bound = n_seqs * _cdiv(rows_q, spec.block)
    else:
        bound = _cdiv(rows_k if spec.kv else rows_q, spec.block) + n_seqs
    t4, b4 = _cdiv(max(bound, 1), 4) * 4, _cdiv(max(n_seqs, 1), 4) * 4
    buf = torch.empty(4 + (2 + spec.heads) * t4 + 2 * b4, device=device, dtype=torch.int32)
    tail = 4 + (2 + spec.heads) * t4
    return _Arrays(buf[:4], buf[4:4 + t4], buf[4 + t4:4 + 2 * t4], buf[4 + 2 * t4:tail],
                   buf[tail:tail + b4], buf[tail + b4:tail + 2 * b4], t4 * spec.heads)


def _list_args(a: _Arrays, spec: ListSpec):
    return (a.nblk, a.start, a.counts, spec.block, spec.heads, int(spec.kv), spec.side)


def order_and_lists(cu_q, cu_k, rows_q, rows_k, specs: Sequence[ListSpec], *, causal, broadcast,
                    order: Optional[Order] = None, columns: Optional[Columns] = None,
                    register_sort: Optional[bool] = None, fused_items_seqs: int = 0):
    """The call's Order (built here from the caller's offsets, or the one given) and the TileLists of one or
    two ``specs`` (module docstring).  ``rows_q``: query rows (broadcast-Q: Lq).  ``columns``: a Columns to
    fill (columns_for).  ``register_sort``: sort in the builder's registers (the default on a GPU, up to
    4,096 sequences) or by torch.sort (the default on the CPU, where the interpreter's sort is slow).
    ``fused_items_seqs``: up to this many sequences a register sort's builder writes the items too (one
    launch; a plain call passes ``Config.builder_items_seqs``); 0: never.  Returns (order, [TileList, ...])."""
    assert 1 <= len(specs) <= 2 and all(sp.split == specs[0].split for sp in specs)
    # The builder reads the caller's offsets with unit stride: a strided view (every other element of a
    # longer tensor, say) is copied first, on the device and without a wait.
    cu_q, cu_k = cu_q.contiguous(), cu_k.contiguous()
    device = cu_k.device
    n_seqs = cu_k.shape[0] - 1
    if n_seqs > MAX_SEQS:
        raise ValueError(f"at most {MAX_SEQS} sequences, got {n_seqs}")
    arrays = [_arrays(sp, n_seqs, rows_q, rows_k, broadcast, device) for sp in specs]
    two = len(specs) == 2
    a, b = arrays[0], arrays[-1]
    list_args = _list_args(a, specs[0]) + _list_args(b, specs[-1]) + (specs[0].split, int(two))
    flags = (int(bool(causal)), int(bool(broadcast)))
    reverse = [int(bool(causal) and not sp.kv) for sp in specs]
    group = [sp.group_rows if causal else 0 for sp in specs]
    lists_done = expanded = False
    keys = None
    if order is None:
        dtype = offsets_dtype(max(rows_q, rows_k))
        order = Order(torch.empty(max(n_seqs, 1), device=device, dtype=torch.int32)[:n_seqs],
                      torch.empty(cu_q.shape, device=device, dtype=dtype),
                      torch.empty(cu_k.shape, device=device, dtype=dtype), rows_q, rows_k)
        if register_sort is None:
            register_sort = device.type == "cuda"
        in_registers = register_sort and n_seqs <= _REGISTER_SORTS[-1]
        sort = next((n for n in _REGISTER_SORTS if n_seqs <= n), 1024)
        keys = None if in_registers else torch.empty(n_seqs, device=device, dtype=torch.int64)
        expand = in_registers and columns is None and n_seqs <= fused_items_seqs
        _order_kernel[(1,)](cu_q, cu_k, order.cu_q, order.cu_k, order.order, keys if keys is not None else order.cu_k,
                            n_seqs, rows_q, rows_k, *flags, *list_args,
                            a.seq, a.blk, a.items, reverse[0], group[0], b.seq, b.blk, b.items, reverse[-1], group[-1],
                            int(expand),
                            SORT=sort, IN_REGISTERS=in_registers, num_warps=4 if sort <= 1024 else 8)
        expanded = expand
        if in_registers:
            lists_done = True
        else:  # past 4,096 keys a register sort compiles for minutes; the interpreter's is a Python loop
            keys = torch.sort(keys).values
    if not lists_done or columns is not None:
        _lists_kernel[(1,)](order.cu_q, order.cu_k, order.order, keys if keys is not None else _no_keys(device), n_seqs,
                            flags[1], int(keys is not None), *list_args,
                            columns.cu if columns is not None else a.counts, int(columns is not None),
                            BLOCK=1024, num_warps=4)
    if n_seqs > 0 and not expanded:
        _expand_kernel[(_cdiv(n_seqs, _EXPAND_SEQS),)](
            order.order, n_seqs, a.nblk, a.start, a.seq, a.blk, a.items, specs[0].heads, reverse[0], group[0],
            b.nblk, b.start, b.seq, b.blk, b.items, specs[-1].heads, reverse[-1], group[-1], int(two),
            order.cu_q, order.cu_k, columns.cu if columns is not None else a.counts,
            columns.cols if columns is not None else a.counts, flags[1], int(columns is not None),
            SEQS=_EXPAND_SEQS, TILES=64, num_warps=4)
    return order, [TileList(x.seq, x.blk, x.items, x.counts, sp.heads, x.n_items) for x, sp in zip(arrays, specs)]


@functools.lru_cache(maxsize=None)
def _no_keys(device) -> torch.Tensor:
    # the lists builder's KEYS when there are none (never read): int64 like real keys, so that both launches
    # share one compiled variant
    return torch.zeros(1, device=device, dtype=torch.int64)


def columns_for(n_seqs, n_out_rows, device) -> Columns:
    """Room for the statistics columns of ``n_out_rows`` output rows in ``n_seqs`` sequences
    (order_and_lists fills it)."""
    n_cols = max(4, _cdiv(n_out_rows + 3 * n_seqs, 4) * 4)
    b4 = _cdiv(n_seqs + 1, 4) * 4  # (both arrays 16-byte aligned)
    buf = torch.empty(b4 + n_out_rows, device=device, dtype=torch.int32)
    return Columns(buf[:n_seqs + 1], buf[b4:], n_cols)


def broadcast_chunks(cu_k, n_seqs, n_chunks, n_mblk) -> Chunks:
    """Broadcast-Q's tl dQ tiles (``cu_k``: clamped offsets; ``n_chunks`` <= min(B, MAX_CHUNKS))."""
    n_chunks = max(1, min(n_chunks, n_seqs, MAX_CHUNKS))
    n_tiles = n_chunks * n_mblk
    i32 = dict(device=cu_k.device, dtype=torch.int32)
    t4 = _cdiv(max(n_tiles, 1), 4) * 4
    tiles = torch.empty(4 * t4, **i32)
    b_lo, b_hi, blk, slot = (tiles[i * t4:(i + 1) * t4] for i in range(4))
    if n_seqs > 0 and n_tiles > 0:
        prefix = torch.empty(n_seqs + 1, device=cu_k.device, dtype=torch.int64)
        _chunk_kernel[(1,)](cu_k, prefix, b_lo, b_hi, blk, slot, n_seqs, n_chunks, n_mblk,
                            SEQS=1024, CHUNKS=1024, num_warps=8)
    return Chunks(b_lo, b_hi, blk, slot, n_tiles if n_seqs > 0 else 0, n_chunks)


# ---------------------------------------------------------------------------------------------------------
# static deals (numpy), measured against the dynamic one in the log; kept with their test
# ---------------------------------------------------------------------------------------------------------
def zigzag_assign(workloads, n_sms: int):
    """Sort tiles by workload (descending) and deal them to ``n_sms`` bins in boustrophedon order.
    Returns ``(assign, loads)``: the bin of every tile (in the original tile order) and the total load of
    every bin."""
    w = np.asarray(workloads, dtype=np.int64)
    n = w.shape[0]
    order = np.argsort(-w, kind="stable")
    pos = np.arange(n)
    rnd, col = pos // n_sms, pos % n_sms
    sm = np.where(rnd % 2 == 0, col, n_sms - 1 - col)
    assign = np.empty(n, dtype=np.int32)
    assign[order] = sm
    loads = np.bincount(assign, weights=w, minlength=n_sms).astype(np.int64)
    return assign, loads


def round_robin_assign(workloads, n_sms: int):
    """Tile ``t`` goes to bin ``t % n_sms`` (the tiles' given order)."""
    w = np.asarray(workloads, dtype=np.int64)
    assign = (np.arange(w.shape[0]) % n_sms).astype(np.int32)
    loads = np.bincount(assign, weights=w, minlength=n_sms).astype(np.int64)
    return assign, loads


def claim_assign(workloads, n_sms: int):
    """The dynamic deal modelled: tiles in their given (launch) order, each to the bin that frees first (a
    Gluon kernel's programs claiming items from a counter).  Returns ``(assign, loads)`` like the others."""
    w = np.asarray(workloads, dtype=np.float64)
    free = [(0.0, b) for b in range(n_sms)]
    assign = np.empty(w.shape[0], dtype=np.int32)
    for i, x in enumerate(w):
        t, b = heapq.heappop(free)
        assign[i] = b
        heapq.heappush(free, (t + x, b))
    return assign, np.bincount(assign, weights=w, minlength=n_sms)


def imbalance(loads) -> float:
    """max / mean of the per-bin loads (1.0 = perfectly balanced)."""
    loads = np.asarray(loads, dtype=np.float64)
    m = loads.mean() if loads.size else 0.0
    return float(loads.max() / m) if m > 0 else 1.0
