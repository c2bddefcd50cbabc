"""The fa4 adapter against stand-ins of four FA4 releases: 4.0.0b29, 4.0.0b30, 4.0.0b31 and 4.0.0b36.

Each stand-in ``flash_attn.cute`` has that release's ``flash_attn_varlen_func`` parameters (names, order,
defaults) and binds every call against them, so a keyword the release lacks fails with a TypeError as it
would there. Its body is plain torch with FA4's conventions: packed q with ``cu_seqlens_q``, or dense q
``(B, Lq, H, D)`` with ``cu_seqlens_q=None``; int32 offsets with unit stride (asserted, as every release's
``_flash_attn_fwd`` asserts them); bottom-right causal; natural-log LSE
``[H, total_q]`` (packed) or ``(B, H, Lq)`` (dense); ``(out, lse)`` returned, lse None unless asked for or
needed by autograd. It also makes the refusals that this adapter can meet: the head-dim rules of sm_90
and sm_100, the sm_90 backward's GQA rule, and 4.0.0b31's dedicated sm_100 head-dim-256 forward, which
asserts that jagged K comes with ``cu_seqlens_q``.
"""
from __future__ import annotations

import inspect
import math
import sys
import types
from dataclasses import dataclass

import pytest
import torch

from backends import fa4
from conformance.harness import Unsupported, judge_forward, judge_gradients, run_backend
from conformance.problem import Problem
from test_adapter_layouts import LAYOUTS, assert_meets_oracle, laid_out, run_as_laid_out

# flash_attn_varlen_func's parameters in 4.0.0b29, b30 and b31 (identical in the three), with defaults.
_REQUIRED = object()
_PARAMETERS_B29 = (
    ("q", _REQUIRED), ("k", _REQUIRED), ("v", _REQUIRED), ("qv", None),
    ("cu_seqlens_q", None), ("cu_seqlens_k", None), ("max_seqlen_q", None), ("max_seqlen_k", None),
    ("min_seqlen_k", None), ("seqused_q", None), ("seqused_k", None), ("gather_kv_indices", None),
    ("page_table", None), ("softmax_scale", None), ("causal", False), ("window_size", (None, None)),
    ("learnable_sink", None), ("softcap", 0.0), ("num_splits", 1), ("pack_gqa", None),
    ("deterministic", False), ("score_mod", None), ("score_mod_bwd", None), ("mask_mod", None),
    ("block_sparse_tensors", None), ("aux_tensors", None), ("aux_scalars", None), ("return_lse", False),
    ("scheduler_metadata", None), ("seqlen_k_per_split", None), ("disable_scheduler_metadata", False),
)
# 4.0.0b36 appends two sparse-MLA backward options.
_PARAMETERS_B36 = _PARAMETERS_B29 + (("gather_bwd_recompute_p", False), ("gather_bwd_token_chunk", None))

# What the adapter may set; every other parameter must be left at the release's default.
_ADAPTER_SETS = {"q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
                 "softmax_scale", "causal", "return_lse"}


@dataclass(frozen=True)
class Release:
    version: str
    parameters: tuple
    hd256_sm100_needs_cu_seqlens_q: bool = False  # the dedicated head-dim-256 forward's assertion


RELEASES = {
    "4.0.0b29": Release("4.0.0b29", _PARAMETERS_B29),
    "4.0.0b30": Release("4.0.0b30", _PARAMETERS_B29),
    "4.0.0b31": Release("4.0.0b31", _PARAMETERS_B29, hd256_sm100_needs_cu_seqlens_q=True),
    "4.0.0b36": Release("4.0.0b36", _PARAMETERS_B36),
}


def _signature(release: Release) -> inspect.Signature:
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature([
        inspect.Parameter(name, kind, **({} if default is _REQUIRED else {"default": default}))
        for name, default in release.parameters
    ])


class _GqaBackwardRule(torch.autograd.Function):
    """Identity whose backward fails as FA4's sm_90 backward does for GQA with head_dim != head_dim_v."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise AssertionError("GQA backward requires head_dim == head_dim_v")


def _check_head_dims(d: int, dv: int, arch: int) -> None:
    assert d % 8 == 0 and dv % 8 == 0, f"head dims ({d}, {dv}) must be divisible by 8"
    if arch == 9:
        assert 8 <= d <= 256 and 8 <= dv <= 256, f"({d}, {dv}) is not supported on SM90"
    else:
        assert (d <= 128 and dv <= 128) or (d, dv) in ((192, 128), (256, 256)), f"({d}, {dv}) not on SM100"


def _attend(call: dict, arch: int, release: Release):
    q, k, v, cu_q, cu_k = (call[n] for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"))
    for name, default in release.parameters:
        if name not in _ADAPTER_SETS:
            assert call[name] == default, f"{name} left at {default!r} by this adapter, got {call[name]!r}"
    assert q.dtype == k.dtype == v.dtype and v.dtype in (torch.float16, torch.bfloat16)
    assert cu_k is not None
    for t in (cu_q, cu_k):
        if t is not None:
            assert t.dtype == torch.int32, "cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k must be int32"
            assert t.stride(0) == 1, "cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k must be contiguous"
    dense = cu_q is None
    batch = q.shape[0] if dense else cu_q.shape[0] - 1
    heads, d = q.shape[-2:]
    heads_kv, dv = v.shape[-2:]
    assert q.dim() == (4 if dense else 3) and k.shape == (v.shape[0], heads_kv, d) and v.dim() == 3
    assert cu_k.shape == (batch + 1,), "cu_seqlens_k must have shape (batch_size + 1,)"
    assert heads % heads_kv == 0, "num_head must be divisible by num_head_kv"
    _check_head_dims(d, dv, arch)
    if release.hd256_sm100_needs_cu_seqlens_q and arch in (10, 11) and (d, dv) == (256, 256):
        assert not dense, "SM100 forward with head_dim=256 requires cu_seqlens_q when cu_seqlens_k is used"
    scale = call["softmax_scale"] if call["softmax_scale"] is not None else 1.0 / math.sqrt(d)
    group, ko = heads // heads_kv, cu_k.tolist()
    qo = None if dense else cu_q.tolist()
    outs, lses = [], []
    for b in range(batch):
        qb = (q[b] if dense else q[qo[b]:qo[b + 1]]).float()
        kb = k[ko[b]:ko[b + 1]].float().repeat_interleave(group, dim=1)
        vb = v[ko[b]:ko[b + 1]].float().repeat_interleave(group, dim=1)
        lq, lk = qb.shape[0], kb.shape[0]
        s = torch.einsum("qhd,khd->hqk", qb, kb) * scale
        rows, cols = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
        visible = (cols <= rows + lk - lq) if call["causal"] else torch.ones(lq, lk, dtype=torch.bool)
        has_key = visible.any(-1, keepdim=True)
        s = s.masked_fill(~visible, float("-inf")).masked_fill(~has_key, 0.0)  # keyless rows: 0 out, -inf lse
        p = torch.softmax(s, dim=-1) * visible
        outs.append(torch.einsum("hqk,khd->qhd", p, vb))
        lses.append(torch.where(has_key.squeeze(-1), torch.logsumexp(s, dim=-1), float("-inf")))
    if dense:
        out = torch.stack(outs) if batch else q.new_zeros(0, q.shape[1], heads, dv, dtype=torch.float32)
        lse = torch.stack(lses) if batch else torch.zeros(0, heads, q.shape[1])  # (B, H, Lq)
    else:
        out = torch.cat(outs) if outs else torch.zeros(0, heads, dv)
        lse = torch.cat(lses, dim=1) if lses else torch.zeros(heads, 0)  # [H, total_q]
    out = out.to(q.dtype)
    wants_grad = any(t.requires_grad for t in (q, k, v))
    if wants_grad and arch == 9 and group > 1 and d != dv:
        out = _GqaBackwardRule.apply(out)
    return out, (lse if call["return_lse"] or wants_grad else None)


def stand_in(release: Release, arch: int) -> types.ModuleType:
    """A ``flash_attn.cute`` module with ``release``'s ``flash_attn_varlen_func`` on a GPU of ``arch``."""
    signature = _signature(release)

    def flash_attn_varlen_func(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)  # TypeError for a keyword the release lacks
        bound.apply_defaults()
        return _attend(bound.arguments, arch, release)

    flash_attn_varlen_func.__signature__ = signature
    module = types.ModuleType("flash_attn.cute")
    module.flash_attn_varlen_func = flash_attn_varlen_func
    return module


@pytest.fixture
def install(monkeypatch):
    """``install(version, arch)``: that release's stand-in is what ``from flash_attn.cute import ...`` finds."""
    def _install(version: str, arch: int = 9):
        monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
        monkeypatch.setitem(sys.modules, "flash_attn.cute", stand_in(RELEASES[version], arch))
        monkeypatch.setattr(fa4, "_arch_major", lambda: arch)
    return _install


def _assert_passes(problem: Problem, run, gradients: bool) -> None:
    verdicts = judge_forward(problem, run) + (judge_gradients(problem, run) if gradients else [])
    failed = [str(v) for v in verdicts if not v.ok]
    assert not failed, f"{problem!r}: " + "; ".join(failed)


CASES = {
    "jagged_causal": Problem((5, 0, 9), (7, 3, 9), heads_q=2, heads_kv=2, head_dim=32, dtype="bfloat16",
                             causal="bottom_right", seed=1),
    "gqa_cross": Problem((4, 6), (9, 2), heads_q=6, heads_kv=2, head_dim=64, dtype="float16", scale=0.3, seed=2),
    "value_dim": Problem((3, 8), (8, 5), heads_q=2, heads_kv=2, head_dim=16, head_dim_v=40, dtype="float16",
                         causal="bottom_right", seed=3),
    "broadcast_q": Problem((6, 6, 6), (3, 11, 0), heads_q=4, heads_kv=2, head_dim=64, dtype="bfloat16",
                           causal="bottom_right", broadcast_q=True, seed=4),
    "head_dim_256": Problem((4, 2), (5, 7), heads_q=2, heads_kv=1, head_dim=256, dtype="bfloat16", seed=5),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("version", list(RELEASES))
def test_adapter_meets_the_oracle_on_each_release(install, version, case):
    install(version)
    problem = CASES[case]
    _assert_passes(problem, run_backend(fa4.FA4(), problem, "cpu", gradients=True), gradients=True)


@pytest.mark.parametrize("version", list(RELEASES))
def test_the_stand_ins_reject_a_keyword_their_release_lacks(version):
    """The stand-ins are strict, so the adapter's keywords are checked against each parameter list."""
    func = stand_in(RELEASES[version], 9).flash_attn_varlen_func
    q = torch.zeros(2, 1, 8, dtype=torch.float16)
    offsets = torch.tensor([0, 2], dtype=torch.int32)
    call = dict(cu_seqlens_q=offsets, cu_seqlens_k=offsets)
    with pytest.raises(TypeError):
        func(q, q, q, return_lse_base=2, **call)
    if version == "4.0.0b36":
        func(q, q, q, gather_bwd_recompute_p=False, **call)
    else:
        with pytest.raises(TypeError):
            func(q, q, q, gather_bwd_recompute_p=False, **call)


def test_broadcast_q_lse_layout_is_what_makes_it_pass(install, monkeypatch):
    """Read as [H, B*Lq] without the (B, H, Lq) permute, the same broadcast-Q run fails the LSE check."""
    install("4.0.0b29")
    problem = CASES["broadcast_q"]
    module = sys.modules["flash_attn.cute"]
    real = module.flash_attn_varlen_func

    def without_batch_major_lse(*args, **kwargs):
        out, lse = real(*args, **kwargs)
        return out, lse.permute(1, 0, 2)  # (H, B, Lq): the adapter's permute now scrambles it

    monkeypatch.setattr(module, "flash_attn_varlen_func", without_batch_major_lse)
    verdicts = judge_forward(problem, run_backend(fa4.FA4(), problem, "cpu"))
    assert [v.quantity for v in verdicts if not v.ok] == ["lse"]


@pytest.mark.parametrize("version", list(RELEASES))
def test_sm90_gqa_backward_rule_is_declared_on_each_release(install, version):
    install(version, arch=9)
    problem = Problem((5, 3), (6, 4), heads_q=4, heads_kv=2, head_dim=64, head_dim_v=32, dtype="float16")
    with pytest.raises(Unsupported, match="head_dim == head_dim_v under GQA"):
        run_backend(fa4.FA4(), problem, "cpu", gradients=True)
    _assert_passes(problem, run_backend(fa4.FA4(), problem, "cpu"), gradients=False)


@pytest.mark.parametrize("version", list(RELEASES))
def test_blackwell_head_dim_256_broadcast_q(install, version):
    """4.0.0b31 refuses it (reported as unsupported, naming the release's reason); the others run it."""
    install(version, arch=10)
    problem = Problem((3, 3), (4, 6), heads_q=2, heads_kv=2, head_dim=256, dtype="bfloat16", broadcast_q=True)
    if RELEASES[version].hd256_sm100_needs_cu_seqlens_q:
        with pytest.raises(Unsupported, match="refuses broadcast-Q here: .*requires cu_seqlens_q"):
            run_backend(fa4.FA4(), problem, "cpu", gradients=True)
    else:
        _assert_passes(problem, run_backend(fa4.FA4(), problem, "cpu", gradients=True), gradients=True)
    jagged = problem.replace(broadcast_q=False)  # with cu_seqlens_q every release runs it
    _assert_passes(jagged, run_backend(fa4.FA4(), jagged, "cpu", gradients=True), gradients=True)


def test_other_assertions_are_not_turned_into_refusals(install):
    """Only the release's stated cu_seqlens_q rule becomes a refusal; any other assertion is a failure."""
    install("4.0.0b31", arch=10)
    module = sys.modules["flash_attn.cute"]

    def broken(*args, **kwargs):
        raise AssertionError("lse must have shape (num_head, total_q)")

    module.flash_attn_varlen_func = broken
    problem = Problem((3, 3), (4, 6), head_dim=64, dtype="bfloat16", broadcast_q=True)
    with pytest.raises(AssertionError, match="lse must have shape"):
        run_backend(fa4.FA4(), problem, "cpu")


# -- the caller's layouts -------------------------------------------------------------------------------

LAYOUT_PROBLEMS = {
    "jagged": CASES["jagged_causal"].replace(heads_q=4, heads_kv=2),
    "broadcast_q": CASES["broadcast_q"],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("case", list(LAYOUT_PROBLEMS))
@pytest.mark.parametrize("version", ["4.0.0b29", "4.0.0b36"])
def test_caller_layouts(install, version, case, layout):
    """int64 and strided offsets reach FA4 as the int32 unit-stride tensors it asserts; q, k, v and dO of any
    strides pass through (FA4's own maybe_contiguous deals with them), and the result meets the oracle."""
    install(version)
    args, grad = laid_out(LAYOUT_PROBLEMS[case], LAYOUTS[layout])
    assert_meets_oracle(args, run_as_laid_out(fa4.FA4(), args, grad), grad)


def test_q_k_v_reach_fa4_as_given(install, monkeypatch):
    install("4.0.0b36")
    module = sys.modules["flash_attn.cute"]
    seen, real = [], module.flash_attn_varlen_func
    monkeypatch.setattr(module, "flash_attn_varlen_func", lambda *a, **kw: seen.append((a, kw)) or real(*a, **kw))
    args, _ = laid_out(LAYOUT_PROBLEMS["jagged"], LAYOUTS["all_at_once"])
    fa4.FA4().forward(args)
    (positional, keywords), = seen
    assert all(given is passed for given, passed in zip((args.q, args.k, args.v), positional))
    assert keywords["cu_seqlens_q"].tolist() == args.cu_seqlens_q.tolist()


def test_offsets_of_one_element_get_a_unit_stride():
    """A one-element view counts as contiguous yet keeps its stride: FA4's stride(0) == 1 assertion needs a copy."""
    view = torch.zeros(2, dtype=torch.int32)[::2]
    assert view.is_contiguous() and view.contiguous().stride(0) == 2
    converted = fa4.fa4_offsets(view)
    assert converted.stride(0) == 1 and converted.dtype == torch.int32 and converted.tolist() == [0]
    contiguous = torch.tensor([0, 3, 5], dtype=torch.int32)
    assert fa4.fa4_offsets(contiguous) is contiguous  # nothing to convert: handed over as it is


def test_the_stand_ins_assert_int32_unit_stride_offsets():
    func = stand_in(RELEASES["4.0.0b36"], 9).flash_attn_varlen_func
    q = torch.zeros(2, 1, 8, dtype=torch.float16)
    good = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(AssertionError, match="must be int32"):
        func(q, q, q, cu_seqlens_q=good, cu_seqlens_k=good.long())
    with pytest.raises(AssertionError, match="must be contiguous"):
        func(q, q, q, cu_seqlens_q=torch.tensor([0, 0, 2, 2], dtype=torch.int32)[::2], cu_seqlens_k=good)
