"""Tests for the tile schedule built on the device (kernels/schedule.py).

Each builder's output is compared, entry by entry, with a numpy statement of the launch order written
here; the builders run under the Triton interpreter on machines without CUDA (TRITON_INTERPRET=1, set by
the root conftest.py before triton is imported), on the GPU elsewhere.
"""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from kernels import Config, JaggedPlan, jagged_flash_attention
from kernels import launch
from kernels import plan as kplan
from kernels import schedule as sched
from kernels import tl

_HAS_CUDA = torch.cuda.is_available()  # (without one, the root conftest.py set TRITON_INTERPRET=1)
DEVICE = "cuda" if _HAS_CUDA else "cpu"
pytestmark = pytest.mark.skipif(not (_HAS_CUDA or tl.INTERPRET), reason="needs CUDA or TRITON_INTERPRET=1")


def _cu(lens, dtype=torch.int32):
    return torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=dtype, device=DEVICE)


def expected_order(lens_q, lens_k, causal):
    """The sequences heaviest first, as the module docstring states it (numpy, from the lengths)."""
    lq = np.asarray(lens_q, dtype=np.int64)
    lk = np.asarray(lens_k, dtype=np.int64)
    if causal:
        pairs = np.where(lk >= lq, lq * (lk - lq) + lq * (lq + 1) // 2, lk * (lk + 1) // 2)
    else:
        pairs = lq * lk
    idx = np.arange(lk.shape[0])
    return idx[np.lexsort((idx, -pairs))].tolist()


def expected_list(lens_q, lens_k, spec: sched.ListSpec, causal):
    """(seq, blk, items) of one list in the stated launch order."""
    lq = np.asarray(lens_q, dtype=np.int64)
    lk = np.asarray(lens_k, dtype=np.int64)
    nblk = -(-(lk if spec.kv else lq) // spec.block)
    if not spec.kv and spec.side == sched.KEYS_AT_LEAST:
        nblk = np.where(lk >= spec.split, nblk, 0)
    if not spec.kv and spec.side == sched.KEYS_BELOW:
        nblk = np.where(lk < spec.split, nblk, 0)
    seq, blk, items = [], [], []
    for s in expected_order(lens_q, lens_k, causal):
        t0 = len(seq)
        n = int(nblk[s])
        seq += [s] * n
        blk += list(range(n - 1, -1, -1)) if causal and not spec.kv else list(range(n))
        # heads in groups that keep group_rows streamed rows (causal masking only), tile by tile in a group
        streamed = int(lq[s] if spec.kv else lk[s])
        size = min(max(spec.group_rows // max(streamed, 1), 1), spec.heads) if causal and spec.group_rows else 1
        for h0 in range(0, spec.heads, size):
            group = range(h0, min(h0 + size, spec.heads))
            items += [(t0 + j) * spec.heads + h for j in range(n) for h in group]
    return seq, blk, items


def _built(t: sched.TileList):
    n_items, n_tiles = int(t.counts[0]), int(t.counts[1])
    assert n_items == n_tiles * t.heads and n_items <= t.n_items  # the count within the host's bound
    return t.seq[:n_tiles].tolist(), t.blk[:n_tiles].tolist(), t.items[:n_items].tolist()


def build(lens_q, lens_k, specs, *, causal=False, broadcast=False, dtype=torch.int32, **kwargs):
    cu_q = torch.tensor([0, lens_q[0] if lens_q else 0], dtype=dtype, device=DEVICE) if broadcast else \
        _cu(lens_q, dtype)
    rows_q = (lens_q[0] if lens_q else 0) if broadcast else sum(lens_q)
    return sched.order_and_lists(cu_q, _cu(lens_k, dtype), rows_q, sum(lens_k), specs, causal=causal,
                                 broadcast=broadcast, **kwargs)


lengths = st.lists(st.integers(0, 300), min_size=0, max_size=40)
SPECS = st.builds(sched.ListSpec, block=st.sampled_from([16, 64, 128]), heads=st.integers(1, 5), kv=st.booleans(),
                  side=st.sampled_from([sched.ALL, sched.KEYS_AT_LEAST, sched.KEYS_BELOW]), split=st.just(100),
                  group_rows=st.sampled_from([0, 1, 250, 600, 10 ** 6]))


@settings(max_examples=25, deadline=None)
@given(data=st.data(), lens_k=lengths, specs=st.lists(SPECS, min_size=1, max_size=2), causal=st.booleans(),
       broadcast=st.booleans(), offsets_dtype=st.sampled_from([torch.int32, torch.int64]),
       register_sort=st.booleans())
def test_tile_lists_follow_the_stated_launch_order(data, lens_k, specs, causal, broadcast, offsets_dtype,
                                                   register_sort):
    n = len(lens_k)
    if broadcast:
        lens_q = [data.draw(st.integers(0, 300), label="Lq")] * n
    else:
        lens_q = data.draw(st.lists(st.integers(0, 300), min_size=n, max_size=n), label="lens_q")
    order, lists = build(lens_q, lens_k, specs, causal=causal, broadcast=broadcast, dtype=offsets_dtype,
                         register_sort=register_sort)
    assert order.order.tolist() == expected_order(lens_q, lens_k, causal)
    for spec, t in zip(specs, lists):
        assert _built(t) == expected_list(lens_q, lens_k, spec, causal)
    # the backward's lists, from this order, are the lists a fresh order gives
    _, again = build(lens_q, lens_k, specs[::-1], causal=causal, broadcast=broadcast, order=order)
    assert [_built(t) for t in again] == [_built(t) for t in lists[::-1]]


def test_sequences_go_heaviest_first_and_each_sequence_and_head_is_one_run():
    lens = [300, 0, 513, 129, 513, 1]
    _, (t,) = build(lens, lens, [sched.ListSpec(128, 3)], causal=True)
    seq, blk, items = _built(t)
    pair = [seq[i // 3] * 3 + i % 3 for i in items]
    runs = [pair[0]] + [b for a, b in zip(pair[:-1], pair[1:]) if a != b]
    assert len(runs) == len(set(runs)) == 5 * 3  # (sequence 1 has no queries, so no tiles)
    # the two 513-long sequences (equal work: the lower index first), then 300, 129, 1
    assert [r // 3 for r in runs[::3]] == [2, 4, 0, 3, 5]
    # causal: a sequence's last query block (the one that sees the most keys) first
    assert [blk[i] for i in range(len(seq)) if seq[i] == 2] == [4, 3, 2, 1, 0]


def test_causal_heads_go_in_groups_tile_by_tile_so_a_sequence_ends_on_its_light_tiles():
    # two 1,024-row sequences, 5 heads, 128-row tiles; 2,048 streamed rows per group: two heads a group
    lens = [1024, 1024]
    for kv in (False, True):
        _, (t,) = build(lens, lens, [sched.ListSpec(128, 5, kv=kv, group_rows=2048)], causal=True)
        seq, blk, items = _built(t)
        tile_head = [(blk[i // 5], i % 5) for i in items[:40]]  # the first sequence's 8 tiles x 5 heads
        heaviest = 7 if not kv else 0  # the last query block sees the most keys; key block 0 the most queries
        step = -1 if not kv else 1
        blocks = [heaviest + step * j for j in range(8)]
        assert tile_head == ([(b, h) for b in blocks for h in (0, 1)] + [(b, h) for b in blocks for h in (2, 3)]
                             + [(b, 4) for b in blocks])
    # without causal masking the same spec goes head by head
    _, (t,) = build(lens, lens, [sched.ListSpec(128, 5, group_rows=2048)], causal=False)
    _, blk, items = _built(t)
    assert [(blk[i // 5], i % 5) for i in items[:9]] == [(j, 0) for j in range(8)] + [(0, 1)]


def _causal_work(lens, t: sched.TileList, block, kv):
    """Each item's work in launch order (128-key or 128-query blocks it meets, plus one for the tile's own
    cost), for sequences with as many queries as keys under causal masking."""
    seq, blk, items = _built(t)
    work = []
    for i in items:
        b, n = blk[i // t.heads], -(-lens[seq[i // t.heads]] // block)
        work.append((n - b if kv else b + 1) + 1)
    return work


@pytest.mark.parametrize("kv", [False, True], ids=["query tiles", "key tiles"])
def test_causal_head_groups_end_a_dense_causal_launch_balanced(kv):
    # 8 x 4,096 causal, 16 heads, 128-row tiles on 132 programs claiming items in launch order (the
    # forward's S4b): head by head the launch's last items are the last heads' heaviest and lightest tiles
    # in turn, and the busiest program works 3% longer than the mean; tile by tile across the 16 heads the
    # launch ends on the lightest tiles
    lens = [4096] * 8
    spread = {}
    for rows in (0, 2 ** 16):
        _, (t,) = build(lens, lens, [sched.ListSpec(128, 16, kv=kv, group_rows=rows)], causal=True)
        _, loads = sched.claim_assign(_causal_work(lens, t, 128, kv), 132)
        spread[rows] = sched.imbalance(loads)
    assert spread[0] > 1.03 and spread[2 ** 16] < 1.01, spread  # measured: 1.033 and 1.005


@pytest.mark.parametrize("n_seqs, register_sort", [(300, True), (300, False), (600, True), (4097, True)])
def test_every_batch_size_takes_the_same_order(n_seqs, register_sort):
    # up to 4,096 sequences can be sorted in registers (and up to 512 have their items written by the same
    # program); more by torch.sort
    rng = np.random.default_rng(n_seqs)
    lens_q, lens_k = rng.integers(0, 4, size=n_seqs).tolist(), rng.integers(0, 4, size=n_seqs).tolist()
    spec = sched.ListSpec(16, 1)
    order, (t,) = build(lens_q, lens_k, [spec], causal=True, register_sort=register_sort)
    assert order.order.tolist() == expected_order(lens_q, lens_k, True)
    assert _built(t) == expected_list(lens_q, lens_k, spec, True)


class _CountLaunches:
    """A builder kernel whose launches are counted (``kernel[grid](...)``)."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


_FUSED = Config().builder_items_seqs  # the default threshold


@pytest.mark.parametrize("n_seqs, fused, launches", [(1, _FUSED, 1), (_FUSED, _FUSED, 1), (_FUSED + 1, _FUSED, 2),
                                                     (5, 0, 2)])
def test_a_forward_of_up_to_512_sequences_builds_its_lists_in_one_launch(monkeypatch, n_seqs, fused, launches):
    counted = {name: _CountLaunches(getattr(sched, name)) for name in ("_order_kernel", "_lists_kernel",
                                                                       "_expand_kernel")}
    for name, c in counted.items():
        monkeypatch.setattr(sched, name, c)
    lens = [1 + i % 3 for i in range(n_seqs)]
    specs = [sched.ListSpec(16, 2, side=sched.KEYS_AT_LEAST, split=2), sched.ListSpec(16, 2, side=sched.KEYS_BELOW,
                                                                                       split=2)]
    order, lists = build(lens, lens, specs, causal=True, register_sort=True, fused_items_seqs=fused)
    assert sum(c.launches for c in counted.values()) == launches
    for spec, t in zip(specs, lists):
        assert _built(t) == expected_list(lens, lens, spec, True)


def test_key_lists_keep_sequences_without_queries():
    # their dK / dV are zeros, and with no tile of their own no kernel would write them
    _, (t,) = build([0, 5, 0], [7, 0, 130], [sched.ListSpec(64, 2, kv=True)], causal=True)
    seq, blk, _ = _built(t)
    assert sorted(zip(seq, blk)) == [(0, 0), (2, 0), (2, 1), (2, 2)]


def test_nothing_to_schedule():
    _, (t,) = build([], [], [sched.ListSpec(64, 4)])
    assert _built(t) == ([], [], [])
    _, (t,) = build([0, 0], [3, 0], [sched.ListSpec(64, 4)], causal=True)
    assert _built(t) == ([], [], [])


def test_the_bound_holds_for_every_layout():
    # at most cdiv(rows, block) + B tiles: one partial block per sequence at worst
    for lens in ([1] * 50, [63, 65, 1, 0, 127], [64] * 7, [1000]):
        _, lists = build(lens, lens, [sched.ListSpec(64, 3), sched.ListSpec(64, 2, kv=True)])
        assert all(int(t.counts[0]) <= t.n_items for t in lists)


@pytest.mark.parametrize("raw, rows, want", [
    ([0, 5, 3, 9], 9, [0, 5, 5, 9]),  # decreasing: an empty sequence, the next one from its own start
    ([2, 5, 9], 9, [0, 5, 9]),  # not starting at 0: read as 0
    ([0, 5, 50], 9, [0, 5, 9]),  # past the rows
    ([0, -4, 3], 9, [0, 0, 3]),  # negative
    ([0, 4, 6], 9, [0, 4, 6]),  # not ending at the rows: kept (its rows past 6 are never read)
])
def test_the_kernels_read_clamped_offsets(raw, rows, want):
    cu = torch.tensor(raw, dtype=torch.int64, device=DEVICE)
    order, _ = sched.order_and_lists(cu, cu, rows, rows, [sched.ListSpec(16, 1)], causal=False, broadcast=False)
    assert order.cu_q.tolist() == want and order.cu_k.tolist() == want and order.cu_q.dtype == torch.int32


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_strided_offsets_are_read_by_value(dtype):
    # every other element of a longer tensor whose fillers are other well-formed offsets: a reader that
    # ignores the stride builds other, plausible lists
    lens_q, lens_k = [5, 0, 17, 3], [9, 4, 17, 0]
    spec = [sched.ListSpec(16, 2)]

    def strided(lens):
        cu = _cu(lens, dtype)
        buffer = torch.zeros(2 * cu.numel(), dtype=dtype, device=DEVICE)
        buffer[0::2], buffer[1::2] = cu, cu.flip(0)
        return buffer[0::2]

    order, (t,) = sched.order_and_lists(strided(lens_q), strided(lens_k), sum(lens_q), sum(lens_k), spec,
                                        causal=True, broadcast=False)
    want_order, (want,) = build(lens_q, lens_k, spec, causal=True, dtype=dtype)
    assert order.cu_q.tolist() == want_order.cu_q.tolist() and order.cu_k.tolist() == want_order.cu_k.tolist()
    assert _built(t) == _built(want)


def test_a_call_with_malformed_offsets_computes_what_their_clamped_form_gives():
    # unchecked offsets (the GPU default) cannot send a kernel outside the call's tensors: the call is the
    # call on the clamped offsets
    g = torch.Generator().manual_seed(4)
    q = torch.randn(12, 2, 16, generator=g).to(DEVICE)
    k = torch.randn(10, 1, 16, generator=g).to(DEVICE)
    v = torch.randn(10, 1, 16, generator=g).to(DEVICE)
    bad_q, bad_k = torch.tensor([3, 8, 2, 40], device=DEVICE), torch.tensor([0, 6, 99, 4], device=DEVICE)
    good_q, good_k = torch.tensor([0, 8, 8, 12], device=DEVICE), torch.tensor([0, 6, 10, 10], device=DEVICE)
    for causal in (False, True):
        args = (None, None, causal, None, False, Config())
        *_, cu_q, cu_k, plan = kplan.prepare(q, k, v, bad_q, bad_k, *args, check_offsets=False)
        assert cu_q.tolist() == good_q.tolist() and cu_k.tolist() == good_k.tolist()
        out, lse = launch.forward(q, k, v, cu_q, cu_k, plan)
        want_out, want_lse = jagged_flash_attention(q, k, v, good_q, good_k, None, None, causal=causal)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_offsets_on_the_cpu_are_checked_and_the_config_can_ask_for_it_anywhere():
    q = torch.zeros(4, 1, 16, device=DEVICE)
    bad = torch.tensor([0, 3, 2], device=DEVICE)
    good = torch.tensor([0, 2, 4], device=DEVICE)
    with pytest.raises(ValueError, match="cu_seqlens_k must be non-decreasing"):
        jagged_flash_attention(q, q[:4], q[:4], good, bad, None, None, config=Config(check_offsets=True))
    with pytest.raises(ValueError, match="max_seqlen_q=1 is smaller"):
        JaggedPlan(q, q, q, good, good, 1, None)  # a plan checks, wherever the offsets are
    if DEVICE == "cpu":
        with pytest.raises(ValueError, match="cu_seqlens_k must be non-decreasing"):
            jagged_flash_attention(q, q, q, good, bad, None, None)


def test_statistics_columns_start_each_sequence_at_a_multiple_of_four():
    for broadcast, lens_q, lens_k in ((False, [7, 1, 0, 5], [3, 0, 9, 4]), (True, [5] * 3, [2, 8, 0])):
        n_out = sum(lens_q)
        cu_q = torch.tensor([0, 5], dtype=torch.int32, device=DEVICE) if broadcast else _cu(lens_q)
        columns = sched.columns_for(len(lens_k), n_out, DEVICE)
        order, _ = sched.order_and_lists(cu_q, _cu(lens_k), 5 if broadcast else n_out, sum(lens_k),
                                         [sched.ListSpec(64, 1)], causal=False, broadcast=broadcast)
        sched.order_and_lists(order.cu_q, order.cu_k, order.rows_q, order.rows_k, [sched.ListSpec(128, 2, kv=True)],
                              causal=False, broadcast=broadcast, order=order, columns=columns)
        cu = np.concatenate([[0], np.cumsum((np.asarray(lens_q) + 3) // 4 * 4)])
        assert columns.cu.tolist() == cu.tolist()
        want = [int(cu[b]) + r for b, n in enumerate(lens_q) for r in range(n)]
        assert columns.cols.tolist() == want and columns.n_cols % 4 == 0 and columns.n_cols >= cu[-1]


@pytest.mark.parametrize("lens_k, n_chunks", [([5, 1, 1, 1, 9, 1], 3), ([0] * 5, 5), ([400, 1, 1, 1], 3),
                                              (list(range(50)), 7), ([3], 1)])
def test_broadcast_chunks_cut_the_batch_into_non_empty_runs_of_about_equal_work(lens_k, n_chunks):
    n_mblk = 2
    c = sched.broadcast_chunks(_cu(lens_k), len(lens_k), n_chunks, n_mblk)
    assert c.n_slots == n_chunks and c.n_tiles == n_chunks * n_mblk
    lo, hi, blk, slot = (x[:c.n_tiles].tolist() for x in (c.b_lo, c.b_hi, c.blk, c.slot))
    chunks = sorted(set(zip(slot, lo, hi)))
    assert [k for k, _, _ in chunks] == list(range(n_chunks))
    assert chunks[0][1] == 0 and chunks[-1][2] == len(lens_k)
    assert all(a < b for _, a, b in chunks) and all(chunks[i][2] == chunks[i + 1][1] for i in range(n_chunks - 1))
    work = [sum(x + 16 for x in lens_k[a:b]) for _, a, b in chunks]
    assert list(zip(slot, blk)) == [(k, m) for k in range(n_chunks) for m in range(n_mblk)]
    if lens_k == list(range(50)):  # about equal work per chunk
        assert max(work) < 2 * sum(work) / n_chunks


def test_the_forward_is_split_between_the_gluon_and_tl_lists_by_keys():
    lens_q, lens_k = [40, 0, 33, 7, 64, 19, 1], [9, 50, 33, 0, 64, 80, 200]
    _, (on, off) = build(lens_q, lens_k, [sched.ListSpec(128, 2, side=sched.KEYS_AT_LEAST, split=33),
                                          sched.ListSpec(32, 2, side=sched.KEYS_BELOW, split=33)], causal=True)
    assert {s for s in _built(on)[0]} == {2, 4, 5, 6}
    assert {s for s in _built(off)[0]} == {0, 3}


def _seed_work():
    rng = np.random.default_rng(1)
    work = rng.integers(32, 512, size=48).astype(np.int64)
    work[0], work[1], work[2] = 480, 450, 40
    return work


def test_schedule_seed_imbalance():
    work = _seed_work()
    _, rr = sched.round_robin_assign(work, 8)
    _, zz = sched.zigzag_assign(work, 8)
    assert round(sched.imbalance(rr), 3) == 1.234
    assert round(sched.imbalance(zz), 3) == 1.022
    assert rr.tolist() == [1937, 1604, 1087, 1569, 1485, 1493, 1468, 1913]
    assert zz.tolist() == [1604, 1563, 1569, 1573, 1583, 1557, 1545, 1562]


def test_an_unchecked_call_never_reads_the_offsets_on_the_host(monkeypatch):
    # everything from the offsets to the outputs stays on the device: the host-side reader is never called
    from kernels import validation

    def refuse(*args):
        raise AssertionError("the offsets were read on the host")
    monkeypatch.setattr(validation, "_offsets_values", refuse)
    q = torch.randn(9, 2, 16, device=DEVICE)
    cu = torch.tensor([0, 4, 9], device=DEVICE)
    *_, cu_q, cu_k, plan = kplan.prepare(q, q, q, cu, cu, None, None, True, None, False, Config(),
                                         check_offsets=False)
    out, lse = launch.forward(q, q, q, cu_q, cu_k, plan)
    assert out.shape == (9, 2, 16) and bool(torch.isfinite(lse).all())


@pytest.mark.skipif(not _HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_a_plain_call_is_captured_in_a_cuda_graph_and_replays_new_offsets(dtype):
    # a call that waited for the GPU could not be captured at all; this one is, and a replay after new offsets
    # are written into the captured tensor computes the new layout (same rows)
    lens1, lens2 = [100, 3, 700, 0, 221], [500, 24, 0, 300, 200]
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (torch.randn(1024, 4, 128, device=DEVICE, generator=g).to(dtype) for _ in range(3))
    cu = _cu(lens1)
    jagged_flash_attention(q, k, v, cu, cu, None, None, causal=True)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = jagged_flash_attention(q, k, v, cu, cu, None, None, causal=True)
    for lens in (lens1, lens2):
        cu.copy_(_cu(lens))
        graph.replay()
        want_out, want_lse = jagged_flash_attention(q, k, v, _cu(lens), _cu(lens), None, None, causal=True)
        torch.cuda.synchronize()
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def _compiled_variants() -> dict[str, int]:
    """How many compiled variants each of the kernels' JIT functions holds (Triton's per-device caches)."""
    from kernels.gluon import dkdv, dq as gdq, fwd as gfwd
    fns = {"tl.fwd": tl._fwd_kernel, "tl.preprocess": tl._bwd_preprocess, "tl.kv": tl._bwd_kv_kernel,
           "tl.q": tl._bwd_q_kernel, "order": sched._order_kernel, "lists": sched._lists_kernel,
           "expand": sched._expand_kernel, "chunks": sched._chunk_kernel, "gluon.fwd": gfwd.fwd_kernel,
           "gluon.dq": gdq.dq_kernel, "gluon.dkdv": dkdv.dkdv_kernel}
    counts = {}
    for name, fn in fns.items():
        caches = getattr(fn, "device_caches", None)
        if not isinstance(caches, dict):
            pytest.skip("this Triton keeps no per-device kernel cache to count")
        counts[name] = sum(len(entry[0]) for entry in caches.values())
    return counts


@pytest.mark.skipif(not _HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_batches_of_any_size_share_one_compiled_variant(dtype):
    # Triton specializes integer arguments equal to 1 or divisible by 16; the ones that follow the batch (token
    # totals, sequence counts) are declared unspecialized, so a new batch size or token total never compiles
    # again (the first batch has a long and short sequences: both forward paths and every list are built).
    # One choice does follow the batch, by design, and every batch here stays on one side of it: the
    # builder's register sort size (up to 256 sequences).  The Gluon kernels' deal (static while the items
    # fit one program per SM, dynamic past that: [600] * 14 has 140 forward items) is a runtime flag
    def call(lens):
        cu = _cu(lens)
        g = torch.Generator(device=DEVICE).manual_seed(len(lens))
        q, k, v = (torch.randn(int(cu[-1]), 2, 64, device=DEVICE, generator=g).to(dtype).requires_grad_()
                   for _ in range(3))
        out, lse = jagged_flash_attention(q, k, v, cu, cu, None, None, causal=True)
        out.backward(torch.ones_like(out))
        torch.cuda.synchronize()

    call([600, 3, 17, 0])
    before = _compiled_variants()
    for lens in ([1], [16], [1] * 16, [5] * 17, [32, 32], [7] * 33 + [600], [160] * 2, [600] * 14):
        call(lens)
    assert _compiled_variants() == before


@pytest.mark.skipif(not _HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_head_counts_share_one_compiled_variant():
    # head counts and the GQA group are runtime values in every kernel (Gluon included, at D = 128 where it
    # runs): one head, a GQA group of 1 and a new head count compile nothing new
    def call(hq, hkv):
        cu = _cu([600, 3, 17, 0])
        g = torch.Generator(device=DEVICE).manual_seed(hq)
        q = torch.randn(int(cu[-1]), hq, 128, device=DEVICE, generator=g).to(torch.bfloat16).requires_grad_()
        k, v = (torch.randn(int(cu[-1]), hkv, 128, device=DEVICE, generator=g).to(torch.bfloat16).requires_grad_()
                for _ in range(2))
        out, lse = jagged_flash_attention(q, k, v, cu, cu, None, None, causal=True)
        out.backward(torch.ones_like(out))
        torch.cuda.synchronize()

    call(4, 2)
    before = _compiled_variants()
    for hq, hkv in ((1, 1), (3, 3), (6, 1), (8, 2)):
        call(hq, hkv)
    assert _compiled_variants() == before


def _lists_of(s):
    """What a backward list dict holds, as plain values (lists, columns, chunks, the order)."""
    out = {}
    for name, value in s.items():
        if isinstance(value, sched.TileList):
            out[name] = _built(value)
        elif isinstance(value, sched.Columns):
            n = int(value.cu[-1])
            out[name] = (value.cu.tolist(), value.cols[:n].tolist() if n else [], value.n_cols)
        elif isinstance(value, sched.Order):
            out[name] = (value.order.tolist(), value.cu_q.tolist(), value.cu_k.tolist())
        elif isinstance(value, sched.Chunks):  # (past n_tiles the arrays are unused and unwritten)
            out[name] = tuple(x[:value.n_tiles].tolist() if isinstance(x, torch.Tensor) else x for x in value)
    return out


@pytest.mark.parametrize("register_sort", [False, True])
@pytest.mark.parametrize("gluon_backward", [False, True])
@pytest.mark.parametrize("broadcast, causal", [(False, True), (False, False), (True, True)])
def test_a_backward_without_its_forward_builds_the_lists_the_forward_order_gives(monkeypatch, register_sort,
                                                                                   gluon_backward, broadcast, causal):
    # the compiled backward plans on its own (prepare(..., lists="backward")): the order is built in the same
    # pass as the backward's lists, and every list, the statistics columns and the broadcast chunks are those
    # of the eager backward, which builds them from the forward's order
    import functools
    monkeypatch.setattr(sched, "order_and_lists", functools.partial(sched.order_and_lists, register_sort=register_sort))
    if gluon_backward and not broadcast:  # the Gluon dK/dV kernel's lists and statistics columns
        monkeypatch.setattr(kplan, "choose_paths", lambda *a: kplan.Paths("tl", "gluon", "gluon", "dq kernel"))
    lens_k = [130, 0, 7, 64, 300, 1]
    lens_q = [40] * len(lens_k) if broadcast else [130, 5, 0, 64, 17, 1]
    cu_q = _cu([40]) if broadcast else _cu(lens_q)
    cu_k = _cu(lens_k)
    q = torch.zeros(int(cu_q[-1]), 2, 16, device=DEVICE)
    k = torch.zeros(int(cu_k[-1]), 1, 16, device=DEVICE)
    args = (q, k, k, cu_q, cu_k, None, None, causal, None, broadcast, Config())
    *_, fwd_plan = kplan.prepare(*args)
    eager = kplan.backward_lists(fwd_plan, q.shape, k.shape, q.device)
    *_, cu_q_b, cu_k_b, bwd_plan = kplan.prepare(*args, lists="backward")
    assert "fwd" not in bwd_plan.schedule and "fwd_gluon" not in bwd_plan.schedule  # no forward lists built
    compiled = dict(bwd_plan.schedule)
    assert _lists_of(compiled) == {**_lists_of(eager), "order": _lists_of({"order": fwd_plan.schedule["order"]})["order"]}
    assert cu_q_b.tolist() == fwd_plan.schedule["order"].cu_q.tolist()
    with pytest.raises(ValueError, match="lists must be"):
        kplan.prepare(*args, lists="both")
