"""Tests for the Triton jagged flash attention (kernels/).

On machines without CUDA the tl kernels run under the Triton interpreter (TRITON_INTERPRET=1, set by the
root conftest.py before triton is imported); the tests named ``test_gpu_*`` need a GPU, and those of the
Gluon kernels an sm_90 one.  Every result is compared with a float64 per-sequence PyTorch reference written here.  Which
kernels a call ran is read from ``JaggedPlan(...).paths`` on the same inputs: a plain call plans the same.
"""
import ast
import dataclasses
import functools
import gc
import math
import os
import re
import subprocess
import sys


import numpy as np
import pytest
import torch

from kernels import Config, JaggedPlan, SUPPORTED_HEAD_DIMS, jagged_flash_attention
from kernels import plan as kplan
from kernels import reuse
from kernels import schedule as sched
from kernels import tl

_HAS_CUDA = torch.cuda.is_available()  # (without one, the root conftest.py set TRITON_INTERPRET=1)
DEVICE = "cuda" if _HAS_CUDA else "cpu"
INTERPRET = tl.INTERPRET
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BF16_INTERP_SKIP = pytest.mark.skipif(
    INTERPRET,
    reason="Triton interpreter tl.dot on bfloat16 multiplies raw bit patterns "
           "(triton-lang/triton#11584); bf16 is tested on GPU only")
needs_kernels = pytest.mark.skipif(not (_HAS_CUDA or INTERPRET), reason="needs CUDA or TRITON_INTERPRET=1")
needs_cuda = pytest.mark.skipif(not _HAS_CUDA, reason="needs a CUDA GPU (sizes too big for the interpreter)")
TL_ONLY = Config(gluon=False)


# ---------------------------------------------------------------------------
# float64 reference (per-sequence loop)
# ---------------------------------------------------------------------------
def reference(q, k, v, cu_q, cu_k, causal, scale, broadcast):
    """Returns out [rows, Hq, Dv] and lse [Hq, rows] in float64; differentiable."""
    hq, hkv = q.shape[1], k.shape[1]
    g = hq // hkv
    cu_q = [int(x) for x in cu_q]
    cu_k = [int(x) for x in cu_k]
    B = len(cu_k) - 1
    outs, lses = [], []
    for b in range(B):
        qb = q if broadcast else q[cu_q[b]:cu_q[b + 1]]
        kb = k[cu_k[b]:cu_k[b + 1]].repeat_interleave(g, dim=1)
        vb = v[cu_k[b]:cu_k[b + 1]].repeat_interleave(g, dim=1)
        lq, lk = qb.shape[0], kb.shape[0]
        s = torch.einsum("ihd,jhd->hij", qb, kb) * scale
        i = torch.arange(lq)[:, None]
        j = torch.arange(lk)[None, :]
        mask = (j <= i + (lk - lq)) if causal else torch.ones(lq, lk, dtype=torch.bool)
        mask = mask.expand(hq, lq, lk)
        s = s.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(s, dim=-1) if lk > 0 else torch.full((hq, lq), float("-inf"), dtype=s.dtype)
        row_ok = mask.any(-1)
        s_safe = s.masked_fill(~row_ok[..., None], 0.0)
        p = torch.softmax(s_safe, dim=-1) * row_ok[..., None] if lk > 0 else s_safe
        o = torch.einsum("hij,jhd->ihd", p, vb) if lk > 0 else torch.zeros(lq, hq, v.shape[2], dtype=v.dtype)
        outs.append(o)
        lses.append(lse)
    if not outs:
        return (torch.zeros(0, hq, v.shape[2], dtype=torch.float64),
                torch.zeros(hq, 0, dtype=torch.float64))
    return torch.cat(outs, 0), torch.cat(lses, 1)


def make_inputs(lens_q, lens_k, hq, hkv, d, dv, dtype, broadcast=False, seed=0, idx=torch.int32):
    gen = torch.Generator().manual_seed(seed)
    tq = lens_q[0] if broadcast else sum(lens_q)
    tkk = sum(lens_k)
    q = torch.randn(tq, hq, d, generator=gen).to(dtype)
    k = torch.randn(tkk, hkv, d, generator=gen).to(dtype)
    v = torch.randn(tkk, hkv, dv, generator=gen).to(dtype)
    cu_q = torch.tensor([0] + list(np.cumsum([lens_q[0]] if broadcast else lens_q)), dtype=idx)
    cu_k = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=idx)
    return q, k, v, cu_q, cu_k


def rel(a, b):
    a = a.double()
    b = b.double()
    den = b.norm().item()
    return (a - b).norm().item() / max(den, 1e-12)


TOL = {torch.float32: 2e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}
LSE_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


TOL = {torch.float32: 2e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}
LSE_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def run_case(lens_q, lens_k, *, hq=2, hkv=2, d=32, dv=None, dtype=torch.float32, causal=False,
             broadcast=False, scale=None, deterministic=False, seed=0, idx=torch.int32, config=None):
    """One call and its backward against the float64 reference; returns (out, lse, grads, paths)."""
    dv = dv or d
    q, k, v, cu_q, cu_k = make_inputs(lens_q, lens_k, hq, hkv, d, dv, dtype, broadcast, seed, idx)
    sc = scale if scale is not None else 1.0 / math.sqrt(d)
    # reference on the same (rounded) values in float64
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref_o, ref_l = reference(q64, k64, v64, cu_q, cu_k, causal, sc, broadcast)
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(ref_o.shape, generator=gen).to(dtype)
    if ref_o.numel():
        ref_o.backward(do.double())
    qd, kd, vd = (t.to(DEVICE).requires_grad_() for t in (q, k, v))
    args = (qd, kd, vd, cu_q.to(DEVICE), cu_k.to(DEVICE), max(lens_q) if lens_q else 0, max(lens_k) if lens_k else 0)
    kw = dict(causal=causal, softmax_scale=scale, broadcast_q=broadcast, config=config)
    out, lse = jagged_flash_attention(*args, deterministic=deterministic, **kw)
    paths = JaggedPlan(*args, **kw).paths
    assert out.shape == ref_o.shape and out.dtype == dtype
    assert lse.shape == ref_l.shape and lse.dtype == torch.float32
    out.backward(do.to(DEVICE))
    out, lse = out.detach().cpu(), lse.cpu()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    # -inf exactly where the reference has no visible key
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_l))
    fin = torch.isfinite(ref_l)
    if fin.any():
        assert (lse[fin].double() - ref_l[fin]).abs().max().item() < LSE_TOL[dtype]
    if ref_o.numel():
        assert rel(out, ref_o.detach()) < TOL[dtype], rel(out, ref_o.detach())
    # rows with no visible key: exactly 0
    empty_rows = torch.isneginf(ref_l).all(0)
    if empty_rows.any():
        assert (out[empty_rows] == 0).all()
    grads = {}
    for name, t, r in (("dq", qd, q64), ("dk", kd, k64), ("dv", vd, v64)):
        gt = t.grad.cpu()
        assert gt.shape == r.shape
        assert torch.isfinite(gt).all(), name
        rg = r.grad if r.grad is not None else torch.zeros_like(r)
        if rg.norm() > 0:
            assert rel(gt, rg) < 2 * TOL[dtype], (name, rel(gt, rg))
        else:
            assert (gt == 0).all(), name
        grads[name] = gt
    return out, lse, grads, paths


# ---------------------------------------------------------------------------
# forward + backward vs reference
# ---------------------------------------------------------------------------
FP = [torch.float32, torch.float16]


@needs_kernels
@pytest.mark.parametrize("dtype", FP)
def test_varlen_noncausal_zero_length_and_unequal(dtype):
    # zero-length q and k sequences, Lq != Lk, a sequence longer than one block
    run_case([5, 0, 37, 3, 0, 20], [9, 4, 30, 0, 0, 41], dtype=dtype, d=32)


@needs_kernels
@pytest.mark.parametrize("dtype", FP)
def test_causal_bottom_right(dtype):
    # Lq > Lk (early rows with no visible key), Lq < Lk, Lk == 0, equal lengths
    run_case([40, 12, 7, 33, 5], [9, 50, 0, 33, 1], dtype=dtype, d=32, causal=True)


@needs_kernels
def test_causal_rows_without_keys_have_zero_grad():
    out, lse, grads, _ = run_case([20], [3], causal=True, d=16)
    # rows 0..16 see no key (j <= i + 3 - 20)
    assert torch.isneginf(lse[:, :17]).all() and torch.isfinite(lse[:, 17:]).all()
    assert (out[:17] == 0).all()
    assert (grads["dq"][:17] == 0).all()


@needs_kernels
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gqa(causal):
    run_case([17, 35, 0, 8], [17, 20, 6, 40], hq=4, hkv=2, d=32, causal=causal)
    run_case([17, 35], [30, 20], hq=4, hkv=1, d=16, causal=causal, dtype=torch.float16)


@needs_kernels
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", FP)
def test_broadcast_q(causal, dtype):
    # 40 shared query rows vs 6 jagged K/V sequences (incl. empty ones); dQ is
    # the sum over the batch, reduced from several chunk partials
    run_case([40], [50, 0, 13, 64, 1, 40], broadcast=True, causal=causal, dtype=dtype, hq=2, hkv=1)


@needs_kernels
def test_broadcast_q_deterministic_bitwise():
    lens_k = [33, 7, 50, 0, 21, 64, 5, 40]
    res = [run_case([40], lens_k, broadcast=True, causal=True, deterministic=True, dtype=torch.float16, seed=3)[2]
           for _ in range(2)]
    for name in ("dq", "dk", "dv"):
        assert torch.equal(res[0][name], res[1][name]), name


@needs_kernels
def test_head_dims_and_dv():
    run_case([9, 21], [14, 3], d=64, dtype=torch.float16)
    run_case([9, 21], [14, 30], d=16, dv=32, causal=True)
    run_case([5, 18], [19, 3], d=128, causal=True, hq=1, hkv=1)


@needs_kernels
def test_int64_offsets_and_custom_scale():
    run_case([12, 30], [25, 7], causal=True, idx=torch.int64, scale=0.3)


@needs_kernels
def test_single_block_exact_multiples():
    # lengths equal to block multiples (no ragged tail) on interpreter configs
    run_case([32, 64], [32, 64], causal=True)
    run_case([64], [16, 32, 48], broadcast=True)


@needs_kernels
@BF16_INTERP_SKIP
def test_bf16():
    run_case([5, 0, 37, 3], [9, 4, 30, 0], dtype=torch.bfloat16, causal=True, hq=4, hkv=2, d=64)
    run_case([40], [50, 0, 13, 64], dtype=torch.bfloat16, broadcast=True, d=128)


@needs_kernels
def test_all_empty():
    q, k, v, cu_q, cu_k = make_inputs([0, 0], [0, 3], 2, 2, 32, 32, torch.float32)
    kd = k.to(DEVICE).requires_grad_()
    out, lse = jagged_flash_attention(q.to(DEVICE), kd, v.to(DEVICE), cu_q.to(DEVICE), cu_k.to(DEVICE), 0, 3)
    assert out.shape == (0, 2, 32) and lse.shape == (2, 0)


@needs_kernels
@pytest.mark.parametrize("config", [Config(tl_tiles=128), Config(tl_tiles=64)], ids=["tiles128", "tiles64"])
def test_gpu_tile_shapes(config):
    """The GPU's tl tiles (their BLOCK_M / BLOCK_N ratios differ from the interpreter's) on multi-block
    lengths, ragged, causal, GQA and broadcast-Q; under the interpreter too."""
    run_case([300, 0, 129, 64], [257, 5, 400, 0], hq=2, hkv=1, d=16, causal=True, dtype=torch.float16, config=config)
    run_case([129, 200], [300, 1], hq=2, hkv=2, d=16, causal=False, config=config)
    run_case([160], [300, 0, 1, 129, 64], hq=2, hkv=2, d=16, causal=True, broadcast=True, config=config)


@needs_kernels
def test_non_broadcast_gradients_bitwise_repeatable():
    a = run_case([40, 12, 33], [9, 50, 33], causal=True, hq=4, hkv=2, dtype=torch.float16, seed=5)[2]
    b = run_case([40, 12, 33], [9, 50, 33], causal=True, hq=4, hkv=2, dtype=torch.float16, seed=5)[2]
    for name in ("dq", "dk", "dv"):
        assert torch.equal(a[name], b[name]), name


@needs_kernels
def test_strided_heads_view():
    # q/k/v as views into a packed qkv buffer (row stride != H*D); last dim contiguous
    gen = torch.Generator().manual_seed(7)
    lens = [13, 0, 29]
    T, H, D = sum(lens), 2, 32
    qkv = torch.randn(T, 3, H, D, generator=gen)
    cu = torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    out, lse = jagged_flash_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cu.to(DEVICE), cu.to(DEVICE), 29, 29,
                                      causal=True)
    ref, ref_l = reference(q.double(), k.double(), v.double(), cu, cu, True, 1 / math.sqrt(D), False)
    assert rel(out.cpu(), ref) < TOL[torch.float32]


def _fwd_only(q, k, v, cu_q, cu_k, causal, broadcast=False, config=None):
    lq = [int(x) for x in torch.diff(cu_q)]
    lk = [int(x) for x in torch.diff(cu_k)]
    out, lse = jagged_flash_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cu_q.to(DEVICE), cu_k.to(DEVICE),
                                      max(lq), max(lk), causal=causal, broadcast_q=broadcast, config=config)
    return out.cpu(), lse.cpu()


def _first_sequence_alone(la, lb, d, dtype, poison, causal, poisoned, config=None):
    """Two sequences; the second's ``poisoned`` tensors hold ``poison``; the first sequence's output
    and LSE must be finite and those of that sequence alone."""
    q, k, v, cu_q, cu_k = make_inputs([la, lb], [la, lb], 2, 2, d, d, dtype, seed=4)
    bad = {"huge": 6.0e4, "inf": float("inf"), "nan": float("nan")}[poison]
    for name, t in (("q", q), ("k", k), ("v", v)):
        if name in poisoned:
            t[la:] = bad
    out, lse = _fwd_only(q, k, v, cu_q, cu_k, causal, config=config)
    cu_a = torch.tensor([0, la], dtype=torch.int32)
    ref_o, ref_l = reference(q[:la].double(), k[:la].double(), v[:la].double(), cu_a, cu_a, causal,
                             1 / math.sqrt(d), False)
    assert torch.isfinite(out[:la]).all() and torch.isfinite(lse[:, :la]).all()
    assert rel(out[:la], ref_o) < TOL[dtype]
    assert (lse[:, :la].double() - ref_l).abs().max().item() < LSE_TOL[dtype]


@needs_kernels
@pytest.mark.parametrize("poison", ["huge", "inf", "nan"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
# the interpreter computes the masked-out lanes too, in numpy, which warns on the poison it meets there
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                            "ignore:All-NaN slice encountered:RuntimeWarning")
def test_tl_forward_rows_past_lk_never_leak(poison, causal):
    # 21: ragged against every block size used here
    _first_sequence_alone(21, 40, 32, torch.float16, poison, causal, poisoned=("k", "v"), config=TL_ONLY)


# ---------------------------------------------------------------------------
# randomized: any valid small problem matches the reference
# ---------------------------------------------------------------------------
try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    given = None

if given is not None:
    @needs_kernels
    @settings(max_examples=6, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(data=st.data())
    def test_random_problems(data):
        broadcast = data.draw(st.booleans(), label="broadcast")
        causal = data.draw(st.booleans(), label="causal")
        B = data.draw(st.integers(1, 4), label="B")
        lens_k = data.draw(st.lists(st.integers(0, 70), min_size=B, max_size=B), label="lens_k")
        if broadcast:
            lens_q = [data.draw(st.integers(1, 50), label="Lq")]
        else:
            lens_q = data.draw(st.lists(st.integers(0, 70), min_size=B, max_size=B), label="lens_q")
        hkv = data.draw(st.sampled_from([1, 2]), label="hkv")
        hq = hkv * data.draw(st.sampled_from([1, 2]), label="group")
        d = data.draw(st.sampled_from([16, 32]), label="d")
        dtype = data.draw(st.sampled_from(FP), label="dtype")
        run_case(lens_q, lens_k, hq=hq, hkv=hkv, d=d, dtype=dtype, causal=causal, broadcast=broadcast,
                 seed=data.draw(st.integers(0, 1000), label="seed"))


# ---------------------------------------------------------------------------
# plans, torch.compile, the custom operators
# ---------------------------------------------------------------------------
def _small(broadcast, d=32, hq=4, hkv=2):
    lens_q, lens_k = ([5], [7, 0, 3]) if broadcast else ([7, 0, 3, 20], [9, 2, 3, 20])
    dtype = torch.float16 if DEVICE == "cuda" else torch.float32
    tensors = tuple(t.to(DEVICE) for t in make_inputs(lens_q, lens_k, hq, hkv, d, d, dtype, broadcast))
    return tensors, max(lens_q), max(lens_k)


@needs_kernels
@pytest.mark.parametrize("causal,broadcast", [(False, False), (True, False), (True, True)])
def test_plan_gives_the_plain_call_bit_for_bit(causal, broadcast):
    (q, k, v, cu_q, cu_k), mq, mk = _small(broadcast)
    plan = JaggedPlan(q, k, v, cu_q, cu_k, mq, mk, causal=causal, broadcast_q=broadcast)
    runs = []
    for call in (lambda a, b, c: jagged_flash_attention(a, b, c, cu_q, cu_k, mq, mk, causal=causal,
                                                        broadcast_q=broadcast),
                 lambda a, b, c: plan(a, b, c)):
        a, b, c = (t.detach().clone().requires_grad_() for t in (q, k, v))
        out, lse = call(a, b, c)
        out.backward(torch.ones_like(out))
        runs.append((out, lse, a.grad, b.grad, c.grad))
    assert all(torch.equal(x, y) for x, y in zip(*runs))
    # the plan keeps its own offsets: writing the caller's tensors afterwards changes nothing it runs
    cu_k.fill_(0)
    assert torch.equal(plan(q, k, v)[0], runs[1][0])


def _call_and_grads(q, k, v, cu_q, cu_k, mq, mk, causal, broadcast, config=None):
    a, b, c = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = jagged_flash_attention(a, b, c, cu_q, cu_k, mq, mk, causal=causal, broadcast_q=broadcast,
                                      config=config)
    out.backward(torch.ones_like(out))
    return out.detach(), lse, a.grad, b.grad, c.grad


def _same(x, y):
    return all(torch.equal(a, b) for a, b in zip(x, y))


@needs_kernels
@pytest.mark.parametrize("causal,broadcast", [(False, False), (True, False), (True, True)])
def test_plain_calls_reuse_the_lists_of_the_same_unwritten_offsets(causal, broadcast):
    (q, k, v, cu_q, cu_k), mq, mk = _small(broadcast)
    reuse.clear()
    call = functools.partial(_call_and_grads, q, k, v, mq=mq, mk=mk, causal=causal, broadcast=broadcast)
    first = call(cu_q, cu_k)
    assert reuse.stats() == dict(hits=0, misses=1, entries=1)
    again = call(cu_q, cu_k)
    assert reuse.stats() == dict(hits=1, misses=1, entries=1)
    assert _same(first, again)
    # the same values in other tensors: nothing reused, the same answers
    assert _same(call(cu_q.clone(), cu_k.clone()), first)
    assert reuse.stats()["hits"] == 1
    off = Config(reuse_lists=False)
    assert _same(call(cu_q, cu_k, config=off), first)
    assert reuse.stats()["hits"] == 1
    # other lengths with the same totals written into the same tensors: the kept lists are not used
    if broadcast:
        new_q, new_k = cu_q.clone(), torch.tensor([0, 3, 10, 10], dtype=cu_k.dtype, device=cu_k.device)
    else:
        new_q = torch.tensor([0, 20, 23, 23, 30], dtype=cu_q.dtype, device=cu_q.device)
        new_k = torch.tensor([0, 20, 23, 25, 34], dtype=cu_k.dtype, device=cu_k.device)
    want = call(new_q, new_k, config=off)
    assert not _same(want, first)  # (else this test could not tell stale lists from fresh ones)
    hits = reuse.stats()["hits"]
    cu_k.copy_(new_k)
    cu_q.copy_(new_q)
    assert _same(call(cu_q, cu_k), want)
    assert reuse.stats()["hits"] == hits
    assert _same(call(cu_q, cu_k), want)  # kept again, under the new version
    assert reuse.stats()["hits"] == hits + 1


@needs_kernels
def test_lists_are_not_kept_for_inference_tensors_nor_past_their_offsets():
    (q, k, v, cu_q, cu_k), mq, mk = _small(False)
    reuse.clear()
    with torch.inference_mode():  # no version counter: a write could not be seen
        iq, ik = cu_q.clone(), cu_k.clone()
        outs = [jagged_flash_attention(q, k, v, iq, ik, mq, mk)[0] for _ in range(2)]
    assert torch.equal(outs[0], outs[1])
    assert reuse.stats() == dict(hits=0, misses=0, entries=0)
    jagged_flash_attention(q, k, v, cu_q, cu_k, mq, mk)
    assert reuse.stats()["entries"] == 1
    del cu_q, cu_k
    gc.collect()
    assert reuse.stats()["entries"] == 0  # the entry went with its offsets


@needs_kernels
def test_decisions_are_kept_by_layout_and_a_call_that_differs_is_validated_again():
    (q, k, v, cu_q, cu_k), mq, mk = _small(False)
    kplan._decisions.clear()
    args = (q, k, v, cu_q, cu_k, mq, mk, True, None, False, Config())

    def prepare(*a, **kw):
        return kplan.prepare(*a, check_offsets=False, **kw)
    first = prepare(*args)[-1]
    assert len(kplan._decisions) == 1
    again = prepare(q.clone(), k.clone(), v.clone(), *args[3:])[-1]  # other tensors, same layouts
    assert len(kplan._decisions) == 1 and again._replace(schedule=None) == first._replace(schedule=None)
    # what validation refuses is refused after a kept decision too: a float bound equal to the int one,
    # a non-finite scale, a q of another dtype or shape
    with pytest.raises(ValueError, match="max_seqlen_k"):
        prepare(q, k, v, cu_q, cu_k, mq, float(mk), *args[7:])
    with pytest.raises(ValueError, match="softmax_scale"):
        prepare(*args[:8], float("nan"), *args[9:])
    with pytest.raises(ValueError, match="float64"):
        prepare(q.double(), *args[1:])
    with pytest.raises(ValueError, match="head_dim"):
        prepare(q[:, :, :16], *args[1:])
    # another scale is another decision
    assert prepare(*args[:8], 0.5, *args[9:])[-1].scale == 0.5 and len(kplan._decisions) == 2


def _assert_compiled_matches_eager(model, q, k, v):
    # the loss and its gradients, eager and compiled as one graph (fullgraph=True), to the bit
    runs = []
    for fn in (model, torch.compile(model, backend="aot_eager", fullgraph=True)):
        a, b, c = (t.detach().clone().requires_grad_() for t in (q, k, v))
        loss = fn(a, b, c)
        runs.append((loss,) + torch.autograd.grad(loss, (a, b, c)))
    assert all(torch.equal(x, y) for x, y in zip(*runs))


@needs_kernels
@pytest.mark.parametrize("broadcast", [False, True])
@pytest.mark.parametrize("entry", ["call", "plan"])
def test_torch_compile_gives_the_eager_answers_and_gradients(entry, broadcast):
    # inside torch.compile both entry points become one custom operator (kernels/torch_ops.py): the whole
    # model compiles as one graph (fullgraph=True), with eager's outputs and gradients to the bit.  The Config
    # is not the default one: the compiled backward must run under the Config its forward was traced with.
    torch._dynamo.reset()
    (q, k, v, cu_q, cu_k), mq, mk = _small(broadcast, d=16)
    config = Config(tl_tiles=128)
    plan = JaggedPlan(q, k, v, cu_q, cu_k, mq, mk, causal=True, broadcast_q=broadcast, config=config)
    attend = plan if entry == "plan" else (
        lambda a, b, c: jagged_flash_attention(a, b, c, cu_q, cu_k, mq, mk, causal=True, broadcast_q=broadcast,
                                               config=config))

    def model(a, b, c):
        out, lse = attend(a * 2, b, c)
        return (out.float() * out.float()).sum() + lse[lse.isfinite()].sum()
    _assert_compiled_matches_eager(model, q, k, v)


@needs_kernels
def test_torch_compile_with_the_environment_config_traces_no_configuration_code():
    # no config= given: the graph carries "" and the operator reads the environment's Config when it runs
    # (dynamo cannot trace reading it: dataclasses.fields is a graph break, an error under fullgraph=True)
    torch._dynamo.reset()
    (q, k, v, cu_q, cu_k), mq, mk = _small(False, d=16)

    def model(a, b, c):
        out, lse = jagged_flash_attention(a, b, c, cu_q, cu_k, mq, mk, causal=True)
        return (out.float() * out.float()).sum()
    _assert_compiled_matches_eager(model, q, k, v)


@needs_kernels
@pytest.mark.parametrize("broadcast", [False, True])
def test_custom_operators_pass_torch_library_opcheck(broadcast):
    # schema, fake (shape-only) implementation and autograd registration agree with what the operator does
    from kernels import torch_ops
    (q, k, v, cu_q, cu_k), mq, _ = _small(broadcast, d=16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    config = str(Config(tl_tiles=64))
    args = (q, k, v, cu_q, cu_k, mq, None, True, None, broadcast, config)
    torch.library.opcheck(torch_ops.jagged_attention_forward, args)
    out, lse = torch_ops.jagged_attention_forward(*args)
    torch.library.opcheck(torch_ops.jagged_attention_backward,
                          (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse, cu_q, cu_k,
                           None, None, True, None, broadcast, config))


@needs_kernels
def test_plan_refuses_tensors_of_another_layout():
    q, k, v, cu_q, cu_k = (t.to(DEVICE) for t in make_inputs([7, 3], [7, 3], 2, 2, 32, 32, torch.float32))
    plan = JaggedPlan(q, k, v, cu_q, cu_k, 7, 7)
    with pytest.raises(ValueError, match=r"q\.shape"):
        plan(q[:5], k, v)
    with pytest.raises(ValueError, match=r"v\.dtype"):
        plan(q, k, v.half())
    with pytest.raises(ValueError, match=r"k\.stride"):
        plan(q, k.transpose(0, 1).contiguous().transpose(0, 1), v)
    with pytest.raises(ValueError, match="cu_seqlens_k"):  # planning validates like a call
        JaggedPlan(q, k, v, cu_q, cu_k.flip(0), 7, 7)


# ---------------------------------------------------------------------------
# bad inputs (tests/test_validation.py checks every rule's message against the spec's)
# ---------------------------------------------------------------------------
def _call(**kw):
    q, k, v, cu_q, cu_k = make_inputs([5, 7], [6, 8], 2, 2, 32, 32, torch.float32)
    a = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=7, max_seqlen_k=8)
    # offsets on the CPU are always checked; offsets on the GPU are read back (and checked against max_seqlen)
    # only under check_offsets
    extra = {} if DEVICE == "cpu" else {"config": Config(check_offsets=True)}
    extra.update({x: kw.pop(x) for x in ("causal", "broadcast_q", "softmax_scale", "config") if x in kw})
    a.update(kw)
    a = {n: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for n, t in a.items()}
    return jagged_flash_attention(a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_k"],
                                  a["max_seqlen_q"], a["max_seqlen_k"], **extra)


@needs_kernels
@pytest.mark.parametrize("bad, field", [
    (dict(max_seqlen_q=6), "max_seqlen_q"),
    (dict(max_seqlen_k=7), "max_seqlen_k"),
    (dict(max_seqlen_k=np.float32(8)), "max_seqlen_k"),
    (dict(cu_seqlens_q=torch.tensor([1, 5, 12], dtype=torch.int32)), r"cu_seqlens_q\[0\]"),
    (dict(cu_seqlens_q=torch.tensor([0, 8, 7], dtype=torch.int32)), "cu_seqlens_q must be non-decreasing"),
    (dict(cu_seqlens_k=torch.tensor([0, 6, 13], dtype=torch.int32)), r"cu_seqlens_k\[-1\]"),
    (dict(cu_seqlens_k=torch.tensor([0, 6, 14], dtype=torch.float32)), "cu_seqlens_k must be int32 or int64"),
    (dict(cu_seqlens_k=torch.tensor([0, 14], dtype=torch.int32)), "must have the same length"),
    (dict(k=torch.randn(14, 3, 32)), "k and v must have the same number of heads"),
    (dict(v=torch.randn(13, 2, 32)), "k and v must have the same number of rows"),
    (dict(q=torch.randn(12, 2, 48), k=torch.randn(14, 2, 48), v=torch.randn(14, 2, 48)), "head_dim 48"),
    (dict(q=torch.randn(12, 2, 256), k=torch.randn(14, 2, 256), v=torch.randn(14, 2, 256)), "head_dim 256"),
    (dict(v=torch.randn(14, 2, 48)), "v head_dim 48"),
    (dict(q=torch.randn(12, 2, 32, dtype=torch.float64)), "q must be float32, float16 or bfloat16"),
    (dict(q=torch.randn(12, 2, 32).half()), "share one dtype"),
    (dict(q=torch.randn(12, 32)), "q must be 3-D"),
    (dict(softmax_scale=float("nan")), "softmax_scale"),
    (dict(softmax_scale=-0.5), "softmax_scale must be finite and positive"),
    (dict(broadcast_q=True), r"cu_seqlens_q must be \[0, Lq\]"),
    (dict(config="gluon=0"), "config must be a kernels.Config"),
])
def test_bad_inputs_raise_value_error_naming_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        _call(**bad)


def test_supported_head_dims_declared():
    assert SUPPORTED_HEAD_DIMS == (16, 32, 64, 128)


def test_kernels_import_nothing_from_the_suite_or_its_adapters():
    # kernels/ is a library of its own: no module of it imports conformance/ or backends/
    here = os.path.join(ROOT, "kernels")
    found = []
    for folder, _, files in os.walk(here):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            for node in ast.walk(ast.parse(open(path).read())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                found += [f"{os.path.relpath(path, ROOT)}: {n}" for n in names
                          if n.split(".")[0] in ("conformance", "backends")]
    assert found == []


# ---------------------------------------------------------------------------
# the configuration
# ---------------------------------------------------------------------------
def test_config_round_trips_through_its_string_and_the_environment():
    config = Config(gluon=False, gluon_split_keys=0, gluon_programs=3, tl_tiles=64)
    assert Config.from_string(str(config)) == config
    assert Config.from_string("") == Config()
    env = {"JFA_GLUON": "0", "JFA_GLUON_SPLIT_KEYS": "0", "JFA_GLUON_PROGRAMS": "3", "JFA_TL_TILES": "64",
           "JFA_OTHER": "x"}
    assert Config.from_env(env) == config and Config.from_env({}) == Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.gluon = True


@pytest.mark.parametrize("env, words", [
    ({"JFA_GLUON": "yes"}, "JFA_GLUON must be 0 or 1"),
    ({"JFA_GLUON_SPLIT_KEYS": "512.0"}, "JFA_GLUON_SPLIT_KEYS must be an integer"),
    ({"JFA_GLUON_SPLIT_KEYS": "-1"}, "Config.gluon_split_keys must be >= 0"),
    ({"JFA_TL_TILES": "48"}, "Config.tl_tiles must be 0 or one of"),
    ({"JFA_GLUON_PROGRAMS": "-2"}, "Config.gluon_programs must be >= 0"),
])
def test_a_bad_environment_value_is_refused_by_name(env, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        Config.from_env(env)


@pytest.mark.parametrize("kw, words", [(dict(gluon=1), "Config.gluon must be bool"),
                                       (dict(gluon_split_keys=512.0), "Config.gluon_split_keys must be int"),
                                       (dict(gluon_programs=True), "Config.gluon_programs must be int")])
def test_a_bad_config_field_is_refused_by_name(kw, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        Config(**kw)
    with pytest.raises(ValueError, match="no such field"):
        Config.from_string("gluon_grid=1")


@needs_kernels
def test_the_environment_config_is_read_at_the_first_call():
    # in a fresh process: JFA_TL_TILES reaches the plan of a call that gives no config; a bad value is an
    # error at the first call, naming the variable
    # (on the device the other tests use: the builders run in the interpreter only without CUDA)
    code = (f"import torch\nfrom kernels import JaggedPlan\nq = torch.randn(4, 1, 16, device={DEVICE!r})\n"
            f"cu = torch.tensor([0, 4], dtype=torch.int32, device={DEVICE!r})\n"
            "print(JaggedPlan(q, q, q, cu, cu, 4, 4).config)\n")
    env = {**os.environ, "TRITON_INTERPRET": "0" if _HAS_CUDA else "1"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**env, "JFA_TL_TILES": "64"})
    assert run.returncode == 0 and "tl_tiles=64" in run.stdout, run.stderr[-2000:]
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**env, "JFA_GLUON": "on"})
    assert run.returncode != 0 and "JFA_GLUON must be 0 or 1" in run.stderr, run.stderr[-2000:]


def test_kernels_readme_lists_every_environment_variable_with_its_default():
    # kernels/README.md's table of the Config's fields against the Config itself
    readme = open(os.path.join(ROOT, "kernels", "README.md")).read()
    listed = dict(re.findall(r"^\| `(JFA_\w+)` \| `([^`]*)`", readme, re.M))
    want = {"JFA_" + f.name.upper(): str(int(f.default)) for f in dataclasses.fields(Config)}
    assert listed == want


# ---------------------------------------------------------------------------
# the plan: paths, grids, schedule
# ---------------------------------------------------------------------------
@needs_kernels
def test_paths_say_where_gluon_does_not_run():
    (q, k, v, cu_q, cu_k), mq, mk = _small(False)
    paths = JaggedPlan(q, k, v, cu_q, cu_k, mq, mk, config=TL_ONLY).paths
    assert paths == kplan.Paths("tl", "tl", "tl", "preprocess", "Config.gluon is off")
    assert str(paths) == "forward tl; dK/dV tl; dQ tl; delta preprocess (no Gluon: Config.gluon is off)"
    if INTERPRET:
        paths = JaggedPlan(q, k, v, cu_q, cu_k, mq, mk).paths
        assert paths.why_not_gluon == "the Triton interpreter does not run Gluon" and paths.forward == "tl"


@pytest.mark.parametrize("n_items, config, want", [(500, Config(), (132, True)), (100, Config(), (100, False)),
                                                   (500, Config(gluon_programs=3), (3, True)),
                                                   (2, Config(gluon_programs=3), (2, False))])
def test_gluon_grid_is_one_program_per_sm_claiming_items(n_items, config, want, monkeypatch):
    # both Gluon backward kernels and the forward launch this grid: one program per SM (or fewer, by the
    # Config), the counter only when some program gets a second item
    monkeypatch.setattr(kplan, "num_sms", lambda device: 132)
    assert kplan.gluon_programs(n_items, torch.device("cpu"), config) == want


@needs_kernels
@pytest.mark.parametrize("broadcast", [False, True])
def test_backward_statistics_land_in_their_columns(broadcast):
    # what the Gluon dK/dV kernel reads by TMA: row h = LSE * log2(e) (+inf where LSE is -inf: the row sees
    # no key, its P must be 0), row Hq + h = delta = rowsum(dO * O), output row t in column cols[t]; the
    # columns between sequences are never written (the kernel masks them)
    g = torch.Generator().manual_seed(5)
    hq, dv = 3, 64
    lens_out = [6, 6, 6] if broadcast else [7, 1, 0, 5]
    n_out = sum(lens_out)
    out = torch.randn(n_out, hq, dv, generator=g).to(DEVICE)
    do = torch.randn(n_out, hq, dv, generator=g).to(DEVICE)
    lse = torch.randn(hq, n_out, generator=g).to(DEVICE)
    lse[1, 2] = float("-inf")
    columns = sched.columns_for(len(lens_out), n_out, DEVICE)
    cu_q = torch.tensor([0, 6], device=DEVICE) if broadcast else \
        torch.tensor(np.concatenate([[0], np.cumsum(lens_out)]), device=DEVICE)
    sched.order_and_lists(cu_q, torch.zeros(len(lens_out) + 1, dtype=torch.int32, device=DEVICE),
                          6 if broadcast else n_out, 0, [sched.ListSpec(128, 1, kv=True)], causal=False,
                          broadcast=broadcast, columns=columns)
    stats = torch.full((2 * hq, columns.n_cols), float("nan"), device=DEVICE)
    delta = torch.empty_like(lse)
    tl._bwd_preprocess[(-(-n_out // 16), hq)](
        out, do, delta, lse, stats, columns.cols, n_out, out.stride(0), out.stride(1), do.stride(0),
        do.stride(1), delta.stride(0), stats.stride(0), BLOCK=16, HEAD_DV=dv, WRITE_STATS=True)
    want_delta = (out.double() * do.double()).sum(-1).T
    torch.testing.assert_close(delta.double(), want_delta, rtol=1e-5, atol=1e-5)
    cols = columns.cols.long()
    want_lse2 = lse.double() * math.log2(math.e)
    want_lse2[1, 2] = float("inf")
    torch.testing.assert_close(stats[:hq, cols].double(), want_lse2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(stats[hq:, cols], delta, rtol=0, atol=0)
    unused = torch.ones(columns.n_cols, dtype=torch.bool, device=DEVICE)
    unused[cols] = False
    assert bool(stats[:, unused].isnan().all()) and int(unused.sum()) == columns.n_cols - n_out
