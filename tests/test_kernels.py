"""Tests for the Triton jagged flash attention kernel (kernels/).

On machines without CUDA the kernels run under the Triton interpreter
(TRITON_INTERPRET=1, set below before triton is imported).  Every result is
compared with a float64 per-sequence PyTorch reference written here.
"""
import os

try:  # decide before triton is imported anywhere in this process
    import torch as _torch_probe

    _HAS_CUDA = _torch_probe.cuda.is_available()
except Exception:  # pragma: no cover
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from kernels import SUPPORTED_HEAD_DIMS, jagged_flash_attention, jfa
from kernels import schedule as sched
from kernels import triton_kernels as tk
from kernels.sweep import KV as SWEPT_KV

DEVICE = "cuda" if _HAS_CUDA else "cpu"
INTERPRET = tk.INTERPRET
_HAS_SM90 = _HAS_CUDA and not INTERPRET and torch.cuda.get_device_capability() >= (9, 0)  # TMA
BF16_INTERP_SKIP = pytest.mark.skipif(
    INTERPRET,
    reason="Triton interpreter tl.dot on bfloat16 multiplies raw bit patterns "
           "(triton-lang/triton#11584); bf16 is tested on GPU only")
needs_kernels = pytest.mark.skipif(not (_HAS_CUDA or INTERPRET),
                                   reason="needs CUDA or TRITON_INTERPRET=1")


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


def run_case(lens_q, lens_k, *, hq=2, hkv=2, d=32, dv=None, dtype=torch.float32, causal=False,
             broadcast=False, scale=None, deterministic=False, seed=0, idx=torch.int32):
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
    out, lse = jagged_flash_attention(qd, kd, vd, cu_q.to(DEVICE), cu_k.to(DEVICE),
                                      max(lens_q) if lens_q else 0, max(lens_k) if lens_k else 0,
                                      causal=causal, softmax_scale=scale, broadcast_q=broadcast,
                                      deterministic=deterministic)
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
    return out, lse, grads


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
    out, lse, grads = run_case([20], [3], causal=True, d=16)
    # rows 0..16 see no key (j <= i + 3 - 20)
    assert torch.isneginf(lse[:, :17]).all() and torch.isfinite(lse[:, 17:]).all()
    assert (out[:17] == 0).all()
    assert (grads["dq"][:17] == 0).all()


@needs_kernels
@pytest.mark.parametrize("causal", [False, True])
def test_gqa(causal):
    run_case([17, 35, 0, 8], [17, 20, 6, 40], hq=4, hkv=2, d=32, causal=causal)
    run_case([17, 35], [30, 20], hq=4, hkv=1, d=16, causal=causal, dtype=torch.float16)


@needs_kernels
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", FP)
def test_broadcast_q(causal, dtype):
    # 40 shared query rows vs 6 jagged K/V sequences (incl. empty ones); dQ is
    # the sum over the batch, reduced from several chunk partials
    run_case([40], [50, 0, 13, 64, 1, 40], broadcast=True, causal=causal, dtype=dtype, hq=2, hkv=1)


@needs_kernels
def test_broadcast_q_deterministic_bitwise():
    lens_k = [33, 7, 50, 0, 21, 64, 5, 40]
    res = []
    for _ in range(2):
        _, _, g = run_case([40], lens_k, broadcast=True, causal=True, deterministic=True,
                           dtype=torch.float16, seed=3)
        res.append(g)
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
    out, lse = jagged_flash_attention(q.to(DEVICE), kd, v.to(DEVICE), cu_q.to(DEVICE),
                                      cu_k.to(DEVICE), 0, 3)
    assert out.shape == (0, 2, 32) and lse.shape == (2, 0)


@needs_kernels
@pytest.mark.parametrize("dtype", FP)
def test_fused_atomic_dq_mode(dtype, monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_DQ_MODE", "atomic")
    run_case([5, 0, 37, 3, 0, 20], [9, 4, 30, 0, 0, 41], dtype=dtype, d=32)
    # TMA reduce-adds where the GPU has TMA; element atomics elsewhere (the interpreter has no TMA reduce)
    assert jfa.LAST_BWD_DQ_PATH == ("atomic-tma" if _HAS_SM90 else "atomic-element"), jfa.LAST_BWD_DQ_PATH
    run_case([40, 12, 7, 33, 5], [9, 50, 0, 33, 1], dtype=dtype, d=32, causal=True, hq=4, hkv=2)
    # deterministic=True / broadcast-Q fall back to the separate dQ kernel
    run_case([40], [50, 0, 13], broadcast=True, causal=True, dtype=dtype)
    run_case([12, 30], [25, 7], causal=True, deterministic=True, dtype=dtype)


@needs_kernels
@pytest.mark.parametrize("dtype", FP)
def test_ds_dq_mode(dtype, monkeypatch):
    # dQ read back from the dS the dK/dV kernel stores: ragged, empty, causal with keys fewer and more than
    # queries, GQA, broadcast-Q and deterministic=True all take it
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_DQ_MODE", "ds")
    for kw in (dict(lens_q=[5, 0, 37, 3, 0, 20], lens_k=[9, 4, 30, 0, 0, 41]),
               dict(lens_q=[40, 12, 7, 33, 5], lens_k=[9, 50, 0, 33, 1], causal=True, hq=4, hkv=2),
               dict(lens_q=[40], lens_k=[50, 0, 13], broadcast=True, causal=True),
               dict(lens_q=[12, 30], lens_k=[25, 7], causal=True, deterministic=True)):
        run_case(d=32, dtype=dtype, **kw)
        assert jfa.LAST_BWD_DQ_PATH == "ds", (kw, jfa.LAST_BWD_DQ_PATH)


@needs_kernels
def test_ds_dq_mode_is_bitwise_repeatable(monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_DQ_MODE", "ds")
    first = run_case([40, 12, 7], [9, 50, 33], causal=True, hq=2, hkv=1, d=32, dtype=torch.float16)[2]
    again = run_case([40, 12, 7], [9, 50, 33], causal=True, hq=2, hkv=1, d=32, dtype=torch.float16)[2]
    assert all(torch.equal(first[n], again[n]) for n in first)


@needs_kernels
def test_ds_dq_mode_says_why_it_did_not_run(monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_DQ_MODE", "ds")
    # 2 heads x (12 * 25 + 30 * 7) pairs x 4 bytes = 4,080 bytes of workspace
    monkeypatch.setattr(jfa, "DS_WORKSPACE_MAX_BYTES", 4079)
    run_case([12, 30], [25, 7], causal=True, d=32)
    assert jfa.LAST_BWD_DQ_PATH.startswith(("separate (ds: its dS workspace would take 4080 bytes",
                                            "gluon (ds: its dS workspace would take 4080 bytes")), jfa.LAST_BWD_DQ_PATH
    monkeypatch.setattr(jfa, "DS_WORKSPACE_MAX_BYTES", 4080)
    run_case([12, 30], [25, 7], causal=True, d=32)
    assert jfa.LAST_BWD_DQ_PATH == "ds"
    monkeypatch.setattr(jfa, "DS_WORKSPACE_MAX_BYTES", -1)
    q, k, v, cu_q, cu_k = (t.to(DEVICE) for t in make_inputs([5], [9], 1, 1, 32, 32, torch.float32))
    with pytest.raises(ValueError, match="DS_WORKSPACE_MAX_BYTES"):
        jagged_flash_attention(q.requires_grad_(), k, v, cu_q, cu_k, 5, 9)


# every module switch a backward acts on (kernels/jfa.py BackwardSwitches and the kernel choices)
BACKWARD_SWITCHES = ("BWD_DQ_MODE", "BWD_KV_KERNEL", "BWD_Q_KERNEL", "BWD_DQ_REDUCE", "GLUON_GRID",
                     "GLUON_BWD_STAGES", "GLUON_BWD_ORDER", "GLUON_BWD_BLOCK_M", "GLUON_BWD_SPLIT_KEYS",
                     "GLUON_FUSED_DQ_SPLIT", "GLUON_FUSED_DQ_BUFFERS", "GLUON_DQ_STAGES", "DS_WORKSPACE_MAX_BYTES",
                     "GLUON_BWD_REG_OPERAND", "GLUON_DQ_DELTA")


def check_backward_keeps_its_switches(monkeypatch, switches, d, dtype):
    """A benchmark sets the switches around the forward call only, and a plan is made once: the backward
    must act on what was read when its forward was prepared.  Under ``switches``, every switch it could
    read is made invalid between the forward and the backward, which must neither notice nor change
    course.  Returns the backward's (dK/dV path, dQ path)."""
    from kernels import jfa
    for name, value in switches.items():
        monkeypatch.setattr(jfa, name, value)
    q, k, v, cu_q, cu_k = (t.to(DEVICE) for t in make_inputs([40, 0, 33], [9, 50, 33], 2, 1, d, d, dtype))
    do = torch.randn(73, 2, d, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)

    def grads(break_switches):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        with monkeypatch.context() as m:
            out, _ = jagged_flash_attention(*leaves, cu_q, cu_k, 40, 50, causal=True)
            if break_switches:
                for name in BACKWARD_SWITCHES:
                    m.setattr(jfa, name, "invalid")
            out.backward(do)
        return [t.grad for t in leaves], (jfa.LAST_BWD_KV_PATH, jfa.LAST_BWD_DQ_PATH)

    want, want_paths = grads(False)
    got, got_paths = grads(True)
    assert got_paths == want_paths
    atomic = switches.get("BWD_DQ_MODE") == "atomic"
    for g, w in zip(got, want):  # the atomic mode's adds may land in another order on a GPU
        assert torch.equal(g, w) or (atomic and rel(g, w) < TOL[dtype])
    return got_paths


@needs_kernels
@pytest.mark.parametrize("mode", ["separate", "atomic", "ds"])
def test_backward_runs_the_switches_its_forward_saw(mode, monkeypatch):
    paths = check_backward_keeps_its_switches(monkeypatch, {"BWD_DQ_MODE": mode}, 32, torch.float16)
    assert paths[1].startswith({"atomic": "atomic", "ds": "ds"}.get(mode, ("separate", "gluon")))


@needs_kernels
def test_a_bad_dq_reduce_is_an_error_before_the_forward(monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_DQ_MODE", "atomic")
    monkeypatch.setattr(jfa, "BWD_DQ_REDUCE", "bulk")
    q, k, v, cu_q, cu_k = (t.to(DEVICE) for t in make_inputs([5], [9], 1, 1, 32, 32, torch.float32))
    with pytest.raises(ValueError, match="BWD_DQ_REDUCE"):
        jagged_flash_attention(q.requires_grad_(), k, v, cu_q, cu_k, 5, 9)  # the forward call itself


@needs_kernels
@pytest.mark.parametrize("mode", ["separate", "atomic", "ds"])
def test_gpu_block_shapes(mode, monkeypatch):
    """The H200 D=128 block shapes (BLOCK_M/BLOCK_N ratios differ from the
    interpreter defaults) on multi-block lengths; under the interpreter too."""
    from kernels import jfa
    cfg = jfa._GPU_CFG[128]
    monkeypatch.setattr(jfa, "CONFIG_OVERRIDE", {kk: cfg[kk] for kk in ("fwd", "kv", "kvf", "q", "qds")})
    monkeypatch.setattr(jfa, "BWD_DQ_MODE", mode)
    run_case([300, 0, 129, 64], [257, 5, 400, 0], hq=2, hkv=1, d=16, causal=True, dtype=torch.float16)
    run_case([129, 200], [300, 1], hq=2, hkv=2, d=16, causal=False)
    run_case([160], [300, 0, 1, 129, 64], hq=2, hkv=2, d=16, causal=True, broadcast=True)


@needs_kernels
@pytest.mark.parametrize("cfg", SWEPT_KV, ids=lambda c: "kv{}x{}w{}s{}".format(*c))
def test_swept_dkdv_configs_give_the_right_gradients(cfg, monkeypatch):
    # every dK/dV config the sweep times is correct on multi-block, ragged, causal, GQA lengths (the sweep
    # also records each row's difference from the shipped config on the GPU)
    from kernels import jfa
    monkeypatch.setattr(jfa, "CONFIG_OVERRIDE", {"kv": cfg})
    run_case([300, 0, 129, 64], [257, 5, 400, 0], hq=2, hkv=1, d=16, causal=True, dtype=torch.float16)


# ---------------------------------------------------------------------------
# bad inputs
# ---------------------------------------------------------------------------
def _good():
    q, k, v, cu_q, cu_k = make_inputs([5, 7], [6, 8], 2, 2, 32, 32, torch.float32)
    return dict(q=q.to(DEVICE), k=k.to(DEVICE), v=v.to(DEVICE), cu_seqlens_q=cu_q.to(DEVICE),
                cu_seqlens_k=cu_k.to(DEVICE), max_seqlen_q=7, max_seqlen_k=8)


def _call(**kw):
    a = _good()
    extra = {x: kw.pop(x) for x in ("causal", "broadcast_q", "softmax_scale") if x in kw}
    a.update(kw)
    return jagged_flash_attention(a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_k"],
                                  a["max_seqlen_q"], a["max_seqlen_k"], **extra)


@needs_kernels
@pytest.mark.parametrize("causal,broadcast", [(False, False), (True, False), (True, True)])
def test_plan_gives_the_plain_call_bit_for_bit(causal, broadcast):
    from kernels import JaggedPlan
    lens_q, lens_k = ([5], [7, 0, 3]) if broadcast else ([7, 0, 3, 20], [9, 2, 3, 20])
    dtype = torch.float16 if DEVICE == "cuda" else torch.float32
    q, k, v, cu_q, cu_k = (t.to(DEVICE) for t in make_inputs(lens_q, lens_k, 4, 2, 32, 32, dtype, broadcast))
    mq, mk = max(lens_q), max(lens_k)
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


@needs_kernels
@pytest.mark.parametrize("broadcast", [False, True])
@pytest.mark.parametrize("entry", ["call", "plan"])
def test_torch_compile_gives_the_eager_answers_and_gradients(entry, broadcast):
    # inside torch.compile both entry points become one custom operator (kernels/torch_ops.py): the whole
    # model compiles as one graph (fullgraph=True), with eager's outputs and gradients to the bit
    from kernels import JaggedPlan
    torch._dynamo.reset()
    lens_q, lens_k = ([5], [7, 0, 3]) if broadcast else ([7, 0, 3, 20], [9, 2, 3, 20])
    dtype = torch.float16 if DEVICE == "cuda" else torch.float32
    q, k, v, cu_q, cu_k = (t.to(DEVICE) for t in make_inputs(lens_q, lens_k, 4, 2, 16, 16, dtype, broadcast))
    mq, mk = max(lens_q), max(lens_k)
    plan = JaggedPlan(q, k, v, cu_q, cu_k, mq, mk, causal=True, broadcast_q=broadcast)
    attend = plan if entry == "plan" else (
        lambda a, b, c: jagged_flash_attention(a, b, c, cu_q, cu_k, mq, mk, causal=True, broadcast_q=broadcast))

    def model(a, b, c):
        out, lse = attend(a * 2, b, c)
        return (out.float() * out.float()).sum() + lse[lse.isfinite()].sum()
    runs = []
    for fn in (model, torch.compile(model, backend="aot_eager", fullgraph=True)):
        a, b, c = (t.detach().clone().requires_grad_() for t in (q, k, v))
        loss = fn(a, b, c)
        runs.append((loss,) + torch.autograd.grad(loss, (a, b, c)))
    assert all(torch.equal(x, y) for x, y in zip(*runs))


@needs_kernels
@pytest.mark.parametrize("broadcast", [False, True])
def test_custom_operators_pass_torch_library_opcheck(broadcast):
    # schema, fake (shape-only) implementation and autograd registration agree with what the operator does
    from kernels import torch_ops
    lens_q, lens_k = ([5], [7, 0, 3]) if broadcast else ([7, 0, 3], [9, 2, 3])
    dtype = torch.float16 if DEVICE == "cuda" else torch.float32
    q, k, v, cu_q, cu_k = (t.to(DEVICE) for t in make_inputs(lens_q, lens_k, 4, 2, 16, 16, dtype, broadcast))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    args = (q, k, v, cu_q, cu_k, max(lens_q), None, True, None, broadcast, False)
    torch.library.opcheck(torch_ops.jagged_attention_forward, args)
    out, lse = torch_ops.jagged_attention_forward(*args)
    torch.library.opcheck(torch_ops.jagged_attention_backward,
                          (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse, cu_q, cu_k,
                           None, None, True, None, broadcast, False))


@needs_kernels
def test_plan_refuses_tensors_of_another_layout():
    from kernels import JaggedPlan
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


@needs_kernels
@pytest.mark.parametrize("bad", [
    dict(max_seqlen_q=6),
    dict(max_seqlen_k=7),
    dict(cu_seqlens_q=torch.tensor([1, 5, 12], dtype=torch.int32)),
    dict(cu_seqlens_q=torch.tensor([0, 8, 7], dtype=torch.int32)),
    dict(cu_seqlens_k=torch.tensor([0, 6, 13], dtype=torch.int32)),
    dict(cu_seqlens_k=torch.tensor([0, 6, 14], dtype=torch.float32)),
    dict(cu_seqlens_k=torch.tensor([0, 14], dtype=torch.int32)),
    dict(k=torch.randn(14, 3, 32)),
    dict(v=torch.randn(13, 2, 32)),
    dict(q=torch.randn(12, 2, 48), k=torch.randn(14, 2, 48), v=torch.randn(14, 2, 48)),
    dict(q=torch.randn(12, 2, 256), k=torch.randn(14, 2, 256), v=torch.randn(14, 2, 256)),
    dict(v=torch.randn(14, 2, 48)),
    dict(q=torch.randn(12, 2, 32, dtype=torch.float64)),
    dict(q=torch.randn(12, 2, 32).half()),
    dict(q=torch.randn(12, 32)),
    dict(softmax_scale=float("nan")),
    dict(broadcast_q=True),
])
def test_bad_inputs_raise_value_error(bad):
    bad = {kk: (vv.to(DEVICE) if isinstance(vv, torch.Tensor) else vv) for kk, vv in bad.items()}
    with pytest.raises(ValueError):
        _call(**bad)


def test_supported_head_dims_declared():
    assert 64 in SUPPORTED_HEAD_DIMS and 128 in SUPPORTED_HEAD_DIMS


# ---------------------------------------------------------------------------
# host-side scheduling
# ---------------------------------------------------------------------------
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


def test_schedule_tiles_pruned_and_persistent_lists():
    lens_q = np.array([0, 5, 130, 0, 64])
    lens_k = np.array([7, 0, 200, 0, 64])
    seq, blk, work = sched.forward_tiles(lens_q, lens_k, 64, causal=False)
    assert list(zip(seq.tolist(), blk.tolist())) == [(1, 0), (2, 0), (2, 1), (2, 2), (4, 0)]
    seq, blk, work = sched.kv_tiles(lens_q, lens_k, 64, causal=True)
    assert list(zip(seq.tolist(), blk.tolist())) == [(2, 0), (2, 1), (2, 2), (2, 3), (4, 0)]
    ptr, ids, loads = sched.persistent_zigzag(_seed_work(), 8)
    assert ptr[-1] == 48 and sorted(ids.tolist()) == list(range(48))
    assert round(sched.imbalance(loads), 3) == 1.022
    order, assign, loads = sched.block_innermost_round_robin(seq, blk, work, 3)
    assert sorted(order.tolist()) == list(range(len(seq)))
    b = sched.split_batches_by_work([5, 1, 1, 1, 9, 1], 3)
    assert b[0] == 0 and b[-1] == 6 and np.all(np.diff(b) > 0)


# ---------------------------------------------------------------------------
# GPU-only: lengths spanning several of the GPU kernels' blocks (BLOCK_M 128)
# ---------------------------------------------------------------------------
needs_cuda = pytest.mark.skipif(not _HAS_CUDA, reason="needs a CUDA GPU (sizes too big for the interpreter)")


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["separate", "tl-dq", "gluon-dq", "tl-kv", "atomic", "ds"])
def test_gpu_multiblock(dtype, causal, mode, monkeypatch):
    # "separate": the default kernels (Gluon dK/dV and dQ on sm_90 for bf16/fp16 at head dim 128, else tl);
    # "tl-dq": the tl dQ kernel, which still serves broadcast-Q, fp32, head dim 64 and other GPUs; "gluon-dq":
    # the Gluon one asked for (also at 64); "tl-kv": the tl dK/dV kernel (the default before v17) at every
    # head dim; "atomic": dQ fused into the dK/dV kernel; "ds": dQ read back from dS
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_DQ_MODE", mode if mode in ("atomic", "ds") else "separate")
    monkeypatch.setattr(jfa, "BWD_Q_KERNEL", {"tl-dq": "triton", "gluon-dq": "gluon"}.get(mode, "auto"))
    monkeypatch.setattr(jfa, "BWD_KV_KERNEL", "triton" if mode == "tl-kv" else "auto")
    gluon_ok = not _GLUON_WHY and dtype != torch.float32
    for lens_q, lens_k, heads, d in (([300, 0, 513, 129, 64, 700], [257, 5, 513, 400, 0, 200], (4, 2), 128),
                                     ([129, 384], [700, 1], (2, 2), 64)):
        run_case(lens_q, lens_k, hq=heads[0], hkv=heads[1], d=d, causal=causal, dtype=dtype)
        # "auto" runs the Gluon dK/dV kernel where it can, at 128, beside a separate dQ; else tl, silently
        gluon_kv = gluon_ok and d == 128 and mode not in ("tl-kv", "atomic", "ds")
        assert jfa.LAST_BWD_KV_PATH == ("gluon" if gluon_kv else "triton"), (d, jfa.LAST_BWD_KV_PATH)
        if mode == "ds":
            assert jfa.LAST_BWD_DQ_PATH == "ds", jfa.LAST_BWD_DQ_PATH
        elif mode != "atomic":
            # ("tl-kv" pins the dK/dV kernel only: dQ stays "auto")
            gluon_dq = gluon_ok and (mode == "gluon-dq" or (mode in ("separate", "tl-kv") and d == 128))
            path = jfa.LAST_BWD_DQ_PATH
            if mode == "gluon-dq" and not gluon_dq:  # asked for by name: says why not
                assert path.startswith("separate (gluon: "), (d, path)
            else:  # "auto" falls back silently; "triton" asks for it
                assert path == ("gluon" if gluon_dq else "separate"), (d, path)


def check_grads_beside_a_poisoned_sequence(poison, *, poisoned_first, d, names, tol, dtype=torch.bfloat16):
    """Two sequences of 150 and 140 rows, one filled with inf or NaN (Q, K, V and dO): the clean one's
    gradients ``names`` must be finite and match the float64 reference.  Ragged blocks of either
    sequence read or write rows of the other, so this finds a kernel that lets them leak."""
    la, lb = 150, 140
    q, k, v, cu_q, cu_k = make_inputs([la, lb], [la, lb], 2, 2, d, d, dtype, seed=4)
    do = torch.randn(la + lb, 2, d, generator=torch.Generator().manual_seed(5)).to(dtype)
    bad, good = (slice(0, la), slice(la, None)) if poisoned_first else (slice(la, None), slice(0, la))
    for t in (q, k, v, do):
        t[bad] = float(poison)
    qd, kd, vd = (t.to(DEVICE).requires_grad_() for t in (q, k, v))
    out, _ = jagged_flash_attention(qd, kd, vd, cu_q.to(DEVICE), cu_k.to(DEVICE), la, la)
    out.backward(do.to(DEVICE))
    q64, k64, v64 = (t[good].detach().double().requires_grad_() for t in (q, k, v))
    n = q64.shape[0]
    cu = torch.tensor([0, n], dtype=torch.int32)
    ref_o, _ = reference(q64, k64, v64, cu, cu, False, 1 / math.sqrt(d), False)
    ref_o.backward(do[good].double())
    grads = {"dq": (qd.grad, q64.grad), "dk": (kd.grad, k64.grad), "dv": (vd.grad, v64.grad)}
    for name in names:
        got, want = grads[name]
        got = got[good].cpu()
        assert torch.isfinite(got).all(), name
        assert rel(got, want) < tol, name


@needs_cuda
@pytest.mark.parametrize("reduce", ["tma", "element"])
@pytest.mark.parametrize("poison", ["inf", "nan"])
def test_gpu_atomic_dq_keeps_sequences_apart(reduce, poison, monkeypatch):
    """The fused dQ adds whole blocks: a ragged last block's rows past its sequence land on the next
    sequence's rows and must add nothing there, even when this sequence's inputs are not finite."""
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_DQ_MODE", "atomic")
    monkeypatch.setattr(jfa, "BWD_DQ_REDUCE", reduce)
    check_grads_beside_a_poisoned_sequence(poison, poisoned_first=True, d=128, names=("dq", "dk", "dv"),
                                           tol=2 * TOL[torch.bfloat16])
    want_path = "atomic-tma" if reduce == "tma" and _HAS_SM90 else "atomic-element"
    assert jfa.LAST_BWD_DQ_PATH == want_path, jfa.LAST_BWD_DQ_PATH


@needs_cuda
@pytest.mark.parametrize("poison", ["inf", "nan"])
@pytest.mark.parametrize("poisoned_first", [True, False])
def test_gpu_ds_dq_keeps_sequences_apart(poison, poisoned_first, monkeypatch):
    """Each sequence's dS has its own part of the workspace: a poisoned neighbour must not reach it."""
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_DQ_MODE", "ds")
    check_grads_beside_a_poisoned_sequence(poison, poisoned_first=poisoned_first, d=128, names=("dq", "dk", "dv"),
                                           tol=2 * TOL[torch.bfloat16])
    assert jfa.LAST_BWD_DQ_PATH == "ds", jfa.LAST_BWD_DQ_PATH


@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["separate", "ds"])
def test_gpu_broadcast_multiblock(causal, mode, monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_DQ_MODE", mode)
    run_case([256], [300, 0, 1, 513, 64, 200, 999, 128] * 3, hq=4, hkv=4, d=128, causal=causal,
             dtype=torch.bfloat16, broadcast=True)


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
        from kernels import jfa
        # the dQ modes that serve every problem (the atomic one yields to broadcast-Q)
        dq_mode = data.draw(st.sampled_from(["separate", "ds"]), label="dq_mode")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(jfa, "BWD_DQ_MODE", dq_mode)
            run_case(lens_q, lens_k, hq=hq, hkv=hkv, d=d, dtype=dtype, causal=causal, broadcast=broadcast,
                     seed=data.draw(st.integers(0, 1000), label="seed"))


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
    out, lse = jagged_flash_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cu.to(DEVICE),
                                      cu.to(DEVICE), 29, 29, causal=True)
    ref, ref_l = reference(q.double(), k.double(), v.double(), cu, cu, True, 1 / math.sqrt(D), False)
    assert rel(out.cpu(), ref) < TOL[torch.float32]


# ---------------------------------------------------------------------------
# forward K/V load paths: TMA descriptors and advanced pointers (off by
# default) must give the pointer path's answers
# ---------------------------------------------------------------------------
def _tma_probe():
    """'' if this process can run the TMA forward (GPU sm_90+ or the
    interpreter), else the reason."""
    if not (_HAS_CUDA or INTERPRET):
        return "needs CUDA or TRITON_INTERPRET=1"
    from kernels import jfa
    k = torch.zeros(8, 2, 16, device=DEVICE)
    _, _, why = jfa._fwd_descs(k, k, 16)
    return why


_TMA_WHY = _tma_probe()
needs_tma = pytest.mark.skipif(bool(_TMA_WHY), reason=f"TMA forward cannot run here: {_TMA_WHY}")
FWD_PATHS = [pytest.param("tma", marks=needs_tma), "ptr-adv"]


@pytest.fixture
def fwd_path(request, monkeypatch):
    # the tl forward's load paths: pinned to the tl kernel (the default sends long sequences to Gluon on sm_90)
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_KERNEL", "triton")
    monkeypatch.setattr(jfa, "FWD_TMA", request.param == "tma")
    monkeypatch.setattr(jfa, "FWD_PTR_ADVANCE", request.param == "ptr-adv")
    return request.param


def _ran(path):
    from kernels import jfa
    assert jfa.LAST_FWD_PATH == path, jfa.LAST_FWD_PATH


@needs_kernels
@pytest.mark.parametrize("fwd_path", FWD_PATHS, indirect=True)
@pytest.mark.parametrize("dtype", FP)
def test_fwd_path_jagged_causal_gqa(fwd_path, dtype):
    # empty sequences, lengths off the block grid, Lq > Lk and Lq < Lk, GQA
    run_case([40, 12, 0, 7, 33, 5], [9, 50, 6, 0, 33, 1], dtype=dtype, d=32, causal=True, hq=4, hkv=2)
    _ran(fwd_path)
    run_case([5, 0, 37, 3, 0, 20], [9, 4, 30, 0, 0, 41], dtype=dtype, d=32, hq=4, hkv=2)
    _ran(fwd_path)


@needs_kernels
@pytest.mark.parametrize("fwd_path", FWD_PATHS, indirect=True)
@pytest.mark.parametrize("dtype", FP)
def test_fwd_path_broadcast_and_dv(fwd_path, dtype):
    run_case([40], [50, 0, 13, 64, 1], broadcast=True, causal=True, dtype=dtype, hq=2, hkv=1)
    _ran(fwd_path)
    run_case([9, 21], [14, 30], d=16, dv=32, causal=True, dtype=dtype)
    _ran(fwd_path)
    run_case([5, 18], [19, 3], d=64, dv=16, hq=4, hkv=2, dtype=dtype)
    _ran(fwd_path)


@needs_kernels
@pytest.mark.parametrize("fwd_path", FWD_PATHS, indirect=True)
def test_fwd_path_gpu_block_shapes(fwd_path, monkeypatch):
    # the H200 D=128 forward tile (BLOCK_M 128, BLOCK_N 32) on multi-block lengths
    from kernels import jfa
    monkeypatch.setattr(jfa, "CONFIG_OVERRIDE", {"fwd": jfa._GPU_CFG[128]["fwd"]})
    run_case([300, 0, 129, 64], [257, 5, 400, 0], hq=2, hkv=1, d=16, causal=True, dtype=torch.float16)
    _ran(fwd_path)


def _fwd_only(q, k, v, cu_q, cu_k, causal, broadcast=False):
    lq = [int(x) for x in torch.diff(cu_q)]
    lk = [int(x) for x in torch.diff(cu_k)]
    out, lse = jagged_flash_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cu_q.to(DEVICE),
                                      cu_k.to(DEVICE), max(lq), max(lk), causal=causal,
                                      broadcast_q=broadcast)
    return out.cpu(), lse.cpu()


@needs_kernels
@pytest.mark.parametrize("fwd_path", FWD_PATHS + ["ptr"], indirect=True)
@pytest.mark.parametrize("poison", ["huge", "inf", "nan"])
@pytest.mark.parametrize("causal", [False, True])
# the interpreter computes the masked-out lanes too, in numpy, which warns on the poison it meets there
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                            "ignore:All-NaN slice encountered:RuntimeWarning")
def test_fwd_rows_past_lk_never_leak(fwd_path, poison, causal):
    """The key rows just past a sequence's end are the next sequence's: TMA
    reads them (only the tensor end is zero-filled).  Whatever they hold, the
    first sequence's output and LSE must be those of that sequence alone."""
    # 21: ragged against every block size used here
    _first_sequence_alone(21, 40, 32, torch.float16, poison, causal, poisoned=("k", "v"))
    if fwd_path != "ptr":
        _ran(fwd_path)


def _first_sequence_alone(la, lb, d, dtype, poison, causal, poisoned):
    """Two sequences; the second's ``poisoned`` tensors hold ``poison``; the first sequence's output
    and LSE must be finite and those of that sequence alone."""
    q, k, v, cu_q, cu_k = make_inputs([la, lb], [la, lb], 2, 2, d, d, dtype, seed=4)
    bad = {"huge": 6.0e4, "inf": float("inf"), "nan": float("nan")}[poison]
    for name, t in (("q", q), ("k", k), ("v", v)):
        if name in poisoned:
            t[la:] = bad
    out, lse = _fwd_only(q, k, v, cu_q, cu_k, causal)
    cu_a = torch.tensor([0, la], dtype=torch.int32)
    ref_o, ref_l = reference(q[:la].double(), k[:la].double(), v[:la].double(), cu_a, cu_a, causal,
                             1 / math.sqrt(d), False)
    assert torch.isfinite(out[:la]).all() and torch.isfinite(lse[:, :la]).all()
    assert rel(out[:la], ref_o) < TOL[dtype]
    assert (lse[:, :la].double() - ref_l).abs().max().item() < LSE_TOL[dtype]


@needs_kernels
@needs_tma
@pytest.mark.parametrize("dtype", FP)
def test_tma_fallback_on_unaligned_layouts(dtype, monkeypatch):
    """Layouts TMA cannot describe fall back to the pointer path (and say why);
    a strided-row view that TMA can describe uses TMA.  All match the reference."""
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_KERNEL", "triton")
    monkeypatch.setattr(jfa, "FWD_TMA", True)
    lens = [13, 0, 29]
    T, H, D = sum(lens), 2, 16
    cu = torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32)
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(T, H, D, generator=gen).to(dtype)
    esz = q.element_size()
    flat = torch.randn(T * H * D + 16, generator=gen).to(dtype)
    wide = torch.randn(T, H, 2 * D, generator=gen).to(dtype)
    odd = torch.randn(T, 1, D + 2, generator=gen).to(dtype)   # row stride (D + 2) * esz
    qkv = torch.randn(T, 3, H, D, generator=gen).to(dtype)
    cases = [
        # (k, v, q heads, expected path)
        (flat[1:1 + T * H * D].view(T, H, D), None, H, "ptr (k: base not 16-byte aligned)"),
        (wide[..., :D], None, H, "ptr (k: heads and head dim do not merge into one row (strided heads))"),
        (qkv[:, 1], qkv[:, 2], H, "tma"),
    ]
    if ((D + 2) * esz) % 16:
        cases.append((odd[..., :D], None, 1, "ptr (k: row stride not a multiple of 16 bytes)"))
    for k, v, hq, expect in cases:
        v = k if v is None else v
        qh = q[:, :hq]
        out, lse = _fwd_only(qh, k, v, cu, cu, causal=True)
        assert jfa.LAST_FWD_PATH == expect, (jfa.LAST_FWD_PATH, expect)
        ref, _ = reference(qh.double(), k.double(), v.double(), cu, cu, True, 1 / math.sqrt(D), False)
        assert rel(out, ref) < TOL[dtype], expect


@needs_cuda
@pytest.mark.skipif(bool(_TMA_WHY), reason=f"TMA forward cannot run here: {_TMA_WHY}")
@pytest.mark.parametrize("cfg", [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2),
                                 (64, 64, 4, 3), (128, 32, 4, 4)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_tma_multiblock(cfg, dtype, causal, monkeypatch):
    # the tiles kernels/sweep.py times with TMA, on multi-block jagged lengths
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_KERNEL", "triton")
    monkeypatch.setattr(jfa, "FWD_TMA", True)
    monkeypatch.setattr(jfa, "CONFIG_OVERRIDE", {"fwd": cfg})
    run_case([300, 0, 513, 129, 64, 700], [257, 5, 513, 400, 0, 200], hq=4, hkv=2, d=128,
             causal=causal, dtype=dtype)
    _ran("tma")
    run_case([256], [300, 0, 1, 513, 64, 200], hq=4, hkv=4, d=128, causal=causal, dtype=dtype,
             broadcast=True)
    _ran("tma")


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_warp_specialized_forward(dtype, causal, monkeypatch):
    # Opt-in variant: if this Triton cannot warp-specialize the loop on this GPU, say so; if it can, the
    # answer must be the same as every other path's.
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_KERNEL", "triton")
    monkeypatch.setattr(jfa, "FWD_WARP_SPECIALIZE", True)
    try:
        run_case([300, 0, 513, 129, 64, 700], [257, 5, 513, 400, 0, 200], hq=4, hkv=2, d=128,
                 causal=causal, dtype=dtype)
    except Exception as exc:  # a compiler failure, not a wrong answer
        if "assert" in type(exc).__name__.lower():
            raise
        pytest.skip(f"this Triton does not warp-specialize the forward here: {type(exc).__name__}: {str(exc)[:200]}")


# ---------------------------------------------------------------------------
# persistent grids (off by default): the same tiles through static per-program
# lists must give bitwise the sorted grid's answers, with every tile run once
# ---------------------------------------------------------------------------
GRID_CASES = [
    # (lens_q, lens_k, hq, hkv, causal, broadcast): empty sequences, Lq != Lk, GQA, more items
    # than the persistent programs (so programs loop), and a sequence with queries but no keys
    ([40, 0, 33, 7, 64, 19], [9, 50, 33, 0, 64, 80], 4, 2, True, False),
    ([40, 0, 33, 7, 64, 19], [9, 50, 33, 0, 64, 80], 2, 1, False, False),
    ([21], [30, 0, 1, 45, 16], 2, 2, True, True),
]


def _fwd_bwd(case, seed=3, d=16, dtype=torch.float32):
    lens_q, lens_k, hq, hkv, causal, broadcast = case
    q, k, v, cu_q, cu_k = make_inputs(lens_q, lens_k, hq, hkv, d, d, dtype, broadcast, seed)
    q, k, v = (t.to(DEVICE).requires_grad_() for t in (q, k, v))
    out, lse = jagged_flash_attention(q, k, v, cu_q.to(DEVICE), cu_k.to(DEVICE), max(lens_q), max(lens_k),
                                      causal=causal, broadcast_q=broadcast)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype))
    return [t.detach().cpu() for t in (out, lse, q.grad, k.grad, v.grad)]


@needs_kernels
@pytest.mark.parametrize("case", GRID_CASES)
@pytest.mark.parametrize("fwd_grid,kv_grid", [("persistent", "sorted"), ("sorted", "persistent"),
                                              ("persistent", "persistent")])
def test_persistent_grids_match_sorted_bitwise(case, fwd_grid, kv_grid, monkeypatch):
    from kernels import jfa
    expected = _fwd_bwd(case)
    monkeypatch.setattr(jfa, "FWD_GRID", fwd_grid)
    monkeypatch.setattr(jfa, "BWD_KV_GRID", kv_grid)
    monkeypatch.setattr(jfa, "PERSISTENT_CTAS_PER_SM", 1)  # few programs: each runs several items
    got = _fwd_bwd(case)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, expected):
        assert torch.equal(a, b), name


@needs_kernels
def test_persistent_grids_also_match_the_reference(monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_GRID", "persistent")
    monkeypatch.setattr(jfa, "BWD_KV_GRID", "persistent")
    run_case([40, 0, 33, 7, 64, 19], [9, 50, 33, 0, 64, 80], hq=4, hkv=2, causal=True, dtype=torch.float16)


def test_persistent_schedule_lists_cover_every_item_once(monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_GRID", "persistent")
    monkeypatch.setattr(jfa, "BWD_KV_GRID", "persistent")
    lens_q = np.array([40, 0, 33, 7, 64, 19])
    lens_k = np.array([9, 50, 33, 0, 64, 80])
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in (lens_q, lens_k))
    cfgs = jfa.LaunchConfig(jfa._CPU_CFG["fwd"], jfa._CPU_CFG["kv"], jfa._CPU_CFG["q"], False, "triton", "", None)
    s = jfa._build_schedule(cu_q, cu_k, lens_q, lens_k, False, True, cfgs, 4, 2, torch.device("cpu"),
                               row_bytes=256)
    n_fwd, n_kv = s["fwd"][2] * 4, s["kv"][2] * 2
    ptr, items, n_programs = s["fwd_persistent"]
    assert n_programs == min(n_fwd, 2 * jfa._num_sms(torch.device("cpu")))
    assert ptr[0] == 0 and ptr[-1] == n_fwd and bool((ptr.diff() >= 0).all())
    assert sorted(items.tolist()) == list(range(n_fwd))
    items, n_items, n_programs = s["kv_persistent"]
    assert n_items == n_kv and sorted(items.tolist()) == list(range(n_kv))
    # block-innermost: consecutive items of one (sequence, kv head) are consecutive key blocks
    seq, blk = s["kv"][0][items // 2], s["kv"][1][items // 2]
    for i in range(n_kv - 1):
        if seq[i] == seq[i + 1] and items[i] % 2 == items[i + 1] % 2:
            assert blk[i + 1] == blk[i] + 1


@pytest.mark.parametrize("name,value", [("FWD_GRID", "zigzag"), ("BWD_KV_GRID", None),
                                        ("PERSISTENT_CTAS_PER_SM", 0), ("GLUON_GRID", "persistant")])
def test_bad_grid_switch_is_a_clear_error(name, value, monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, name, value)
    with pytest.raises(ValueError, match=name):
        jfa._grids()


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_persistent_grids(dtype, causal, monkeypatch):
    # the shipped GPU tiles on multi-block lengths, both grids persistent
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_GRID", "persistent")
    monkeypatch.setattr(jfa, "BWD_KV_GRID", "persistent")
    run_case([300, 0, 513, 129, 64, 700], [257, 5, 513, 400, 0, 200], hq=4, hkv=2, d=128,
             causal=causal, dtype=dtype)
    run_case([256], [300, 0, 1, 513, 64, 200] * 40, hq=4, hkv=4, d=128, causal=causal, dtype=dtype,
             broadcast=True)


# ---------------------------------------------------------------------------
# launch order of the sorted grids' items (jfa.ITEM_ORDER): a permutation that never changes an answer
# ---------------------------------------------------------------------------
@needs_kernels
@pytest.mark.parametrize("order", ["sequence", "section"])
@pytest.mark.parametrize("case", GRID_CASES)
def test_launch_orders_match_work_order_bitwise(case, order, monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "ITEM_ORDER", "work")
    expected = _fwd_bwd(case)
    monkeypatch.setattr(jfa, "ITEM_ORDER", order)
    monkeypatch.setattr(jfa, "SECTION_BYTES", 4096)  # a few pairs per section at these sizes
    got = _fwd_bwd(case)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, expected):
        assert torch.equal(a, b), name


def test_sequence_major_items_group_each_sequence_and_head():
    lens = np.array([300, 0, 513, 129, 513, 1])
    seq, blk, work = sched.forward_tiles(lens, lens, 128, True)
    seq, blk, work = sched.sort_by_work(seq, blk, work=work)
    items = sched.sequence_major_items(seq, work, 3)
    assert sorted(items.tolist()) == list(range(seq.shape[0] * 3))
    pair = seq[items // 3] * 3 + items % 3
    # each (sequence, head) pair is one contiguous run, heaviest tile first within it
    runs = [pair[0]] + [b for a, b in zip(pair[:-1], pair[1:]) if a != b]
    assert len(runs) == len(set(runs)) == 5 * 3
    for p in set(runs):
        w = work[items[pair == p] // 3]
        assert (np.diff(w) <= 0).all()
    # sequences by total work: the two 513-long ones (equal work, lower index first), then 300, 129, 1
    assert [r // 3 for r in runs[::3]] == [2, 4, 0, 3, 5]
    # the work order keeps the same q block of every pair side by side: more pairs per window
    work_order = np.arange(seq.shape[0] * 3)
    assert (sched.distinct_sequences_in_flight(items, seq, 3, 4)
            < sched.distinct_sequences_in_flight(work_order, seq, 3, 4))


def test_sectioned_items_cut_pairs_by_rows_and_go_heaviest_first_inside():
    lens = np.array([300, 0, 513, 129, 513, 1])
    seq, blk, work = sched.forward_tiles(lens, lens, 128, True)
    seq, blk, work = sched.sort_by_work(seq, blk, work=work)
    items = sched.sectioned_items(seq, work, 2, lens, 1100)
    assert sorted(items.tolist()) == list(range(seq.shape[0] * 2))
    pair = seq[items // 2] * 2 + items % 2
    # pairs in sequence-major order: (2,0) (2,1) (4,0) (4,1) (0,0) (0,1) (3,0) (3,1) (5,0) (5,1);
    # rows 513 each for the first four, so 1100 rows hold two of them; then 300+300+129+129+1 = 859 < 1100
    sections = [{4, 5}, {8, 9}, {0, 1, 6, 7, 10, 11}]
    start = 0
    for members in sections:
        n = sum(int((pair == p).sum()) for p in members)
        assert set(pair[start:start + n].tolist()) == members
        assert (np.diff(work[items[start:start + n] // 2]) <= 0).all()  # heaviest first inside
        start += n
    assert start == items.shape[0]
    # a budget smaller than any pair: one pair per section, i.e. the sequence-major order
    one = sched.sectioned_items(seq, work, 2, lens, 1)
    assert one.tolist() == sched.sequence_major_items(seq, work, 2).tolist()
    # a budget larger than everything: one section, i.e. heaviest tile first (ties by pair)
    all_ = sched.sectioned_items(seq, work, 2, lens, 10 ** 9)
    assert (np.diff(work[all_ // 2]) <= 0).all()
    assert sched.sectioned_items([], [], 2, lens, 10).shape == (0,)
    with pytest.raises(ValueError, match="section_rows"):
        sched.sectioned_items(seq, work, 2, lens, 0)


def test_sectioned_order_is_the_sequence_order_when_a_pairs_tiles_weigh_the_same():
    # full non-causal tiles of one sequence all weigh the same (bench shapes S2 and S4a): heaviest-first
    # inside a section then keeps sequence-major order (PERF.md v8 uses this to read the bench's noise)
    lens = np.array([768, 256, 512, 128, 1024, 512])
    seq, blk, work = sched.forward_tiles(lens, lens, 128, False)
    seq, blk, work = sched.sort_by_work(seq, blk, work=work)
    assert (sched.sectioned_items(seq, work, 4, lens, 2000).tolist()
            == sched.sequence_major_items(seq, work, 4).tolist())


def test_sectioned_order_removes_the_sequence_orders_tail_on_long_causal_sequences():
    # 8 causal sequences of 4096, 16 heads (bench shape S4b): the list-scheduling model puts the
    # sequence order several % above the lower bound, the sectioned order within 1%
    lens = np.full(8, 4096)
    seq, blk, work = sched.forward_tiles(lens, lens, 128, True)
    seq, blk, work = sched.sort_by_work(seq, blk, work=work)

    def tail(items):
        w = work[items // 16]
        return sched.list_schedule_makespan(w, 264) / max(w.sum() / 264, w.max())
    sequence = sched.sequence_major_items(seq, work, 16)
    sectioned = sched.sectioned_items(seq, work, 16, lens, 32768)
    assert tail(sequence) > 1.05 and tail(sectioned) < 1.01
    assert (sched.distinct_sequences_in_flight(sectioned, seq, 16, 264)
            < sched.distinct_sequences_in_flight(np.arange(seq.shape[0] * 16), seq, 16, 264) / 4)


def test_launch_order_switch_reaches_the_schedule(monkeypatch):
    # the schedule cache keys on the order: switching it must change the lists the kernels get
    from kernels import jfa
    lens_q, lens_k = np.array([40, 0, 33, 7, 64, 19]), np.array([9, 50, 33, 0, 64, 80])
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in (lens_q, lens_k))
    cfgs = jfa.LaunchConfig(jfa._CPU_CFG["fwd"], jfa._CPU_CFG["kv"], jfa._CPU_CFG["q"], False, "triton", "", None)

    def build(order):
        monkeypatch.setattr(jfa, "ITEM_ORDER", order)
        return jfa._build_schedule(cu_q, cu_k, lens_q, lens_k, False, True, cfgs, 4, 2, torch.device("cpu"),
                               row_bytes=256)
    work = build("work")
    assert work["fwd_items"] is None and work["kv_items"] is None and work["q_items"] is None
    for order in ("sequence", "section"):
        got = build(order)
        for key, heads, tiles in (("fwd_items", 4, "fwd"), ("kv_items", 2, "kv"), ("q_items", 4, "q")):
            n = got[tiles][-1 if tiles != "q" else 4] * heads
            assert sorted(got[key].tolist()) == list(range(n)) and got[key].tolist() != list(range(n)), key
    monkeypatch.setattr(jfa, "SECTION_BYTES", 1)  # one pair per section: the sequence order again
    assert build("section")["fwd_items"].tolist() == build("sequence")["fwd_items"].tolist()


def test_list_schedule_makespan():
    assert sched.list_schedule_makespan([4, 1, 1, 1, 1], 2) == 4  # heaviest first: the light ones fill in
    assert sched.list_schedule_makespan([1, 1, 1, 1, 4], 2) == 6  # heaviest last: it finishes late
    assert sched.list_schedule_makespan([5], 4) == 5 and sched.list_schedule_makespan([], 4) == 0.0
    with pytest.raises(ValueError, match="n_slots"):
        sched.list_schedule_makespan([1], 0)


def test_sequence_major_items_of_nothing():
    assert sched.sequence_major_items([], [], 4).shape == (0,)
    assert sched.sequence_major_items([0, 0], [5, 3], 0).shape == (0,)


def test_bad_item_order_is_a_clear_error(monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "ITEM_ORDER", "random")
    with pytest.raises(ValueError, match="ITEM_ORDER"):
        jfa._grids()
    monkeypatch.setattr(jfa, "ITEM_ORDER", "section")
    monkeypatch.setattr(jfa, "SECTION_BYTES", 0)
    with pytest.raises(ValueError, match="SECTION_BYTES"):
        jfa._grids()


@needs_cuda
@pytest.mark.parametrize("order", ["sequence", "section"])
@pytest.mark.parametrize("fwd_kernel", ["triton", "gluon"])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_launch_orders(fwd_kernel, causal, order, monkeypatch):
    # the shipped GPU tiles (and the Gluon forward where it runs) on multi-block lengths and GQA,
    # against the reference and bitwise against the work order
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_KERNEL", fwd_kernel)
    monkeypatch.setattr(jfa, "SECTION_BYTES", 1 << 18)  # several sections at these sizes
    case = ([300, 0, 513, 129, 64, 700], [257, 5, 513, 400, 0, 200], 4, 2, causal, False)
    monkeypatch.setattr(jfa, "ITEM_ORDER", order)
    run_case(case[0], case[1], hq=4, hkv=2, d=128, causal=causal, dtype=torch.bfloat16)
    got = _fwd_bwd(case, d=128, dtype=torch.bfloat16)
    monkeypatch.setattr(jfa, "ITEM_ORDER", "work")
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, _fwd_bwd(case, d=128, dtype=torch.bfloat16)):
        assert torch.equal(a, b), name


# ---------------------------------------------------------------------------
# the Gluon forward (sm_90 only, opt-in via jfa.FWD_KERNEL): the float64 reference's answers on
# every shape class it accepts; elsewhere the tl kernel runs and says why
# ---------------------------------------------------------------------------
def _gluon_probe():
    if not _HAS_CUDA:
        return "needs a CUDA GPU"
    from kernels import jfa
    t = torch.zeros(8, 2, 128, device=DEVICE, dtype=torch.bfloat16)
    return jfa._gluon_refusal(t, t, t)


_GLUON_WHY = _gluon_probe()
needs_gluon = pytest.mark.skipif(bool(_GLUON_WHY), reason=f"the Gluon forward cannot run here: {_GLUON_WHY}")

def run_gluon_case(case, causal, monkeypatch, **switches):
    """GLUON_CASES[case] under the given jfa switches, on three programs so that each takes many items
    (rings, double buffers and item hand-offs running on across items); fp16 for case 2, else bf16."""
    from kernels import jfa
    for name, value in switches.items():
        monkeypatch.setattr(jfa, name, value)
    monkeypatch.setattr(jfa, "_num_sms", lambda device: 3)
    lens_q, lens_k, hq, hkv, d, dv, broadcast = GLUON_CASES[case]
    dtype = torch.float16 if case == 2 else torch.bfloat16
    return run_case(lens_q, lens_k, hq=hq, hkv=hkv, d=d, dv=dv, causal=causal, dtype=dtype, broadcast=broadcast)


GLUON_CASES = [
    # (lens_q, lens_k, hq, hkv, d, dv, broadcast): tiles whose second 64-row half is empty (64, 1, 65),
    # no keys, Lq > Lk and Lq < Lk, ragged tails against BLOCK_N 128, GQA, Dv != D
    ([300, 0, 513, 129, 64, 700, 1, 65], [257, 5, 513, 400, 0, 200, 1, 64], 4, 2, 128, 128, False),
    ([256], [300, 0, 1, 513, 64, 200, 129], 4, 4, 128, 128, True),
    ([200, 7, 130], [190, 300, 1], 2, 1, 64, 64, False),
    ([100, 257], [129, 80], 2, 2, 128, 64, False),
]


@needs_gluon
@pytest.mark.parametrize("case", range(len(GLUON_CASES)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_gluon_forward(case, dtype, causal, monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_KERNEL", "gluon")
    lens_q, lens_k, hq, hkv, d, dv, broadcast = GLUON_CASES[case]
    run_case(lens_q, lens_k, hq=hq, hkv=hkv, d=d, dv=dv, causal=causal, dtype=dtype, broadcast=broadcast)
    _ran("gluon")


@needs_gluon
@pytest.mark.parametrize("scale", [0.01, 2.0])
def test_gpu_gluon_forward_scales(scale, monkeypatch):
    # the scale is folded into one FMA per score after the row maximum: flat and sharp softmaxes
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_KERNEL", "gluon")
    run_case([150, 40], [300, 129], hq=2, hkv=2, d=64, causal=False, dtype=torch.float16, scale=scale)
    _ran("gluon")
    run_case([150, 40], [300, 129], hq=2, hkv=2, d=64, causal=True, dtype=torch.float16, scale=scale,
             idx=torch.int64)
    _ran("gluon")


@needs_gluon
@pytest.mark.parametrize("poison", ["huge", "inf", "nan"])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_gluon_rows_past_lk_never_leak(poison, causal, monkeypatch):
    """TMA reads the next sequence's rows past a ragged end; the loader zeroes those value rows
    and the scores are masked, so nothing they hold may reach the first sequence."""
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_KERNEL", "gluon")
    # 150: a full 128-key block and a ragged one; the second tile's q rows past 150 are read too
    _first_sequence_alone(150, 140, 64, torch.bfloat16, poison, causal, poisoned=("q", "k", "v"))
    _ran("gluon")


@needs_gluon
@pytest.mark.parametrize("stages, grid, order, block_m", [
    (1, "persistent", "plain", 32), (3, "persistent", "plain", 32), (2, "dynamic", "plain", 32),
    (2, "sorted", "plain", 32), (2, "persistent", "overlap", 32), (3, "dynamic", "overlap", 32),
    (3, "sorted", "overlap", 32),
    (2, "dynamic", "plain", 64), (1, "persistent", "plain", 64), (2, "sorted", "overlap", 64)])
@pytest.mark.parametrize("case", range(len(GLUON_CASES)))
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_gluon_backward(case, causal, stages, grid, order, block_m, monkeypatch):
    # the Gluon dK/dV kernel against the float64 reference's gradients, on few programs so that each
    # claims many items (ring, K/V double buffer and item hand-off running on across items); the ring
    # depth matters: a separate unmasked path went wrong from two stages on when D == Dv (PERF.md v11)
    from kernels import jfa
    run_gluon_case(case, causal, monkeypatch, BWD_KV_KERNEL="gluon", GLUON_BWD_STAGES=stages, GLUON_BWD_ORDER=order,
                   GLUON_GRID=grid, GLUON_BWD_BLOCK_M=block_m)
    assert jfa.LAST_BWD_KV_PATH == "gluon", jfa.LAST_BWD_KV_PATH


@needs_gluon
@pytest.mark.parametrize("case", range(len(GLUON_CASES)))
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_gluon_tma_stores_write_what_masked_stores_do(case, causal, monkeypatch):
    # jfa.GLUON_TMA_STORE_KERNELS: whole 64-row tiles of O, dK / dV and dQ leave by TMA stores from freed
    # shared buffers, ragged ones by masked stores; every case has ragged tiles and empty halves (case 3 has
    # Dv != D, where the forward keeps masked stores).  Right against the reference, and the same bits as
    # masked stores throughout.
    from kernels import jfa
    kernels = dict(FWD_KERNEL="gluon", BWD_KV_KERNEL="gluon", BWD_Q_KERNEL="auto", GLUON_BWD_STAGES=3)
    out, lse, grads = run_gluon_case(case, causal, monkeypatch, GLUON_TMA_STORE_KERNELS=("forward", "backward"),
                                     **kernels)
    assert (jfa.LAST_FWD_PATH, jfa.LAST_BWD_KV_PATH) == ("gluon", "gluon")
    out_m, lse_m, grads_m = run_gluon_case(case, causal, monkeypatch, GLUON_TMA_STORE_KERNELS=(), **kernels)
    assert torch.equal(out, out_m) and torch.equal(lse, lse_m)
    for name in ("dq", "dk", "dv"):
        assert torch.equal(grads[name], grads_m[name]), name


@needs_gluon
@pytest.mark.parametrize("case", range(len(GLUON_CASES)))
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_gluon_register_operands_give_the_same_gradients(case, causal, monkeypatch):
    # jfa.GLUON_BWD_REG_OPERAND: K (dK/dV kernel) and Q (dQ kernel) as register operands of S^T / S instead of
    # shared-memory ones.  Right against the reference, and the same bits as without (the same products,
    # summed in the same order).
    from kernels import jfa
    kernels = dict(BWD_KV_KERNEL="gluon", BWD_Q_KERNEL="auto", GLUON_BWD_STAGES=3, GLUON_BWD_ORDER="plain")
    grads = run_gluon_case(case, causal, monkeypatch, GLUON_BWD_REG_OPERAND=True, **kernels)[2]
    assert jfa.LAST_BWD_KV_PATH == "gluon", jfa.LAST_BWD_KV_PATH
    plain = run_gluon_case(case, causal, monkeypatch, GLUON_BWD_REG_OPERAND=False, **kernels)[2]
    for name in ("dq", "dk", "dv"):
        assert torch.equal(grads[name], plain[name]), name


def test_kernels_readme_lists_every_environment_switch_with_its_default():
    # kernels/README.md's table of switches against the names and defaults jfa.py reads, so neither can
    # change without the other
    import re
    here = os.path.dirname(jfa.__file__)
    code = open(os.path.join(here, "jfa.py")).read()
    read = dict(re.findall(r'os\.environ\.get\("(JFA_\w+)", "([^"]*)"\)', code))
    readme = open(os.path.join(here, "README.md")).read()
    listed = dict(re.findall(r"^\| `(JFA_\w+)` \| `([^`]*)`", readme, re.M))
    assert len(read) >= 10 and listed == read


def test_dkdv_kernel_holds_k_in_registers_only_where_it_compiles_well():
    # Triton 3.6 for sm_90 with K in registers: plain order at 32-row blocks compiles clean; the overlapped
    # order and 64-row blocks serialize every wgmma (64 rows also ~100 spills), fused dQ ~50 spills
    # (tests/gluon_sm90_probe.py).  The switch on asks for it only there; off, never.
    base = jfa.BackwardSwitches("dynamic", 3, 0, 32, 0, "keys", 1, False, 2, True, True)
    assert jfa._dkdv_reg_operand(base, fuse_dq=False)
    assert not jfa._dkdv_reg_operand(base, fuse_dq=True)
    for change in (dict(gluon_bwd_order=1), dict(gluon_bwd_block_m=64), dict(reg_operand=False)):
        assert not jfa._dkdv_reg_operand(base._replace(**change), fuse_dq=False), change


@needs_gluon
@pytest.mark.parametrize("order, stages", [("overlap", 3), ("plain", 2)])
@pytest.mark.parametrize("case", range(len(GLUON_CASES)))
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_gluon_split_backward(case, causal, order, stages, monkeypatch):
    # BWD_KV_KERNEL "split" at 100 keys: every case has sequences on both sides, so the Gluon and the tl
    # dK/dV kernels each write their own sequences' rows in one backward
    from kernels import jfa
    run_gluon_case(case, causal, monkeypatch, BWD_KV_KERNEL="split", GLUON_BWD_SPLIT_KEYS=100, GLUON_BWD_ORDER=order,
                   GLUON_BWD_STAGES=stages)
    assert jfa.LAST_BWD_KV_PATH == "gluon+triton", jfa.LAST_BWD_KV_PATH


@needs_gluon
@pytest.mark.parametrize("grid", ["dynamic", "persistent", "sorted"])
@pytest.mark.parametrize("case", [c for c in range(len(GLUON_CASES)) if not GLUON_CASES[c][6]])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_gluon_dq(case, causal, grid, monkeypatch):
    # the Gluon dQ kernel against the float64 reference's gradients, on few programs so that each takes
    # many items (K/V ring and Q/dO double buffer running on across items); every dQ row has one writer,
    # so the answer is also bitwise the same on every grid
    from kernels import jfa
    grads = run_gluon_case(case, causal, monkeypatch, BWD_Q_KERNEL="gluon", GLUON_GRID=grid)[2]
    assert jfa.LAST_BWD_DQ_PATH == "gluon", jfa.LAST_BWD_DQ_PATH
    again = run_gluon_case(case, causal, monkeypatch, GLUON_GRID="sorted")[2]
    assert torch.equal(again["dq"], grads["dq"])


@needs_gluon
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("poison", ["inf", "nan"])
def test_gpu_gluon_dq_rows_past_the_end_never_leak(poison, d, monkeypatch):
    """A ragged last key block reads the next sequence's K and V rows, a ragged query tile its Q, dO (and,
    computing delta, O) rows: none of them may reach the first sequence's dQ, nor through delta its dK / dV
    (tl dK/dV kernel at 64, Gluon at 128)."""
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_Q_KERNEL", "gluon")
    check_grads_beside_a_poisoned_sequence(poison, poisoned_first=False, d=d, names=("dq", "dk", "dv"),
                                           tol=2 * TOL[torch.bfloat16])
    assert (jfa.LAST_BWD_DQ_PATH, jfa.LAST_BWD_DELTA_PATH) == ("gluon", "dq kernel")


@needs_gluon
@pytest.mark.parametrize("kv_kernel", ["gluon", "triton", "split"])
@pytest.mark.parametrize("case", range(len(GLUON_CASES)))
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_gluon_dq_kernel_computes_delta(case, causal, kv_kernel, monkeypatch):
    # jfa.GLUON_DQ_DELTA: the dQ kernel runs first and writes delta (and the Gluon dK/dV kernel's statistics)
    # in place of the preprocess pass, for whichever dK/dV kernels run after it; broadcast-Q (case 1) keeps
    # the preprocess pass.  Right against the reference both ways (delta's sum runs in another order, so the
    # bits may differ).
    from kernels import jfa
    kernels = dict(BWD_KV_KERNEL=kv_kernel, BWD_Q_KERNEL="gluon", GLUON_BWD_SPLIT_KEYS=100)
    broadcast = GLUON_CASES[case][6]
    for own in (True, False):
        run_gluon_case(case, causal, monkeypatch, GLUON_DQ_DELTA=own, **kernels)
        assert jfa.LAST_BWD_DELTA_PATH == ("dq kernel" if own and not broadcast else "preprocess")
        assert jfa.LAST_BWD_KV_PATH == {"gluon": "gluon", "triton": "triton", "split": "gluon+triton"}[kv_kernel]


@needs_gluon
def test_gpu_torch_compile_with_inductor_runs_the_gluon_kernels():
    # the default backend (inductor) on a GPU, at a size where every Gluon kernel runs: the same bits as eager
    from kernels import jfa
    torch._dynamo.reset()
    lens = [700, 129, 300]
    q, k, v, cu_q, cu_k = (t.to(DEVICE) for t in make_inputs(lens, lens, 4, 2, 128, 128, torch.bfloat16))
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).to(DEVICE)

    def model(a, b, c):
        return jagged_flash_attention(a, b, c, cu_q, cu_k, 700, 700, causal=True)
    runs = []
    for fn in (model, torch.compile(model, fullgraph=True)):
        a, b, c = (t.detach().clone().requires_grad_() for t in (q, k, v))
        out, lse = fn(a, b, c)
        runs.append((out, lse) + torch.autograd.grad(out, (a, b, c), do))
        # (700 keys: Gluon forward; 129 and 300: the tl forward)
        assert jfa.LAST_FWD_PATH.startswith("gluon+"), jfa.LAST_FWD_PATH
        assert (jfa.LAST_BWD_KV_PATH, jfa.LAST_BWD_DQ_PATH) == ("gluon", "gluon")
    assert all(torch.equal(x, y) for x, y in zip(*runs))


@needs_gluon
@pytest.mark.parametrize("mode", ["separate", "separate-64-rows", "separate-split", "atomic"])
def test_gpu_gluon_backward_runs_the_switches_its_forward_saw(mode, monkeypatch):
    # the same through the Gluon backward kernels, each switch away from its default (the fused dQ takes
    # 32-row blocks only)
    switches = dict(BWD_DQ_MODE=mode.split("-")[0], BWD_KV_KERNEL="gluon", BWD_Q_KERNEL="gluon", GLUON_BWD_STAGES=3,
                    GLUON_GRID="sorted", GLUON_DQ_STAGES=1)
    switches.update({"atomic": dict(GLUON_FUSED_DQ_SPLIT="dim", GLUON_FUSED_DQ_BUFFERS=2),
                     "separate": dict(GLUON_BWD_ORDER="overlap"),
                     "separate-64-rows": dict(GLUON_BWD_BLOCK_M=64, GLUON_BWD_STAGES=1),
                     "separate-split": dict(BWD_KV_KERNEL="split", GLUON_BWD_SPLIT_KEYS=20)}[mode])
    paths = check_backward_keeps_its_switches(monkeypatch, switches, 128, torch.bfloat16)
    assert paths == ("gluon+triton" if mode == "separate-split" else "gluon",
                     "atomic-gluon-dim" if mode == "atomic" else "gluon")


@needs_gluon
def test_gpu_gluon_fused_dq_refuses_64_row_blocks_with_its_reason(monkeypatch):
    # the fused dQ adds 32-row parts: with 64-row blocks asked for, the tl dK/dV kernel (with its own fused
    # dQ) answers and the path says why
    from kernels import jfa
    # (two stages: at three, 64-row blocks with the fused dQ's buffers do not fit sm_90's shared memory, a
    # ValueError before any refusal)
    run_gluon_case(0, True, monkeypatch, BWD_KV_KERNEL="gluon", BWD_DQ_MODE="atomic", GLUON_BWD_BLOCK_M=64,
                   GLUON_BWD_STAGES=2)
    assert jfa.LAST_BWD_KV_PATH == "triton (gluon: the Gluon dK/dV kernel fuses dQ with 32-row query blocks only)", \
        jfa.LAST_BWD_KV_PATH


@needs_gluon
@pytest.mark.parametrize("split", ["keys", "dim"])
@pytest.mark.parametrize("stages, grid, buffers", [(2, "dynamic", 1), (3, "persistent", 1), (1, "sorted", 1),
                                                   (2, "dynamic", 2), (1, "persistent", 2)])
@pytest.mark.parametrize("case", [c for c in range(len(GLUON_CASES)) if not GLUON_CASES[c][6]])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_gluon_fused_dq(case, causal, stages, grid, buffers, split, monkeypatch):
    # dQ fused into the Gluon dK/dV kernel (BWD_DQ_MODE "atomic" with BWD_KV_KERNEL "gluon"): every consumer
    # group adds its dQ^T parts by TMA reduce-adds; all three gradients against the float64 reference, on
    # few programs so that each takes many items
    from kernels import jfa
    run_gluon_case(case, causal, monkeypatch, BWD_KV_KERNEL="gluon", BWD_DQ_MODE="atomic", GLUON_FUSED_DQ_SPLIT=split,
                   GLUON_BWD_STAGES=stages, GLUON_GRID=grid, GLUON_FUSED_DQ_BUFFERS=buffers)
    ran = split if GLUON_CASES[case][4] == 128 else "keys"  # the head-dim split needs two 64-row halves
    assert (jfa.LAST_BWD_KV_PATH, jfa.LAST_BWD_DQ_PATH) == ("gluon", f"atomic-gluon-{ran}")


@needs_gluon
@pytest.mark.parametrize("split", ["keys", "dim"])
@pytest.mark.parametrize("poisoned_first", [True, False])
@pytest.mark.parametrize("poison", ["inf", "nan"])
@pytest.mark.parametrize("buffers", [1, 2])
def test_gpu_gluon_fused_dq_keeps_sequences_apart(buffers, poison, poisoned_first, split, monkeypatch):
    """The fused dQ adds whole [64, 32] dQ^T blocks: a ragged query block's columns past its sequence land
    on the next sequence's rows and must add nothing there; a ragged key block's rows past the end hold
    the next sequence's keys, which must not reach this sequence's dQ."""
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_KV_KERNEL", "gluon")
    monkeypatch.setattr(jfa, "BWD_DQ_MODE", "atomic")
    monkeypatch.setattr(jfa, "GLUON_FUSED_DQ_SPLIT", split)
    monkeypatch.setattr(jfa, "GLUON_FUSED_DQ_BUFFERS", buffers)
    check_grads_beside_a_poisoned_sequence(poison, poisoned_first=poisoned_first, d=128, names=("dq", "dk", "dv"),
                                           tol=2 * TOL[torch.bfloat16])
    assert jfa.LAST_BWD_DQ_PATH == f"atomic-gluon-{split}", jfa.LAST_BWD_DQ_PATH


@needs_kernels
@pytest.mark.parametrize("grid, want_counter", [("dynamic", True), ("sorted", False)])
def test_gluon_backward_launch_boxes(grid, want_counter, monkeypatch):
    # host side of both Gluon backward kernels: each tensor gets its own box rows and its head dim
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from kernels import jfa
    monkeypatch.setattr(jfa, "_num_sms", lambda device: 2)
    bf = dict(dtype=torch.bfloat16)
    q, k, v, do = (torch.zeros(300, 4, 128, **bf), torch.zeros(200, 2, 128, **bf), torch.zeros(200, 2, 64, **bf),
                   torch.zeros(300, 4, 64, **bf))
    unused = torch.zeros(1, dtype=torch.int32)
    descs, n_programs, dynamic, counter = jfa._gluon_backward_launch(q, k, v, do, (32, 64), 5, unused, grid)
    assert [list(d.block_shape) for d in descs] == [[32, 128], [64, 128], [64, 64], [32, 64]]
    assert [list(d.shape) for d in descs] == [[300, 512], [200, 256], [200, 128], [300, 256]]
    assert dynamic == want_counter and n_programs == (2 if want_counter else 5)
    assert (counter is unused) != want_counter


@needs_kernels
@pytest.mark.parametrize("mode, deterministic", [("separate", True), ("atomic", False)])
def test_adapter_declares_what_the_dq_mode_gives(mode, deterministic, monkeypatch):
    # the spec holds a backend to its declaration: bitwise-reproducible gradients only without atomics
    from backends.triton_jfa import TritonJfa
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_DQ_MODE", mode)
    caps = TritonJfa().capabilities
    assert caps.deterministic is deterministic and f"dQ mode {mode}" in caps.notes


@needs_kernels
def test_fused_gluon_dq_buffer_round_trip():
    # host side of the fused Gluon dQ: the kernel adds dQ^T[h * D + c, column of row t]; every sequence starts
    # at a column that is a multiple of 4 (a TMA reduce-add at an unaligned innermost coordinate is an
    # illegal instruction on the H200), and the read-back must find dq[t, h, c] * scale there
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from kernels import jfa
    lens = [7, 1, 5, 0, 6]
    q = torch.zeros(sum(lens), 2, 128, dtype=torch.bfloat16, device=DEVICE)
    cu_q = torch.tensor([0, 7, 8, 13, 13, 19], dtype=torch.int32, device=DEVICE)
    columns = jfa._aligned_columns(lens, lambda a: torch.as_tensor(a).to(DEVICE))
    cu_dq, cols, _ = columns
    acc = jfa._fused_dq_buffer(q, columns)
    assert cu_dq.tolist() == [0, 8, 12, 20, 20, 28] and cu_dq.dtype == torch.int32
    assert cols.tolist() == [0, 1, 2, 3, 4, 5, 6, 8, 12, 13, 14, 15, 16, 20, 21, 22, 23, 24, 25]
    assert acc.shape == (256, 36) and acc.dtype == torch.float32 and (acc.stride(0) * 4) % 16 == 0
    assert bool((acc == 0).all())  # the kernel only adds
    # values that bf16 holds exactly, also halved: the interpreter's float32 -> bf16 cast truncates
    want = torch.randn(19, 2, 128, generator=torch.Generator().manual_seed(3)).bfloat16().float().to(DEVICE)
    acc.fill_(float("nan"))  # columns that hold no row are never read
    acc[:, cols.long()] = want.permute(1, 2, 0).reshape(256, 19)
    got = jfa._fused_dq_result(acc, cols, q, 0.5)
    assert got.dtype == torch.bfloat16 and got.is_contiguous()
    torch.testing.assert_close(got, (want * 0.5).to(torch.bfloat16), rtol=0, atol=0)
    desc = jfa._fused_dq_descriptor(acc)
    assert list(desc.shape) == [256, 36] and list(desc.strides) == [36, 1] and list(desc.block_shape) == [64, 32]


@needs_kernels
def test_aligned_columns_of_broadcast_rows():
    # broadcast-Q: output row b * lq + i, so sequence b owns lq rows; each block starts at a multiple of 4
    cu, cols, n_cols = jfa._aligned_columns([5, 5, 5])
    assert cu.tolist() == [0, 8, 16, 24] and n_cols == 24
    assert cols.tolist() == [0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 16, 17, 18, 19, 20]
    assert cols.dtype == cu.dtype == torch.int32
    assert jfa._aligned_columns([]).n_cols == 4  # (a buffer with no rows is still a valid TMA target)


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
    columns = jfa._aligned_columns(lens_out, lambda a: torch.as_tensor(a).to(DEVICE))
    stats = torch.full((2 * hq, columns.n_cols), float("nan"), device=DEVICE)
    delta = torch.empty_like(lse)
    tk._bwd_preprocess[(-(-n_out // 16), hq)](
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


@needs_kernels
def test_gluon_dq_switch_falls_back_with_its_reason(monkeypatch):
    from kernels import jfa
    # "auto" (the default) falls back silently: fp32 is not for the Gluon dQ kernel anywhere
    monkeypatch.setattr(jfa, "BWD_Q_KERNEL", "auto")
    run_case([40, 0, 33], [9, 50, 33], hq=2, hkv=1, d=32, causal=True, dtype=torch.float32)
    assert jfa.LAST_BWD_DQ_PATH == "separate", jfa.LAST_BWD_DQ_PATH
    monkeypatch.setattr(jfa, "BWD_Q_KERNEL", "gluon")
    run_case([40, 0, 33], [9, 50, 33], hq=2, hkv=1, d=32, causal=True, dtype=torch.float32)
    assert jfa.LAST_BWD_DQ_PATH.startswith("separate (gluon: "), jfa.LAST_BWD_DQ_PATH
    run_case([20], [9, 50, 33], hq=2, hkv=1, d=32, broadcast=True, dtype=torch.float32)
    assert "broadcast-Q" in jfa.LAST_BWD_DQ_PATH, jfa.LAST_BWD_DQ_PATH
    # the fused atomic mode computes dQ itself, and says so
    monkeypatch.setattr(jfa, "BWD_DQ_MODE", "atomic")
    run_case([12, 30], [25, 7], hq=2, hkv=1, d=32, dtype=torch.float32)
    assert jfa.LAST_BWD_DQ_PATH.startswith("atomic-"), jfa.LAST_BWD_DQ_PATH
    monkeypatch.setattr(jfa, "BWD_KV_KERNEL", "gluon")
    monkeypatch.setattr(jfa, "GLUON_FUSED_DQ_SPLIT", "rows")
    with pytest.raises(ValueError, match="GLUON_FUSED_DQ_SPLIT"):
        run_case([4], [4], dtype=torch.float32)
    monkeypatch.setattr(jfa, "BWD_KV_KERNEL", "triton")
    monkeypatch.setattr(jfa, "BWD_DQ_MODE", "separate")
    monkeypatch.setattr(jfa, "GLUON_DQ_STAGES", 3)
    with pytest.raises(ValueError, match="GLUON_DQ_STAGES"):
        run_case([4], [4], dtype=torch.float32)
    monkeypatch.setattr(jfa, "BWD_Q_KERNEL", "cutlass")
    with pytest.raises(ValueError, match="BWD_Q_KERNEL"):
        run_case([4], [4], dtype=torch.float32)
    monkeypatch.setattr(jfa, "BWD_Q_KERNEL", "auto")
    monkeypatch.setattr(jfa, "BWD_DQ_MODE", "fused")  # a typo must not quietly mean "separate"
    with pytest.raises(ValueError, match="BWD_DQ_MODE"):
        run_case([4], [4], dtype=torch.float32)


@needs_gluon
@pytest.mark.parametrize("poison", ["inf", "nan"])
def test_gpu_gluon_backward_rows_past_the_end_never_leak(poison, monkeypatch):
    """A ragged last query block reads the next sequence's Q and dO rows, a ragged key block its K and
    V rows: none of them may reach the first sequence's gradients."""
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_KV_KERNEL", "gluon")
    check_grads_beside_a_poisoned_sequence(poison, poisoned_first=False, d=64, names=("dq", "dk", "dv"),
                                           tol=TOL[torch.bfloat16])
    assert jfa.LAST_BWD_KV_PATH == "gluon", jfa.LAST_BWD_KV_PATH


@needs_kernels
def test_gluon_backward_switch_falls_back_with_its_reason(monkeypatch):
    from kernels import jfa
    # "auto" (the default) falls back silently: fp32 and head dim 32 are not for the Gluon dK/dV kernel
    monkeypatch.setattr(jfa, "BWD_KV_KERNEL", "auto")
    run_case([40, 0, 33], [9, 50, 33], hq=2, hkv=1, d=32, causal=True, dtype=torch.float32)
    assert jfa.LAST_BWD_KV_PATH == "triton", jfa.LAST_BWD_KV_PATH
    monkeypatch.setattr(jfa, "BWD_KV_KERNEL", "gluon")
    run_case([40, 0, 33], [9, 50, 33], hq=2, hkv=1, d=32, causal=True, dtype=torch.float32)
    assert jfa.LAST_BWD_KV_PATH.startswith("triton (gluon: "), jfa.LAST_BWD_KV_PATH
    monkeypatch.setattr(jfa, "BWD_KV_KERNEL", "cutlass")
    with pytest.raises(ValueError, match="BWD_KV_KERNEL"):
        run_case([4], [4], dtype=torch.float32)


@needs_kernels
@pytest.mark.parametrize("grid, n_items, want", [("sorted", 500, (500, False)), ("persistent", 500, (132, False)),
                                                 ("dynamic", 500, (132, True)), ("dynamic", 100, (100, False))])
def test_gluon_grid_is_what_the_switch_names(grid, n_items, want, monkeypatch):
    # both Gluon kernels launch through this: one program per item, or one per SM dealt round-robin or
    # by counter (the counter only when some program gets a second item)
    from kernels import jfa
    monkeypatch.setattr(jfa, "_num_sms", lambda device: 132)
    assert jfa._gluon_grid(n_items, "cpu", grid) == want
    # the switch is read (and checked) when a call is prepared
    monkeypatch.setattr(jfa, "GLUON_GRID", "round-robin")
    with pytest.raises(ValueError, match="GLUON_GRID"):
        run_case([4], [4], dtype=torch.float32)


@needs_kernels
@pytest.mark.parametrize("stages, order, block_m, field", [
    (0, "plain", 32, "GLUON_BWD_STAGES"), (5, "plain", 32, "GLUON_BWD_STAGES"), (2.0, "plain", 32, "GLUON_BWD_STAGES"),
    (2, "fa3", 32, "GLUON_BWD_ORDER"), (1, "overlap", 32, "GLUON_BWD_STAGES"), (2, "paired", 32, "GLUON_BWD_ORDER"),
    (2, "plain", 48, "GLUON_BWD_BLOCK_M"), (2, "plain", "64", "GLUON_BWD_BLOCK_M")])
def test_gluon_backward_stage_count_order_and_block_rows_are_checked(stages, order, block_m, field, monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_KV_KERNEL", "gluon")
    monkeypatch.setattr(jfa, "GLUON_BWD_STAGES", stages)
    monkeypatch.setattr(jfa, "GLUON_BWD_ORDER", order)
    monkeypatch.setattr(jfa, "GLUON_BWD_BLOCK_M", block_m)
    with pytest.raises(ValueError, match=field):
        run_case([4], [4], dtype=torch.float32)


@needs_kernels
@pytest.mark.parametrize("field, value", [("GLUON_TMA_STORE_KERNELS", True), ("GLUON_TMA_STORE_KERNELS", "backward"),
                                          ("GLUON_TMA_STORE_KERNELS", None),
                                          ("GLUON_TMA_STORE_KERNELS", ("backward", "sideways")),
                                          ("GLUON_BWD_REG_OPERAND", 1), ("GLUON_BWD_REG_OPERAND", "yes")])
def test_gluon_store_and_operand_switches_are_checked(field, value, monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, field, value)
    with pytest.raises(ValueError, match=field):
        run_case([4], [4], dtype=torch.float32)


@needs_kernels
@pytest.mark.parametrize("env, field", [(dict(JFA_GLUON_BWD_REG_OPERAND="yes"), "JFA_GLUON_BWD_REG_OPERAND: 0 or 1"),
                                        (dict(JFA_GLUON_TMA_STORE_KERNELS="forward,sideways"),
                                         "JFA_GLUON_TMA_STORE_KERNELS")])
def test_a_bad_switch_in_the_environment_is_refused_by_name(env, field):
    # read when kernels.jfa is imported: a value it cannot take is an error at the first call, never a silent default
    code = ("import torch\nfrom kernels import jfa\nq = torch.randn(4, 1, 16)\n"
            "cu = torch.tensor([0, 4], dtype=torch.int32)\njfa.jagged_flash_attention(q, q, q, cu, cu, 4, 4)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "1", **env},
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode != 0 and "ValueError" in run.stderr and field in run.stderr, run.stderr[-2000:]


@needs_kernels
@pytest.mark.parametrize("causal", [False, True])
def test_split_dkdv_sends_each_sequence_to_one_kernel(causal, monkeypatch):
    # BWD_KV_KERNEL "split": the key blocks of sequences with at least GLUON_BWD_SPLIT_KEYS keys go to the Gluon
    # kernel, the rest to the tl kernel; together every key block of every sequence with queries, once.  (The
    # plan is made as on an H200: here the Gluon refusal is lifted, and only the host side runs.)
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_KV_KERNEL", "split")
    monkeypatch.setattr(jfa, "GLUON_BWD_SPLIT_KEYS", 200)
    monkeypatch.setattr(jfa, "_gluon_refusal", lambda *a, **kw: "")
    # (sequence 1: long, but no query sees its keys, so neither kernel takes it and dK / dV are zeroed)
    lens_q, lens_k = [300, 0, 513, 129, 64, 700, 1, 65], [257, 250, 513, 400, 0, 199, 1, 200]
    q, k, v, cu_q, cu_k = make_inputs(lens_q, lens_k, 2, 1, 64, 64, torch.float32)
    *_, s, cfgs, _, _, _, _ = jfa._prepare(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal, None, False, False)
    assert cfgs.bwd_kv_kernel == "split" and cfgs.bwd.gluon_bwd_split_keys == 200

    def blocks(tiles, block_n):
        pairs = sorted(zip(tiles[0].tolist(), tiles[1].tolist()))
        assert len(pairs) == len(set(pairs)) == tiles[2]
        return {(b, j * block_n) for b, j in pairs}
    gluon = blocks(s["kv_gluon"], 128)
    short = blocks(s["kv_short"], cfgs.bwd_kv[1])
    assert {b for b, _ in gluon} == {0, 2, 3, 7} and {b for b, _ in short} == {5, 6}
    # each sequence's blocks as its kernel would cover it alone
    for tiles, block_n, seqs in ((gluon, 128, {0, 2, 3, 7}), (short, cfgs.bwd_kv[1], {5, 6})):
        full = sched.kv_tiles(np.asarray(lens_q), np.asarray(lens_k), block_n, causal)
        want = {(b, j * block_n) for b, j in zip(full[0].tolist(), full[1].tolist()) if b in seqs}
        assert tiles == want
    # the full tl list stays for a backward whose dO the Gluon kernel refuses
    assert s["kv"][2] == sched.kv_tiles(np.asarray(lens_q), np.asarray(lens_k), cfgs.bwd_kv[1], causal)[0].shape[0]
    assert s["kv_needs_zero"]
    # the plan also keeps where the Gluon kernel's statistics lie: the query rows, each sequence aligned
    assert s["columns"].cu.tolist() == [0, 300, 300, 816, 948, 1012, 1712, 1716, 1784]
    assert s["columns"].cols.shape == (sum(lens_q),) and s["columns"].n_cols == 1796
    # no sequence long enough: no Gluon launch at all
    monkeypatch.setattr(jfa, "GLUON_BWD_SPLIT_KEYS", 10 ** 6)
    s = jfa._prepare(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal, None, False, False)[5]
    assert s["kv_gluon"] is None and s["kv_short"][2] == s["kv"][2] and s["columns"] is None


@needs_kernels
@pytest.mark.parametrize("value", [0, 2048.0, "2048"])
def test_split_dkdv_threshold_is_checked(value, monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_KV_KERNEL", "split")
    monkeypatch.setattr(jfa, "GLUON_BWD_SPLIT_KEYS", value)
    with pytest.raises(ValueError, match="GLUON_BWD_SPLIT_KEYS"):
        run_case([4], [4], dtype=torch.float32)


@needs_kernels
def test_split_dkdv_falls_back_with_its_reason(monkeypatch):
    # where Gluon cannot run (the interpreter, fp32, no sm_90) the tl kernel takes every tile and says why
    from kernels import jfa
    monkeypatch.setattr(jfa, "BWD_KV_KERNEL", "split")
    monkeypatch.setattr(jfa, "GLUON_BWD_SPLIT_KEYS", 16)
    run_case([40, 0, 33], [9, 50, 33], hq=2, hkv=1, d=32, causal=True, dtype=torch.float32)
    assert jfa.LAST_BWD_KV_PATH.startswith("triton (gluon: "), jfa.LAST_BWD_KV_PATH


@needs_kernels
@pytest.mark.parametrize("block_m, stages, fits", [(64, 3, True), (64, 4, False), (32, 4, True)])
def test_gluon_backward_block_rows_are_checked_against_shared_memory(block_m, stages, fits, monkeypatch):
    # 64-row Q / dO blocks double the ring: at head dim 128 four stages no longer fit sm_90 (an error
    # before the forward runs); what fits is accepted (without the kernel, the tl dK/dV kernel answers)
    from kernels import jfa
    for name, value in (("BWD_KV_KERNEL", "gluon"), ("GLUON_BWD_BLOCK_M", block_m), ("GLUON_BWD_STAGES", stages)):
        monkeypatch.setattr(jfa, name, value)
    q, k, v, cu_q, cu_k = (t.to(DEVICE) for t in make_inputs([5], [9], 1, 1, 128, 128, torch.bfloat16))
    if fits:
        jagged_flash_attention(q, k, v, cu_q, cu_k, 5, 9)
    else:
        with pytest.raises(ValueError, match="GLUON_BWD_BLOCK_M=64 at head dims 128 / 128 needs about"):
            jagged_flash_attention(q, k, v, cu_q, cu_k, 5, 9)


@needs_kernels
@pytest.mark.parametrize("split, buffers, stages, field", [("keys", 3, 2, "GLUON_FUSED_DQ_BUFFERS"),
                                                           ("keys", 0, 2, "GLUON_FUSED_DQ_BUFFERS"),
                                                           ("dim", 2, 4, "shared memory"),
                                                           ("keys", 2, 4, "shared memory")])
def test_fused_gluon_dq_switches_are_checked(split, buffers, stages, field, monkeypatch):
    # a bad buffer count, or switches whose kernel would not fit sm_90's shared memory (at head dim 128: four
    # stages with two staging buffers), are errors before the forward runs
    from kernels import jfa
    for name, value in (("BWD_KV_KERNEL", "gluon"), ("BWD_DQ_MODE", "atomic"), ("GLUON_FUSED_DQ_SPLIT", split),
                        ("GLUON_FUSED_DQ_BUFFERS", buffers), ("GLUON_BWD_STAGES", stages)):
        monkeypatch.setattr(jfa, name, value)
    q, k, v, cu_q, cu_k = (t.to(DEVICE) for t in make_inputs([5], [9], 1, 1, 128, 128, torch.bfloat16))
    with pytest.raises(ValueError, match=field):
        jagged_flash_attention(q, k, v, cu_q, cu_k, 5, 9)
    # what fits is accepted (on a machine without the kernel, the tl dK/dV kernel answers)
    monkeypatch.setattr(jfa, "GLUON_FUSED_DQ_BUFFERS", 2)
    monkeypatch.setattr(jfa, "GLUON_BWD_STAGES", 2)
    jagged_flash_attention(q, k, v, cu_q, cu_k, 5, 9)


@needs_kernels
def test_gluon_switch_falls_back_with_its_reason(monkeypatch):
    # where Gluon cannot run (here: fp32, or the interpreter, or no sm_90), the tl kernel answers
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_KERNEL", "gluon")
    run_case([40, 0, 33], [9, 50, 33], hq=2, hkv=1, d=32, causal=True, dtype=torch.float32)
    assert jfa.LAST_FWD_PATH.startswith("ptr (gluon: "), jfa.LAST_FWD_PATH


@needs_kernels
def test_split_switch_falls_back_with_its_reason(monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_KERNEL", "split")
    run_case([40, 0, 33], [9, 50, 33], hq=2, hkv=1, d=32, causal=True, dtype=torch.float32)
    assert jfa.LAST_FWD_PATH.startswith("ptr (gluon: "), jfa.LAST_FWD_PATH


@needs_kernels
def test_default_forward_picks_silently(monkeypatch):
    # "auto": Gluon where it can run (sm_90, bf16/fp16, head dims 64/128), else the tl kernel, with no
    # refusal reason in LAST_FWD_PATH (nothing was asked for that did not happen)
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_KERNEL", "auto")
    t = torch.zeros(8, 2, 128, dtype=torch.bfloat16, device=DEVICE)
    kernel, why = jfa._pick_fwd_kernel(t, t, t)
    assert why == "" and kernel == ("triton" if jfa._gluon_refusal(t, t, t) else "split")
    run_case([40, 0, 33], [9, 50, 33], hq=2, hkv=1, d=32, causal=True, dtype=torch.float32)
    assert jfa.LAST_FWD_PATH == "ptr", jfa.LAST_FWD_PATH


def test_split_schedule_gives_each_sequence_to_one_kernel_by_its_keys():
    # the Gluon list holds exactly the tiles of the sequences with >= threshold keys, the tl list the rest
    from kernels import jfa
    lens_q, lens_k = np.array([40, 0, 33, 7, 64, 19]), np.array([9, 50, 33, 0, 64, 80])
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in (lens_q, lens_k))
    tl_cfg = jfa._CPU_CFG["fwd"]

    def build(gluon):
        cfgs = jfa.LaunchConfig(tl_cfg, jfa._CPU_CFG["kv"], jfa._CPU_CFG["q"], False, "split", "", gluon)
        return jfa._build_schedule(cu_q, cu_k, lens_q, lens_k, False, True, cfgs, 2, 1, torch.device("cpu"),
                                   row_bytes=64)

    def tiles(entry):
        return sorted(zip(entry[0].tolist(), entry[1].tolist()))
    s = build(((128, 128, 4, 2, "overlap"), 33))
    g_tiles, t_tiles = tiles(s["fwd_gluon"]), tiles(s["fwd"])
    assert {q for q, _ in g_tiles} == {2, 4, 5}  # keys 33, 64, 80
    assert {q for q, _ in t_tiles} == {0, 3}  # keys 9 and 0 (sequence 1 has no queries)
    assert len(g_tiles) == 3 and len(t_tiles) == sum(-(-int(lens_q[i]) // tl_cfg[0]) for i in (0, 3))
    items = s["fwd_gluon"][3]
    assert sorted(items.tolist()) == list(range(3 * 2))
    assert build(None)["fwd_gluon"] is None  # FWD_KERNEL = "triton"
    everything = build(((128, 128, 4, 2, "overlap"), 0))  # FWD_KERNEL = "gluon": all rows
    assert everything["fwd"][2] == 0 and everything["fwd_gluon"][2] == 5  # one 128-row tile per sequence


def test_bad_split_threshold_is_a_clear_error(monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_KERNEL", "split")
    monkeypatch.setattr(jfa, "GLUON_SPLIT_KEYS", -1)
    t = torch.zeros(4, 1, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="GLUON_SPLIT_KEYS"):
        jfa._pick_fwd_kernel(t, t, t)


def test_bad_forward_kernel_switch_is_a_clear_error(monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_KERNEL", "cuda")
    t = torch.zeros(4, 1, 16)
    with pytest.raises(ValueError, match="FWD_KERNEL"):
        jfa._pick_fwd_kernel(t, t, t)


@needs_gluon
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_default_forward_is_split_at_512_keys(causal):
    # the shipped default on sm_90: sequences with >= 512 keys on Gluon, the rest on tl, no switch set
    from kernels import jfa
    assert jfa.FWD_KERNEL == "auto" and jfa.GLUON_SPLIT_KEYS == 512
    run_case([300, 0, 513, 129, 64, 700, 3], [257, 5, 513, 400, 0, 200, 600], hq=4, hkv=2, d=128,
             causal=causal, dtype=torch.bfloat16)
    _ran("gluon+ptr")


@needs_gluon
@pytest.mark.parametrize("broadcast", [False, True])
def test_gpu_plan_on_the_split_forward(broadcast):
    # a plan runs the default forward (Gluon for long sequences, tl for the rest) bit for bit as a plain call
    from kernels import JaggedPlan, jfa
    lens_q, lens_k = ([256], [700, 3, 0, 513, 64]) if broadcast else ([700, 3, 513, 64], [700, 600, 513, 64])
    q, k, v, cu_q, cu_k = (t.cuda() for t in make_inputs(lens_q, lens_k, 4, 2, 128, 128, torch.bfloat16,
                                                           broadcast))
    plain = jagged_flash_attention(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                   broadcast_q=broadcast)
    _ran("gluon+ptr")
    plan = JaggedPlan(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, broadcast_q=broadcast)
    planned = plan(q, k, v)
    assert jfa.LAST_FWD_PATH == "gluon+ptr"
    assert torch.equal(plain[0], planned[0]) and torch.equal(plain[1], planned[1])


@needs_gluon
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_split_forward(causal, monkeypatch):
    # long sequences on the Gluon forward, short ones on the tl kernel, in one call: every row
    # against the float64 reference (with GQA and gradients), and both kernels really ran
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_KERNEL", "split")
    monkeypatch.setattr(jfa, "GLUON_SPLIT_KEYS", 256)
    run_case([300, 0, 513, 129, 64, 700, 3], [257, 5, 513, 400, 0, 200, 300], hq=4, hkv=2, d=128,
             causal=causal, dtype=torch.bfloat16)
    _ran("gluon+ptr")
    run_case([200], [300, 0, 1, 129, 700], hq=2, hkv=2, d=64, causal=causal, dtype=torch.float16,
             broadcast=True)
    _ran("gluon+ptr")


@needs_gluon
@pytest.mark.parametrize("schedule", jfa.GLUON_SCHEDULES)
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_gluon_schedules(schedule, causal, monkeypatch):
    # every schedule, on tiles with an idle second group (65, 1) and on broadcast-Q; 64-key blocks
    # with three stages, so the buffer ring wraps several times
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_KERNEL", "gluon")
    monkeypatch.setattr(jfa, "CONFIG_OVERRIDE", {"gluon_fwd": (128, 64, 4, 3, schedule)})
    run_case([300, 0, 513, 1, 65, 700], [257, 5, 513, 1, 64, 200], hq=2, hkv=1, d=128, causal=causal,
             dtype=torch.bfloat16)
    _ran("gluon")
    run_case([200], [300, 0, 1, 129], hq=2, hkv=2, d=64, causal=causal, dtype=torch.float16, broadcast=True)
    _ran("gluon")


def test_bad_gluon_schedule_is_a_clear_error(monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "CONFIG_OVERRIDE", {"gluon_fwd": (128, 128, 4, 2, "plain")})  # removed in v7
    monkeypatch.setattr(jfa, "FWD_KERNEL", "gluon")
    t = torch.zeros(4, 1, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="schedule"):
        jfa._pick_fwd_kernel(t, t, t)


@needs_gluon
@pytest.mark.parametrize("grid", ["persistent", "dynamic"])
@pytest.mark.parametrize("schedule", jfa.GLUON_SCHEDULES)
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_gluon_persistent_grid(schedule, causal, grid, monkeypatch):
    # three programs loop over every item: the K/V ring, the tail barrier, the Q double buffer, the
    # item hand-off and the turns run on across items, including items with no keys and items whose
    # second group is idle; the answers are the sorted grid's bit for bit
    from kernels import jfa
    monkeypatch.setattr(jfa, "FWD_KERNEL", "gluon")
    monkeypatch.setattr(jfa, "_num_sms", lambda device: 3)
    monkeypatch.setattr(jfa, "CONFIG_OVERRIDE", {"gluon_fwd": (128, 128, 4, 2, schedule)})
    cases = [(([300, 0, 513, 1, 65, 700, 40, 3], [257, 5, 513, 1, 64, 200, 0, 300]),
              dict(hq=4, hkv=2, d=128, dtype=torch.bfloat16, broadcast=False)),
             (([200], [300, 0, 1, 129, 64]), dict(hq=2, hkv=2, d=64, dtype=torch.float16, broadcast=True))]
    for (lens_q, lens_k), kw in cases:
        monkeypatch.setattr(jfa, "GLUON_GRID", grid)
        run_case(lens_q, lens_k, causal=causal, **kw)
        _ran("gluon")
        q, k, v, cu_q, cu_k = (t.to(DEVICE) for t in make_inputs(lens_q, lens_k, kw["hq"], kw["hkv"], kw["d"],
                                                                 kw["d"], kw["dtype"], kw["broadcast"], 3))
        args = (q, k, v, cu_q, cu_k, max(lens_q), max(lens_k))
        got = jfa.jagged_flash_attention(*args, causal=causal, broadcast_q=kw["broadcast"])
        monkeypatch.setattr(jfa, "GLUON_GRID", "sorted")
        want = jfa.jagged_flash_attention(*args, causal=causal, broadcast_q=kw["broadcast"])
        for g, w in zip(got, want):
            assert torch.equal(g, w)


def test_gluon_config_must_fit_shared_memory(monkeypatch):
    from kernels import jfa
    monkeypatch.setattr(jfa, "CONFIG_OVERRIDE", {"gluon_fwd": (128, 128, 4, 3, "overlap")})
    with pytest.raises(ValueError, match="shared memory"):
        jfa._gluon_cfg()


def test_gluon_refuses_a_scale_it_cannot_fold():
    # the kernels module also runs without the spec's validator, which would reject these scales
    from kernels import jfa
    t = torch.zeros(4, 1, 128, dtype=torch.bfloat16)
    for scale in (-0.5, 0.0, float("nan")):
        assert "positive softmax scale" in jfa._gluon_refusal(t, t, t, scale)
