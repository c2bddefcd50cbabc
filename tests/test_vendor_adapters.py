"""Vendor adapters on a CPU machine: their stated reasons, their declarations, and their conversions.

The TLX adapter runs against a stand-in module with the real op's signature and contract (base-2 M,
broadcast-Q through output_offset, no causal flag, G == 1 backward, the backward's assertions that dO is
contiguous and that q, k, v, o and dO share strides, offsets loaded ignoring their stride); the flex
BlockMask builder is compared block for block with ``create_block_mask`` over a dense document mask.
"""
from __future__ import annotations

import math
import sys
import types
import warnings

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conformance import registry
from backends.flex import DOC_BUCKET, Flex, document_block_mask, document_blocks, document_mask_mod
from backends.sdpa_kernels import SdpaCudnn, SdpaEfficient, SdpaFlash, SdpaMath, only_kernel
from backends.tlx_jfa import MODULE as TLX_MODULE
from backends.tlx_jfa import TlxJfa
from conformance.harness import Run, Unsupported, judge_forward, judge_gradients, run_backend
from conformance.problem import Problem, key_visible, make_inputs, offsets
from conformance.spec.edge_cases import EDGE_CASES
from conformance.strategies import problems
from test_adapter_layouts import (CONTIGUOUS_OFFSETS, LAYOUTS, assert_meets_oracle, kernel_reads, laid_out,
                                  run_as_laid_out, verdicts)

VENDOR_ADAPTERS = ("fa4", "flash-attn", "tlx-jfa", "flex", "varlen-attn", "njt-sdpa",
                   "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math")
GPU_ONLY = VENDOR_ADAPTERS  # flex runs on CPU only when asked (JFA_FLEX_CPU=1)


def _assert_passes(problem: Problem, run, gradients: bool) -> None:
    verdicts = judge_forward(problem, run) + (judge_gradients(problem, run) if gradients else [])
    failed = [str(v) for v in verdicts if not v.ok]
    assert not failed, f"{problem!r}: " + "; ".join(failed)


# -- what `jfa-conformance list` says ------------------------------------------------------------------

@pytest.mark.parametrize("name", VENDOR_ADAPTERS)
def test_adapter_loads_and_declares(name):
    info = registry.describe(name, "cpu")
    assert info.name == name
    assert info.capabilities, f"{name} failed to load: {info.reason}"
    assert set(info.capabilities["dtypes"]) <= {"float32", "float16", "bfloat16"}


@pytest.mark.parametrize("name", GPU_ONLY)
def test_gpu_adapters_say_why_not_on_cpu(name, monkeypatch):
    monkeypatch.delenv("JFA_FLEX_CPU", raising=False)
    info = registry.describe(name, "cpu")
    assert not info.available
    assert info.reason and info.reason[0].islower() and len(info.reason) > 20
    # a missing vendor package is named; otherwise the device is
    assert any(word in info.reason for word in ("is not installed", "cuda", "GPU", "CPU"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the wording on a machine without a GPU")
@pytest.mark.parametrize("name", ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math", "njt-sdpa", "varlen-attn"))
def test_torch_adapters_on_cuda_without_gpu(name):
    assert registry.describe(name, "cuda").reason == "no CUDA GPU is visible"


def test_tlx_reason_names_everything_missing(monkeypatch):
    monkeypatch.delenv("JFA_TLX_PATH", raising=False)
    monkeypatch.delitem(sys.modules, TLX_MODULE, raising=False)
    reason = TlxJfa().unavailable_reason("cuda")
    assert reason.startswith("needs ")
    assert "Blackwell GPU (sm_100+)" in reason
    assert "JFA_TLX_PATH" in reason
    try:
        import triton.language.extra.tlx  # noqa: F401
    except ImportError:
        assert "fbtriton" in reason


def test_fa4_head_dims_follow_the_architecture(monkeypatch):
    from backends import fa4

    backend = fa4.FA4()
    monkeypatch.setattr(fa4, "_arch_major", lambda: 9)
    assert backend.capabilities.max_head_dim == 256
    assert not backend.not_supported_reasons(Problem((4,), (4,), head_dim=256, head_dim_v=64, dtype="bfloat16"))
    assert backend.not_supported_reasons(Problem((4,), (4,), head_dim=20, dtype="bfloat16"))
    monkeypatch.setattr(fa4, "_arch_major", lambda: 10)
    assert backend.capabilities.max_head_dim == 128
    assert not backend.not_supported_reasons(Problem((4,), (4,), head_dim=192, head_dim_v=128, dtype="bfloat16"))
    assert not backend.not_supported_reasons(Problem((4,), (4,), head_dim=256, dtype="bfloat16"))
    assert backend.not_supported_reasons(Problem((4,), (4,), head_dim=256, head_dim_v=64, dtype="bfloat16"))


def test_fa4_refuses_gqa_gradients_with_unequal_head_dims_on_sm90(monkeypatch):
    """FA4's sm_90 backward asserts head_dim == head_dim_v under GQA: the adapter says so up front, so the
    check reports a declared limitation instead of an AssertionError from inside the vendor's backward."""
    import types

    from backends import fa4
    from conformance.harness import Unsupported, call_backend
    from conformance.problem import make_grad_out, make_inputs

    calls = []
    fake = types.ModuleType("flash_attn.cute")
    fake.flash_attn_varlen_func = lambda *a, **kw: calls.append(kw) or (_ for _ in ()).throw(RuntimeError("ran"))
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", fake)
    monkeypatch.setattr(fa4, "_arch_major", lambda: 9)
    problem = Problem((5,), (6,), heads_q=4, heads_kv=2, head_dim=64, head_dim_v=32, dtype="float16")
    args = make_inputs(problem, "cpu")
    with pytest.raises(Unsupported, match="head_dim == head_dim_v under GQA"):
        call_backend(fa4.FA4(), args, make_grad_out(problem, "cpu"))
    assert not calls
    with pytest.raises(RuntimeError, match="ran"):  # forward alone, or equal head dims, go to FA4
        call_backend(fa4.FA4(), args)


# -- SDPA kernel variants ------------------------------------------------------------------------------

def test_sdpa_kernel_declarations():
    flash, cudnn, efficient, math_ = SdpaFlash(), SdpaCudnn(), SdpaEfficient(), SdpaMath()
    assert flash.capabilities.dtypes == cudnn.capabilities.dtypes == ("float16", "bfloat16")
    assert "float32" in efficient.capabilities.dtypes and "float32" in math_.capabilities.dtypes
    assert not flash.capabilities.value_dim_differs and not cudnn.capabilities.value_dim_differs
    assert cudnn.capabilities.max_head_dim == 128 and flash.capabilities.max_head_dim == 256
    assert not any(b.capabilities.lse for b in (flash, cudnn, efficient, math_))
    cross = Problem((3, 5), (6, 5), dtype="float16", causal="bottom_right")
    assert any("is_causal is top-left" in r for r in flash.not_supported_reasons(cross))
    assert not efficient.not_supported_reasons(cross)
    square = cross.replace(seqlens_q=(6, 5))
    assert not flash.not_supported_reasons(square)


def test_empty_batch_declared_where_the_vendor_refuses_it():
    from backends.njt_sdpa import NjtSdpa
    from backends.varlen_attn import VarlenAttn

    empty = Problem((), (), dtype="bfloat16")
    assert NjtSdpa().not_supported_reasons(empty) and VarlenAttn().not_supported_reasons(empty)
    assert not NjtSdpa().not_supported_reasons(Problem((2,), (3,), dtype="bfloat16"))


def test_dispatcher_reasons_drop_source_locations():
    from backends.sdpa_kernels import _dispatcher_reasons

    messages = ["Flash attention kernel not used because: (Triggered internally at sdp_utils.cpp:988.)",
                "Flash attention does not support the is_causal flag when seq_len_q != seq_len_k "
                "(Triggered internally at sdp_utils.cpp:123.)"]
    assert _dispatcher_reasons(messages) == \
        "Flash attention does not support the is_causal flag when seq_len_q != seq_len_k"


def test_pinned_kernel_refusal_is_unsupported_with_the_dispatchers_reason():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(NotImplementedError, match="EFFICIENT_ATTENTION kernel refused"):
        with only_kernel("EFFICIENT_ATTENTION"):  # no memory-efficient kernel on CPU
            torch.nn.functional.scaled_dot_product_attention(q, q, q)


@pytest.mark.parametrize("case", ["tile_edges", "gqa_ratio_3", "queries_without_keys", "broadcast_q_causal",
                                  "top_left_cross", "mqa_8_to_1"])
def test_sdpa_flash_grouping_on_the_cpu_flash_kernel(case):
    """The per-(Lq, Lk) grouping of sdpa-flash, run on PyTorch's CPU flash kernel."""
    problem = EDGE_CASES[case].replace(dtype="bfloat16")
    backend = SdpaFlash()
    try:
        run = run_backend(backend, problem, "cpu", gradients=True)
    except Unsupported as exc:
        assert case == "top_left_cross" or "Lq != Lk" in str(exc)
        return
    _assert_passes(problem, run, gradients=True)


# -- TLX JFA against a stand-in ------------------------------------------------------------------------

def _tlx_math(query, key, value, qo: list[int], ko: list[int], max_seq_len_q: int, scale: float, broadcast_q: bool):
    """The op's result in plain torch (differentiable): o, and M the base-2 LSE [H, rows]; rows the grid does
    not reach stay NaN."""
    heads, group = query.shape[1], query.shape[1] // key.shape[1]
    batch = len(ko) - 1
    rows = batch * query.shape[0] if broadcast_q else query.shape[0]
    o = torch.full((rows, heads, value.shape[-1]), float("nan"), dtype=torch.float32)  # unwritten rows stay NaN
    m = torch.full((heads, rows), float("nan"), dtype=torch.float32)
    for b in range(batch):
        q_begin, q_end = (qo[0], qo[1]) if broadcast_q else (qo[b], qo[b + 1])
        qlen = min(q_end - q_begin, max_seq_len_q)  # the grid truncates silently
        o_begin = b * query.shape[0] if broadcast_q else q_begin
        k = key[ko[b]:ko[b + 1]].float().repeat_interleave(group, dim=1)
        v = value[ko[b]:ko[b + 1]].float().repeat_interleave(group, dim=1)
        if qlen and not k.shape[0]:
            raise RuntimeError("the kernel would hang on a sequence with queries and no keys")
        if not qlen:  # no query tile: nothing is launched for this sequence
            continue
        s = torch.einsum("qhd,khd->hqk", query[q_begin:q_begin + qlen].float(), k) * (scale * math.log2(math.e))
        row_max = s.amax(-1, keepdim=True)
        p = torch.exp2(s - row_max)
        denom = p.sum(-1, keepdim=True)
        o[o_begin:o_begin + qlen] = torch.einsum("hqk,khd->qhd", p / denom, v)
        m[:, o_begin:o_begin + qlen] = (row_max + torch.log2(denom)).squeeze(-1)
    return o.to(query.dtype), m


class _TlxOp(torch.autograd.Function):
    """The op's autograd contract: the forward saves the caller's q, k, v (it computes on contiguous copies) and
    a contiguous o; the backward's entry asserts what ``tlx_jagged_flash_attention_backward`` asserts."""

    @staticmethod
    def forward(ctx, query, key, value, qo, ko, max_seq_len_q, scale, broadcast_q):
        with torch.no_grad():
            o, m = _tlx_math(query, key, value, qo, ko, max_seq_len_q, scale, broadcast_q)
        ctx.save_for_backward(query, key, value, o)
        ctx.math_args = (qo, ko, max_seq_len_q, scale, broadcast_q)
        ctx.mark_non_differentiable(m)
        return o, m

    @staticmethod
    def backward(ctx, do, _dm):
        query, key, value, o = ctx.saved_tensors
        assert do.is_contiguous(), "the backward asserts do.is_contiguous()"
        assert query.stride() == key.stride() == value.stride() == o.stride() == do.stride(), \
            "the backward asserts q.stride() == k.stride() == v.stride() == o.stride() == do.stride()"
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (query, key, value)]
            recomputed, _ = _tlx_math(*leaves, *ctx.math_args)
            grads = torch.autograd.grad(recomputed, leaves, do)
        return (*grads, None, None, None, None, None)


def _stand_in_tlx(query, key, value, query_offset, key_offset, max_seq_len_q: int, max_seq_len_kv: int,
                  output_offset=None, sm_scale=None, window_size=None, broadcast_q=False, use_on_device_tma=False,
                  cpu_query_offset=None, cpu_key_offset=None, ad_to_request_offset=None):
    """The contract of tlx_jagged_flash_attention in plain torch: (o, M) with M the base-2 LSE [H, rows]. Its
    kernels load the offsets through typed pointers (int32 or int64) and ignore their strides; so does this."""
    assert query.shape[-1] == key.shape[-1] == value.shape[-1] <= 128
    assert query_offset.dtype in (torch.int32, torch.int64) and key_offset.dtype in (torch.int32, torch.int64)
    assert ad_to_request_offset is None and window_size is None
    group = query.shape[1] // key.shape[1]
    assert query.shape[1] % key.shape[1] == 0
    qo, ko = kernel_reads(query_offset).tolist(), kernel_reads(key_offset).tolist()
    batch = len(ko) - 1 if broadcast_q else len(qo) - 1
    wants_grad = any(t.requires_grad for t in (query, key, value))
    assert not (wants_grad and group != 1), "the backward asserts G == 1"
    if broadcast_q:
        assert qo == [0, query.shape[0]]
        if wants_grad:  # the backward reads o and dO through output_offset
            assert output_offset is not None
            assert output_offset.tolist() == list(range(0, batch * query.shape[0] + 1, query.shape[0]))
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(query.shape[-1])
    return _TlxOp.apply(query, key, value, qo, ko, max_seq_len_q, scale, broadcast_q)


@pytest.fixture
def tlx_stand_in(monkeypatch):
    module = types.ModuleType(TLX_MODULE)
    module.calls = []  # (positional, keyword) arguments of each call
    module.tlx_jagged_flash_attention = lambda *a, **kw: module.calls.append((a, kw)) or _stand_in_tlx(*a, **kw)
    monkeypatch.setitem(sys.modules, TLX_MODULE, module)
    return module


TLX_CASES = {
    "jagged": Problem((5, 17, 1), (9, 17, 30), heads_q=2, heads_kv=2, head_dim=32, dtype="bfloat16", seed=3),
    "empty_query_sequence": Problem((0, 6), (4, 6), heads_q=2, heads_kv=2, head_dim=16, dtype="float16"),
    "broadcast_q": Problem((6, 6, 6), (3, 11, 7), heads_q=2, heads_kv=2, head_dim=64, dtype="bfloat16", broadcast_q=True),
    "scale": Problem((8, 3), (8, 12), head_dim=128, dtype="float16", scale=0.3),
}


@pytest.mark.parametrize("case", list(TLX_CASES))
def test_tlx_adapter_meets_the_oracle(tlx_stand_in, case):
    problem, backend = TLX_CASES[case], TlxJfa()
    _assert_passes(problem, run_backend(backend, problem, "cpu", gradients=True), gradients=True)


def test_tlx_gqa_is_forward_only(tlx_stand_in):
    problem, backend = Problem((4, 9), (7, 9), heads_q=4, heads_kv=2, head_dim=32, dtype="bfloat16"), TlxJfa()
    _assert_passes(problem, run_backend(backend, problem, "cpu"), gradients=False)
    with pytest.raises(Unsupported, match="G == 1"):
        run_backend(backend, problem, "cpu", gradients=True)


def test_tlx_declared_limits():
    backend = TlxJfa()
    assert backend.not_supported_reasons(Problem((3,), (0,), dtype="bfloat16"))  # queries without keys
    assert backend.not_supported_reasons(Problem((3,), (3,), dtype="bfloat16", causal="bottom_right"))
    assert backend.not_supported_reasons(Problem((3,), (3,), dtype="bfloat16", head_dim=256))
    assert backend.not_supported_reasons(Problem((3,), (3,), dtype="bfloat16", head_dim=64, head_dim_v=32))
    assert not backend.not_supported_reasons(Problem((0, 3), (2, 3), dtype="bfloat16"))


def test_tlx_lse_conversion_is_what_makes_it_pass(tlx_stand_in):
    """Without ``* ln 2`` the same run fails the LSE check: the check can fail."""
    class Base2(TlxJfa):
        def forward(self, args):
            out = super().forward(args)
            return type(out)(out.out, out.lse / math.log(2.0))

    problem = TLX_CASES["jagged"]
    verdicts = judge_forward(problem, run_backend(Base2(), problem, "cpu"))
    assert [v.quantity for v in verdicts if not v.ok] == ["lse"]


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_tlx_adapter_on_drawn_problems(tlx_stand_in, data):
    backend = TlxJfa()
    problem = data.draw(problems(backend.capabilities), label="problem")
    # Offsets that are strided views are read stride-blind by the op, as its kernels do (see
    # test_tlx_strided_offsets_reach_the_kernel_as_given); the drawn examples check everything else.
    assume(make_inputs(problem).cu_seqlens_k.stride(0) == 1)
    gradients = problem.heads_q == problem.heads_kv
    try:
        run = run_backend(backend, problem, "cpu", gradients=gradients)
    except Unsupported:
        return
    _assert_passes(problem, run, gradients)


# -- TLX JFA under the caller's layouts -----------------------------------------------------------------

TLX_LAYOUT_PROBLEMS = {
    "jagged": Problem((5, 0, 9), (7, 3, 9), heads_q=2, heads_kv=2, head_dim=32, dtype="bfloat16", seed=6),
    "broadcast_q": Problem((4, 4, 4), (3, 11, 7), heads_q=2, heads_kv=2, head_dim=16, dtype="float16",
                           broadcast_q=True, seed=7),
}


@pytest.mark.parametrize("layout", CONTIGUOUS_OFFSETS)
@pytest.mark.parametrize("case", list(TLX_LAYOUT_PROBLEMS))
def test_tlx_caller_layouts(tlx_stand_in, case, layout):
    """int64 offsets, strided q, k, v and a non-contiguous dO: with gradients the op gets contiguous q, k, v
    and a contiguous dO, which its backward asserts; the result meets the oracle."""
    args, grad = laid_out(TLX_LAYOUT_PROBLEMS[case], LAYOUTS[layout])
    assert_meets_oracle(args, run_as_laid_out(TlxJfa(), args, grad), grad)


def test_tlx_forward_hands_over_the_callers_tensors(tlx_stand_in):
    """Without gradients nothing is converted: the op copies strided q, k, v itself and takes int64 offsets."""
    args, _ = laid_out(TLX_LAYOUT_PROBLEMS["jagged"], LAYOUTS["all_at_once"])
    args = args.replace(cu_seqlens_q=args.cu_seqlens_q.contiguous(), cu_seqlens_k=args.cu_seqlens_k.contiguous())
    TlxJfa().forward(args)
    ((positional, _),) = tlx_stand_in.calls
    assert all(passed is given for passed, given in
               zip(positional, (args.q, args.k, args.v, args.cu_seqlens_q, args.cu_seqlens_k)))


@pytest.mark.parametrize("layout", ["strided_offsets", "strided_int64_offsets"])
def test_tlx_strided_offsets_reach_the_kernel_as_given(tlx_stand_in, layout):
    """The op neither checks nor copies its offsets and its kernels ignore their stride: handed over as they
    are, a strided view is misread, and the spec sees it."""
    args, _ = laid_out(TLX_LAYOUT_PROBLEMS["jagged"], LAYOUTS[layout])
    output = TlxJfa().forward(args)
    ((positional, _),) = tlx_stand_in.calls
    assert positional[3] is args.cu_seqlens_q and positional[4] is args.cu_seqlens_k
    assert not all(v.ok for v in verdicts(args, Run(output.out, output.lse)))


def test_tlx_stand_in_backward_asserts_what_the_op_asserts():
    """Without the adapter's conversions the backward would fail: a non-contiguous dO, or saved q, k, v whose
    strides differ from o's."""
    q = torch.randn(4, 2, 16, dtype=torch.float16)
    offsets = torch.tensor([0, 4])
    for query, grad in ((q, torch.ones(2, 4, 16, dtype=torch.float16).transpose(0, 1)),
                        (torch.randn(4, 2, 24, dtype=torch.float16)[..., :16], torch.ones_like(q))):
        leaf = query.detach().requires_grad_()
        out, _ = _stand_in_tlx(leaf, q, q, offsets, offsets, 4, 4)
        with pytest.raises(AssertionError, match="the backward asserts"):
            torch.autograd.grad(out, leaf, grad)


# -- flex ----------------------------------------------------------------------------------------------

def _block_rows(num: torch.Tensor, idx: torch.Tensor) -> list[list[int]]:
    return [sorted(idx[0, 0, r, : num[0, 0, r]].tolist()) for r in range(num.shape[-1])]


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    lengths=st.lists(st.tuples(st.sampled_from((0, 1, 3, 7, 8, 9, 16, 23)), st.sampled_from((0, 1, 3, 7, 8, 9, 16, 23))),
                     min_size=1, max_size=6),
    causal=st.sampled_from(("none", "bottom_right", "top_left")),
    block=st.sampled_from((4, 8)),
)
def test_flex_block_mask_equals_dense_evaluation(lengths, causal, block):
    from torch.nn.attention.flex_attention import create_block_mask

    cu_q, cu_k = offsets([lq for lq, _ in lengths]), offsets([lk for _, lk in lengths])
    total_q, total_k = int(cu_q[-1]), int(cu_k[-1])
    if not total_q or not total_k:
        return
    mask_mod = document_mask_mod(cu_q, cu_k, causal, (total_q + 2 * block, total_k + 2 * block))
    dense = create_block_mask(mask_mod, None, None, total_q, total_k, device="cpu", BLOCK_SIZE=block)
    partial, full = document_blocks(cu_q, cu_k, causal, block)
    assert partial.tolist() == [[j in row for j in range(partial.shape[1])]
                                for row in _block_rows(dense.kv_num_blocks, dense.kv_indices)]
    assert full.tolist() == [[j in row for j in range(full.shape[1])]
                             for row in _block_rows(dense.full_kv_num_blocks, dense.full_kv_indices)]


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(
    lengths=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), min_size=1, max_size=5),
    causal=st.sampled_from(("none", "bottom_right", "top_left")),
)
def test_flex_mask_mod_is_the_causal_convention_per_document(lengths, causal):
    # the mask_mod's causal modes are a per-document diagonal shift (data, so one compiled graph serves every
    # mode): every (query, key) pair of the packed batch, padding included, against key_visible per document
    cu_q, cu_k = offsets([lq for lq, _ in lengths]), offsets([lk for _, lk in lengths])
    total_q, total_k = int(cu_q[-1]), int(cu_k[-1])
    pad = (total_q + 3, total_k + 5)
    mask_mod = document_mask_mod(cu_q, cu_k, causal, pad)
    got = mask_mod(0, 0, torch.arange(pad[0])[:, None], torch.arange(pad[1])[None, :])
    want = torch.zeros(pad, dtype=torch.bool)
    for b, (lq, lk) in enumerate(lengths):
        q0, k0 = int(cu_q[b]), int(cu_k[b])
        want[q0:q0 + lq, k0:k0 + lk] = key_visible(torch.arange(lq)[:, None], torch.arange(lk)[None, :], lq, lk, causal)
    assert torch.equal(got, want)


def test_flex_compiles_one_graph_for_every_batch_size_and_causal_mode():
    """What dynamo compiles flex for depends on the padded rows and the batch's power-of-two bucket alone:
    batches of other sizes and the three causal modes reuse the graph (before, each batch size and mode
    compiled its own: on a GPU seconds of tracing and lowering inside a check)."""
    from torch._dynamo.utils import counters
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(flex_attention, dynamic=False, backend="eager")  # dynamo's guards, no codegen
    rows = (256, 256)
    q, k, v = (torch.randn(1, 2, 256, 16) for _ in range(3))

    def graphs(lengths, causal):
        cu = offsets(lengths)
        compiled(q, k, v, block_mask=document_block_mask(cu, cu, causal, block_size=128, rows=rows))
        return counters["stats"]["unique_graphs"]

    try:
        assert graphs([5, 7], "none") == 1
        for lengths in ([5, 7, 9], [1] * (DOC_BUCKET - 2), [40, 0, 3]):
            for causal in ("none", "bottom_right", "top_left"):
                assert graphs(lengths, causal) == 1, (len(lengths), causal)
        assert graphs([1] * (DOC_BUCKET - 1), "none") == 2  # the next bucket: one more graph
    finally:
        torch._dynamo.reset()


def test_flex_block_mask_scales_without_dense_evaluation():
    """500k packed tokens: create_block_mask would evaluate 2.5e11 pairs; the builder works on blocks."""
    lengths = [37, 400, 1, 0, 129] * 900  # 510,300 tokens
    cu = offsets(lengths)
    partial, full = document_blocks(cu, cu, "bottom_right")
    assert partial.shape == (-(-int(cu[-1]) // 128),) * 2
    assert full.any() and partial.any()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path of flex")
@pytest.mark.parametrize("case", ["queries_without_keys", "causal_more_queries_than_keys", "top_left_cross",
                                  "gqa_ratio_3", "value_dim_differs", "broadcast_q_with_empty_kv"])
def test_flex_on_cpu(case):
    problem = EDGE_CASES[case].replace(dtype="float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex warns that eager mode is unfused
        run = run_backend(Flex(), problem, "cpu")
    assert run.lse is not None
    _assert_passes(problem, run, gradients=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path of flex")
def test_flex_on_cpu_is_opt_in_and_declares_no_backward(monkeypatch):
    backend = Flex()
    monkeypatch.delenv("JFA_FLEX_CPU", raising=False)
    assert "JFA_FLEX_CPU=1" in backend.unavailable_reason("cpu")
    monkeypatch.setenv("JFA_FLEX_CPU", "1")
    assert backend.unavailable_reason("cpu") is None
    assert not backend.capabilities.backward
    with pytest.raises(Unsupported, match="declares no backward"):
        run_backend(backend, Problem((2,), (2,)), "cpu", gradients=True)
