"""Host-side tile scheduling for jagged flash attention.

A *tile* is one (sequence, block) pair: a block of BLOCK_M query rows of one
sequence (forward, dQ) or a block of BLOCK_N key rows (dK/dV).  Padded tiles
(block index beyond the sequence's own length) never exist in these lists:
only real tiles are generated ("empty tiles pruned").

Two static policies are provided, as in the seed document:

* forward: tiles sorted by KV workload (descending) and dealt to ``n_sms``
  persistent programs in zigzag (boustrophedon) order;
* backward: block-innermost round-robin (tiles of one sequence adjacent, so a
  sequence's K/V or Q stays hot in L2 while consecutive programs read it).

The launch order of the sorted grids' (tile, head) items is a third choice
(``sequence_major_items``): heaviest tile first across the whole batch puts
the same q block of every (sequence, head) pair side by side, so the programs
in flight each stream a different pair's K/V and nothing is reused from L2;
grouping the items by (sequence, head) makes the programs in flight share a
few pairs' K/V.

``imbalance(loads) = max / mean`` measures the result.

The GPU launcher (``kernels/jfa.py``) launches a plain grid by default, in
sequence-major order (heavy sequences first, each one's tiles heaviest first;
the hardware block scheduler balances dynamically).  The persistent
lists built here drive its ``FWD_GRID`` / ``BWD_KV_GRID = "persistent"``
switches; on the H200 they were slower on every benchmark shape
(``kernels/PERF.md``, v5).
"""
from __future__ import annotations

import heapq

import numpy as np

__all__ = [
    "zigzag_assign",
    "round_robin_assign",
    "imbalance",
    "forward_tiles",
    "kv_tiles",
    "sort_by_work",
    "persistent_zigzag",
    "block_innermost_round_robin",
    "split_batches_by_work",
    "sequence_major_items",
    "sectioned_items",
    "distinct_sequences_in_flight",
    "list_schedule_makespan",
]


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


def persistent_zigzag(work, n_programs: int):
    """Persistent-grid schedule: CSR lists ``(ptr, tile_ids)`` where program
    ``p`` processes ``tile_ids[ptr[p]:ptr[p+1]]`` (heaviest first)."""
    w = np.asarray(work, dtype=np.int64)
    assign, loads = zigzag_assign(w, n_programs)
    order = np.lexsort((-w, assign))  # by program, then heaviest first
    counts = np.bincount(assign, minlength=n_programs)
    ptr = np.zeros(n_programs + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(counts)
    return ptr, order.astype(np.int64), loads


def block_innermost_round_robin(seq, blk, work, n_programs: int):
    """Backward policy: tiles ordered (sequence, block) with the block index
    innermost, dealt round-robin.  Returns ``(order, assign, loads)``."""
    order = np.lexsort((np.asarray(blk), np.asarray(seq)))
    w = np.asarray(work, dtype=np.int64)[order]
    assign, loads = round_robin_assign(w, n_programs)
    return order, assign, loads


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


def sectioned_items(seq, work, n_heads: int, rows_per_seq, section_rows: int):
    """Launch order that keeps ``sequence_major_items``' L2 reuse without its tail: the (sequence,
    head) pairs, in sequence-major order, are cut into *sections* of consecutive pairs whose rows read
    (``rows_per_seq[s]`` per pair: keys for the forward and dQ, queries for dK/dV) add up to at most
    ``section_rows`` (at least one pair each); sections run one after another and, inside a section,
    items go heaviest tile first across its pairs.  Sequence-major order starts the last pair's
    heaviest tile late (a long tail on a few long causal sequences); here only the last section's
    tiles are left at the end, and they are already sorted heaviest first.

    Returns an int64 permutation of ``range(len(seq) * n_heads)`` (items ``tile * n_heads + head``)."""
    seq = np.asarray(seq, dtype=np.int64)
    work = np.asarray(work, dtype=np.int64)
    rows = np.asarray(rows_per_seq, dtype=np.int64)
    if section_rows < 1:
        raise ValueError(f"section_rows must be >= 1, got {section_rows}")
    n = seq.shape[0]
    if n == 0 or n_heads == 0:
        return np.zeros(0, dtype=np.int64)
    seq_work = np.bincount(seq, weights=work, minlength=rows.shape[0])
    # pairs in sequence-major order: sequences heaviest first (ties by id), heads inside
    seq_rank = np.empty(seq_work.shape[0], dtype=np.int64)
    seq_rank[np.lexsort((np.arange(seq_work.shape[0]), -seq_work))] = np.arange(seq_work.shape[0])
    pair_rows = np.repeat(rows[np.argsort(seq_rank)], n_heads)
    section_of_pair = np.empty(pair_rows.shape[0], dtype=np.int64)
    section, filled = 0, 0
    for i, r in enumerate(pair_rows.tolist()):  # greedy cut in Python: 160k pairs ~0.03 s, and cached
        if filled > 0 and filled + r > section_rows:
            section, filled = section + 1, 0
        section_of_pair[i] = section
        filled += r
    tile = np.repeat(np.arange(n, dtype=np.int64), n_heads)
    head = np.tile(np.arange(n_heads, dtype=np.int64), n)
    pair = seq_rank[seq[tile]] * n_heads + head
    order = np.lexsort((pair, -work[tile], section_of_pair[pair]))
    return (tile * n_heads + head)[order]


def distinct_sequences_in_flight(items, seq, n_heads: int, window: int):
    """Mean number of distinct (sequence, head) pairs among each ``window`` consecutive items: the
    working set a grid of ``window`` resident programs reads, in pairs (lower = more L2 reuse)."""
    items = np.asarray(items, dtype=np.int64)
    seq = np.asarray(seq, dtype=np.int64)
    pair = seq[items // n_heads] * n_heads + items % n_heads
    counts = [np.unique(pair[i:i + window]).shape[0] for i in range(0, max(1, pair.shape[0]), window)]
    return float(np.mean(counts))


def list_schedule_makespan(work_in_launch_order, n_slots: int) -> float:
    """Finish time of greedy list scheduling: each item, in launch order, starts on the slot that frees
    first (what a hardware block scheduler does with a one-program-per-item grid, ``n_slots`` resident
    programs, durations proportional to ``work``).  Divide by ``max(sum / n_slots, max)`` for the
    tail cost of an order."""
    w = np.asarray(work_in_launch_order, dtype=np.float64)
    if w.size == 0:
        return 0.0
    if n_slots < 1:
        raise ValueError(f"n_slots must be >= 1, got {n_slots}")
    free = [0.0] * min(n_slots, w.size)
    for x in w:
        heapq.heappush(free, heapq.heappop(free) + x)
    return max(free)
