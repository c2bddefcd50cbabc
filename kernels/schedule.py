"""Host-side tile scheduling for jagged flash attention (numpy; plan.py uploads what it builds).

A *tile* is one (sequence, block) pair: a block of BLOCK_M query rows of one sequence (forward, dQ) or a
block of BLOCK_N key rows (dK/dV).  Only real tiles exist in these lists: a block index beyond its
sequence's length is never generated.

The kernels run one program per (tile, head) item, in the launch order ``sequence_major_items`` gives:
sequences heaviest first, then head, then the sequence's tiles heaviest first, so the programs in flight
read the same few (sequence, head) pairs' K/V (or Q/dO) and L2 serves the repeats; the hardware block
scheduler balances the items dynamically as SMs free up.  Broadcast-Q's dQ splits the batch into chunks of
about equal work (``split_batches_by_work``).

``zigzag_assign`` / ``round_robin_assign`` deal tiles to a fixed number of bins, and ``imbalance`` (max /
mean load) measures such a deal: a static alternative to the hardware's dynamic balance, kept with the
seed document's numbers as a test.
"""
from __future__ import annotations

import numpy as np

def zigzag_assign(workloads, n_sms: int):
    """Sort tiles by workload (descending) and deal them to ``n_sms`` bins in
    boustrophedon order.  Returns ``(assign, loads)``: the bin of every tile
    (in the original tile order) and the total load of every bin."""
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


def imbalance(loads) -> float:
    """max / mean of the per-bin loads (1.0 = perfectly balanced)."""
    loads = np.asarray(loads, dtype=np.float64)
    m = loads.mean() if loads.size else 0.0
    return float(loads.max() / m) if m > 0 else 1.0


def _causal_visible(lq, lk, blk_start, blk_len, causal):
    """Number of visible keys summed... approximated per row block: the KV
    extent (keys processed) of a q block [blk_start, blk_start+blk_len)."""
    if not causal:
        return np.broadcast_to(lk, blk_start.shape).astype(np.int64)
    hi = np.minimum(lk, blk_start + blk_len + (lk - lq))
    return np.maximum(hi, 0).astype(np.int64)


def forward_tiles(lens_q, lens_k, block_m: int, causal: bool):
    """Real (sequence, q-block) tiles.

    Returns ``(seq, blk, work)`` int64 arrays.  ``work`` is the number of keys
    the tile iterates over (its KV extent) plus a small constant so that tiles
    with no keys (which still write zeros / -inf) have a cost.
    """
    lq = np.asarray(lens_q, dtype=np.int64)
    lk = np.asarray(lens_k, dtype=np.int64)
    nblk = (lq + block_m - 1) // block_m
    seq = np.repeat(np.arange(lq.shape[0], dtype=np.int64), nblk)
    first = np.cumsum(nblk) - nblk
    blk = np.arange(seq.shape[0], dtype=np.int64) - np.repeat(first, nblk)
    rows = np.minimum(block_m, lq[seq] - blk * block_m)
    extent = _causal_visible(lq[seq], lk[seq], blk * block_m, rows, causal)
    work = extent * np.maximum(rows, 1) // block_m + 16
    return seq, blk, work


def kv_tiles(lens_q, lens_k, block_n: int, causal: bool):
    """Real (sequence, k-block) tiles for the dK/dV pass.  ``work`` = number of
    query rows that see the block (q extent).  Blocks of sequences with no
    query rows are pruned (the caller zero-fills dK/dV for them)."""
    lq = np.asarray(lens_q, dtype=np.int64)
    lk = np.asarray(lens_k, dtype=np.int64)
    nblk = np.where(lq > 0, (lk + block_n - 1) // block_n, 0)
    seq = np.repeat(np.arange(lq.shape[0], dtype=np.int64), nblk)
    first = np.cumsum(nblk) - nblk
    blk = np.arange(seq.shape[0], dtype=np.int64) - np.repeat(first, nblk)
    if causal:
        lo = np.maximum(blk * block_n - (lk[seq] - lq[seq]), 0)
        work = np.maximum(lq[seq] - lo, 0) + 16
    else:
        work = lq[seq] + 16
    return seq, blk, work


def sort_by_work(*arrays, work):
    """Reorder tile arrays by descending work (stable)."""
    order = np.argsort(-np.asarray(work), kind="stable")
    return tuple(np.asarray(a)[order] for a in arrays) + (np.asarray(work)[order],)


def split_batches_by_work(work_per_batch, n_chunks: int):
    """Split batches 0..B-1 into at most ``n_chunks`` contiguous chunks of
    roughly equal total work.  Returns chunk boundaries ``[0, ..., B]``."""
    w = np.asarray(work_per_batch, dtype=np.float64)
    B = w.shape[0]
    if B == 0:
        return np.zeros(1, dtype=np.int64)
    n_chunks = max(1, min(n_chunks, B))
    c = np.cumsum(w)
    total = c[-1]
    if total <= 0:
        return np.linspace(0, B, n_chunks + 1).astype(np.int64)
    targets = total * np.arange(1, n_chunks) / n_chunks
    cuts = np.searchsorted(c, targets, side="left") + 1
    bounds = np.unique(np.concatenate([[0], np.clip(cuts, 1, B - 1) if B > 1 else [], [B]]).astype(np.int64))
    return bounds


def sequence_major_items(seq, work, n_heads: int):
    """Launch order of the items ``tile * n_heads + head`` of a sorted grid, grouped so that programs
    running side by side read the same sequence's K/V (forward, dQ) or Q/dO (dK/dV): sequences by total
    work (heaviest first), then head, then the sequence's tiles by work (heaviest first).

    Heads sharing a kv head (GQA: ``head // group``) are adjacent, so their groups reuse the same K/V.
    ``seq`` / ``work``: the tile arrays (any order).  Returns an int64 array, a permutation of
    ``range(len(seq) * n_heads)``."""
    seq = np.asarray(seq, dtype=np.int64)
    work = np.asarray(work, dtype=np.int64)
    n = seq.shape[0]
    if n == 0 or n_heads == 0:
        return np.zeros(0, dtype=np.int64)
    seq_work = np.bincount(seq, weights=work)[seq]
    tile = np.repeat(np.arange(n, dtype=np.int64), n_heads)
    head = np.tile(np.arange(n_heads, dtype=np.int64), n)
    # np.lexsort: the last key is the primary one; the sequence id keeps equal-work sequences apart
    order = np.lexsort((-work[tile], head, seq[tile], -seq_work[tile]))
    return (tile * n_heads + head)[order]
