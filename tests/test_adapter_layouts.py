"""Adapters under the caller's tensor layouts: int32 or int64 offsets, offsets that are every other element
of a longer buffer, q, k, v that are row- or head-strided views of wider buffers, and an upstream gradient
that is expanded (stride 0 over the rows) or a permuted dense view.

The layouts are built here from a problem's inputs (the same numbers, other strides; the padding around a
view holds NaN, so a reader that ignores a stride reads NaN), the backend's ``forward`` is called on them as
they are, and out, LSE and dq/dk/dv are judged against the float64 oracle by the spec's tolerance rule.
Adapters that run on the CPU run for real (sdpa; sdpa-flash on PyTorch's CPU flash kernel; njt-sdpa's
nested tensors through SDPA's math kernel, the CPU having no NJT flash kernel; flex's eager path). flash-attn
and varlen-attn run against stand-ins that check what their real entry points check. FA4, FlashInfer and
TLX have their layout tests next to their stand-ins and use the layout builders and judges of this file.
"""
from __future__ import annotations

import inspect
import sys
import types
import warnings
from dataclasses import dataclass

import pytest
import torch

from backends.flash_attn2 import FlashAttn2
from backends.flex import Flex
from backends.njt_sdpa import NjtSdpa
from backends.sdpa import Sdpa
from backends.sdpa_kernels import SdpaFlash, SdpaMath
from backends.varlen_attn import VarlenAttn
from conformance import oracle
from conformance.harness import Run, oracle_call
from conformance.problem import AttentionArgs, Problem, make_grad_out, make_inputs
from conformance.problem import laid_out as spec_layout
from conformance.tolerance import FORWARD_FACTOR, GRADIENT_FACTOR, Verdict, judge, magnitude

PAD = 8  # elements of padding around a view: rows and heads stay 16-byte aligned in 2-byte dtypes


# -- the layouts ---------------------------------------------------------------------------------------

def strided_offsets(cu: torch.Tensor) -> torch.Tensor:
    """``cu`` as every other element of a buffer twice as long; each filler repeats the entry before it, so
    a reader that ignores the stride sees well-formed but wrong offsets."""
    buffer = torch.empty(2 * cu.shape[0], dtype=cu.dtype, device=cu.device)
    buffer[0::2] = cu
    buffer[1::2] = cu
    return buffer[0::2]


def _nan_buffer(shape, like: torch.Tensor) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=like.dtype, device=like.device)


def row_strided(t: torch.Tensor) -> torch.Tensor:
    """``t`` [rows, H, D] as the rows of a wider buffer (a slice of a fused projection): row stride H*D + PAD."""
    rows, heads, dim = t.shape
    view = _nan_buffer((rows, heads * dim + PAD), t)[:, PAD:].view(rows, heads, dim)
    return view.copy_(t)


def head_strided(t: torch.Tensor) -> torch.Tensor:
    """``t`` [rows, H, D] with each head sliced out of a wider one: head stride D + 2*PAD, row stride
    H*(D + 2*PAD), PAD elements in (so the base stays 16-byte aligned: unaligned bases are ``unaligned``'s)."""
    rows, heads, dim = t.shape
    view = _nan_buffer((rows, heads, dim + 2 * PAD), t)[..., PAD: PAD + dim]
    return view.copy_(t)


def unaligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a dense view one element into a NaN-led buffer: no 16-byte aligned base (the spec's offset_view)."""
    return spec_layout(t, "offset_view")


def split_kv(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v as the two halves of one [rows, Hkv, D + Dv] buffer (v starts D elements into it)."""
    buffer = torch.cat([k, v], dim=-1)
    return buffer[..., : k.shape[-1]], buffer[..., k.shape[-1]:]


def expanded_grad(g: torch.Tensor) -> torch.Tensor:
    """One row of ``g`` broadcast over all rows (stride 0), as the gradient of ``out.sum(0)`` arrives."""
    return g[:1].expand_as(g)


def permuted_grad(g: torch.Tensor) -> torch.Tensor:
    """``g`` as a dense permuted view whose last dim is not the contiguous one."""
    rows, heads, dim = g.shape
    return torch.empty(dim, heads, rows, dtype=g.dtype, device=g.device).permute(2, 1, 0).copy_(g)


@dataclass(frozen=True)
class Layout:
    offsets_dtype: torch.dtype = torch.int32
    offsets_strided: bool = False
    qkv: str = "packed"  # packed, row_strided, head_strided, split_kv (head-strided k and v of one buffer), unaligned
    grad: str = "contiguous"  # contiguous, expanded, permuted


LAYOUTS = {
    "int64_offsets": Layout(offsets_dtype=torch.int64),
    "strided_offsets": Layout(offsets_strided=True),
    "strided_int64_offsets": Layout(offsets_dtype=torch.int64, offsets_strided=True),
    "expanded_grad": Layout(grad="expanded"),
    "permuted_grad": Layout(grad="permuted"),
    "row_strided_qkv_expanded_grad": Layout(qkv="row_strided", grad="expanded"),
    "head_strided_qkv_permuted_grad": Layout(qkv="head_strided", grad="permuted"),
    "split_kv_expanded_grad": Layout(qkv="split_kv", grad="expanded"),
    "unaligned_qkv": Layout(qkv="unaligned"),
    "all_at_once": Layout(torch.int64, True, "row_strided", "permuted"),
}
# The layouts whose offsets are contiguous: what an adapter must get right even against a kernel that reads
# offsets through their data pointer.
CONTIGUOUS_OFFSETS = [name for name, layout in LAYOUTS.items() if not layout.offsets_strided]
PACKED_QKV = [name for name, layout in LAYOUTS.items() if layout.qkv == "packed"]


def laid_out(problem: Problem, layout: Layout, device="cpu") -> tuple[AttentionArgs, torch.Tensor]:
    """The problem's inputs and upstream gradient, same numbers, in ``layout``."""
    args, grad = make_inputs(problem, device), make_grad_out(problem, device)
    cu_q, cu_k = (t.to(layout.offsets_dtype) for t in (args.cu_seqlens_q, args.cu_seqlens_k))
    if layout.offsets_strided:
        cu_q, cu_k = strided_offsets(cu_q), strided_offsets(cu_k)
    q, k, v = args.q, args.k, args.v
    if layout.qkv == "row_strided":
        q, k, v = row_strided(q), row_strided(k), row_strided(v)
    elif layout.qkv == "head_strided":
        q, k, v = head_strided(q), head_strided(k), head_strided(v)
    elif layout.qkv == "split_kv":
        q, (k, v) = head_strided(q), split_kv(k, v)
    elif layout.qkv == "unaligned":
        q, k, v = unaligned(q), unaligned(k), unaligned(v)
    grad = {"contiguous": grad, "expanded": expanded_grad(grad), "permuted": permuted_grad(grad)}[layout.grad]
    laid = args.replace(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert all(torch.equal(getattr(laid, n), getattr(args, n)) for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"))
    return laid, grad


def run_as_laid_out(backend, args: AttentionArgs, grad_out: torch.Tensor | None = None) -> Run:
    """``backend.forward`` on ``args`` with their strides kept (leaves are detached views, not clones), and
    with ``grad_out`` the gradients autograd returns for it."""
    leaves = [t.detach().requires_grad_(grad_out is not None) for t in (args.q, args.k, args.v)]
    call = args.replace(q=leaves[0], k=leaves[1], v=leaves[2])
    if call.broadcast_q and backend.capabilities.broadcast_q == "emulated":
        call = call.with_broadcast_q_expanded()
    output = backend.forward(call)
    run = Run(output.out.detach(), None if output.lse is None else output.lse.detach())
    if grad_out is not None:
        grads = torch.autograd.grad(output.out, leaves, grad_out, allow_unused=True)
        run.dq, run.dk, run.dv = (torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves))
    return run


def verdicts(args: AttentionArgs, run: Run, grad_out: torch.Tensor | None = None) -> list[Verdict]:
    """``run`` judged against the float64 oracle of the same numbers, as the spec judges (harness.py)."""
    dtype = args.q.dtype
    exact, low = oracle_call(args, torch.float64, grad_out), oracle_call(args, dtype, grad_out)
    found = [judge("out", run.out, exact.out, low.out, dtype, FORWARD_FACTOR)]
    if run.lse is not None:
        found.append(judge("lse", run.lse, exact.lse, low.lse, dtype, FORWARD_FACTOR))
    if grad_out is not None:
        dot = max(args.q.shape[-1], args.v.shape[-1])
        scale = max(magnitude(exact.dq), magnitude(exact.dk), magnitude(exact.dv))
        found += [judge(n, getattr(run, n), getattr(exact, n), getattr(low, n), dtype, GRADIENT_FACTOR, dot, scale)
                  for n in ("dq", "dk", "dv")]
    return found


def assert_meets_oracle(args: AttentionArgs, run: Run, grad_out: torch.Tensor | None = None) -> None:
    failed = [str(v) for v in verdicts(args, run, grad_out) if not v.ok]
    assert not failed, "; ".join(failed)


def kernel_reads(offsets: torch.Tensor) -> torch.Tensor:
    """The offsets a kernel reads that indexes them through their data pointer, ignoring the stride."""
    return offsets.as_strided((offsets.shape[0],), (1,))


def test_layouts_keep_values_and_change_strides():
    problem = Problem((5, 0, 9), (7, 3, 9), heads_q=4, heads_kv=2, head_dim=16, head_dim_v=24, dtype="float16")
    plain, plain_grad = make_inputs(problem), make_grad_out(problem)
    for name, layout in LAYOUTS.items():
        args, grad = laid_out(problem, layout)
        assert args.cu_seqlens_k.dtype == layout.offsets_dtype, name
        assert (args.cu_seqlens_k.stride(0) == 2) == layout.offsets_strided, name
        if layout.qkv == "unaligned":
            assert all(t.is_contiguous() and t.data_ptr() % 16 for t in (args.q, args.k, args.v)), name
        elif layout.qkv != "packed":
            assert not any(t.is_contiguous() for t in (args.q, args.k, args.v)), name
            assert all(t.stride(-1) == 1 for t in (args.q, args.k, args.v)), name
        if layout.qkv != "unaligned":  # only `unaligned` moves a base or a row or head off a 16-byte boundary
            for t in (args.q, args.k, args.v):
                assert t.data_ptr() % 16 == 0, name
                assert all(stride * t.element_size() % 16 == 0 for stride in t.stride()[:2]), name
        if layout.grad == "expanded":
            assert grad.stride(0) == 0
        elif layout.grad == "permuted":
            assert torch.equal(grad, plain_grad) and grad.stride(-1) != 1
    strided = strided_offsets(plain.cu_seqlens_k)
    assert kernel_reads(strided).tolist() == [0, 0, 7, 7]  # what a stride-blind reader would use


# -- runs on the CPU --------------------------------------------------------------------------------------

SDPA_PROBLEMS = {
    "jagged": Problem((5, 0, 9), (7, 3, 9), heads_q=4, heads_kv=2, head_dim=16, head_dim_v=24,
                      causal="bottom_right", seed=1),
    "broadcast_q": Problem((4, 4, 4), (6, 0, 3), heads_q=2, heads_kv=1, head_dim=8, broadcast_q=True,
                           causal="top_left", seed=2),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("case", list(SDPA_PROBLEMS))
@pytest.mark.parametrize("adapter", [Sdpa, SdpaMath], ids=["sdpa", "sdpa-math"])
def test_sdpa(adapter, case, layout):
    """The padded path, unpinned and pinned to the math kernel (the pinned kernel a CPU has)."""
    args, grad = laid_out(SDPA_PROBLEMS[case], LAYOUTS[layout])
    assert_meets_oracle(args, run_as_laid_out(adapter(), args, grad), grad)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sdpa_flash_on_the_cpu_flash_kernel(layout):
    problem = Problem((6, 3, 6), (6, 3, 6), heads_q=4, heads_kv=2, head_dim=16, dtype="bfloat16",
                      causal="bottom_right", seed=3)
    args, grad = laid_out(problem, LAYOUTS[layout])
    assert_meets_oracle(args, run_as_laid_out(SdpaFlash(), args, grad), grad)


class NjtSdpaMath(NjtSdpa):
    """njt-sdpa's nested tensors through SDPA's math kernel, the NJT kernel a CPU has: non-causal, and only
    for values that are contiguous (``_can_use_math_sdpa_jagged``), so strided q, k, v are checked on a GPU."""

    kernel_name = "MATH"


@pytest.mark.parametrize("layout", PACKED_QKV)
def test_njt_sdpa_nested_tensors(layout):
    problem = Problem((3, 5, 1), (4, 6, 2), heads_q=2, heads_kv=2, head_dim=8, seed=4)
    args, grad = laid_out(problem, LAYOUTS[layout])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the nested tensor API announces itself as a prototype
        run = run_as_laid_out(NjtSdpaMath(), args, grad)
    assert_meets_oracle(args, run, grad)


def test_njt_offsets_are_made_int64_and_keep_their_strides(monkeypatch):
    seen = []
    real = torch.nested.nested_tensor_from_jagged
    monkeypatch.setattr(torch.nested, "nested_tensor_from_jagged",
                        lambda values, offsets, **kw: seen.append((values, offsets)) or real(values, offsets, **kw))
    problem = Problem((3, 5), (4, 6), heads_q=2, heads_kv=2, head_dim=8, seed=4)
    args, _ = laid_out(problem, LAYOUTS["all_at_once"])
    with warnings.catch_warnings(), pytest.raises(NotImplementedError, match="MATH kernel refused"):
        warnings.simplefilter("ignore")
        NjtSdpaMath().forward(args)  # the CPU's NJT math kernel takes contiguous values only (see above)
    assert [values is given for (values, _), given in zip(seen, (args.q, args.k, args.v))] == [True] * 3
    assert all(offsets.dtype == torch.int64 and offsets.stride(0) == 2 for _, offsets in seen)
    args32, _ = laid_out(problem, LAYOUTS["strided_offsets"])
    seen.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        NjtSdpaMath().forward(args32)
    assert all(offsets.dtype == torch.int64 for _, offsets in seen)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path of flex")
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_flex_on_cpu(layout):
    problem = Problem((5, 0, 9), (7, 3, 9), heads_q=4, heads_kv=2, head_dim=16, head_dim_v=24,
                      causal="bottom_right", seed=1)
    args, _ = laid_out(problem, LAYOUTS[layout])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex warns that eager mode is unfused
        run = run_as_laid_out(Flex(), args)
    assert run.lse is not None
    assert_meets_oracle(args, run)


# -- flash-attn (FA2) against a stand-in -------------------------------------------------------------------

def _check_offsets_as_flash_api(**offsets: torch.Tensor) -> None:
    """The checks of ``mha_varlen_fwd`` / ``mha_varlen_bwd`` on the offsets (FA2's csrc/flash_attn/flash_api.cpp,
    PyTorch's vendored copy alike)."""
    for name, t in offsets.items():
        if t.dtype != torch.int32:
            raise RuntimeError(f"{name} must have dtype int32")
        if not t.is_contiguous():
            raise RuntimeError(f"{name} must be contiguous")


def _check_unit_last_stride(*tensors: torch.Tensor) -> None:
    if any(t.stride(-1) != 1 for t in tensors):
        raise RuntimeError("Input tensor must have contiguous last dimension")


def _fa2_attention(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal):
    """FA2's varlen result in plain torch: out in the input dtype, natural-log LSE [H, total_q] with +inf for
    a row without a visible key (its non-split kernel's value)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    exact = oracle.attention(AttentionArgs(q, k, v, cu_q, cu_k, max_q, max_k, "bottom_right" if causal else "none",
                                           scale), torch.float32)
    lse = torch.where(exact.lse == float("-inf"), float("inf"), exact.lse)
    return exact.out.to(q.dtype), lse


def _fa2_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                     softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                     deterministic=False, return_attn_probs=False, block_table=None):
    """flash_attn 2.8's ``flash_attn_varlen_func``: ``maybe_contiguous`` on q, k, v, then the C++ checks."""
    assert dropout_p == 0.0 and window_size == (-1, -1) and softcap == 0.0 and alibi_slopes is None
    q, k, v = (t.contiguous() if t.stride(-1) != 1 else t for t in (q, k, v))
    _check_offsets_as_flash_api(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    _check_unit_last_stride(q, k, v)
    out, lse = _fa2_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal)
    return (out, lse, None) if return_attn_probs else out


@pytest.fixture
def fa2_stand_in(monkeypatch):
    module = types.ModuleType("flash_attn")
    module.flash_attn_varlen_func = _fa2_varlen_func
    monkeypatch.setitem(sys.modules, "flash_attn", module)


FA2_PROBLEM = Problem((5, 0, 9), (7, 3, 9), heads_q=4, heads_kv=2, head_dim=16, dtype="float16",
                      causal="bottom_right", seed=5)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_flash_attn(fa2_stand_in, layout):
    args, grad = laid_out(FA2_PROBLEM, LAYOUTS[layout])
    assert_meets_oracle(args, run_as_laid_out(FlashAttn2(), args, grad), grad)


def test_flash_attn_stand_in_refuses_what_flash_attn_refuses():
    """Without the adapter's conversion the offsets would be refused, as FA2's C++ refuses them."""
    args, _ = laid_out(FA2_PROBLEM, LAYOUTS["strided_offsets"])
    call = (args.q, args.k, args.v)
    with pytest.raises(RuntimeError, match="cu_seqlens_q must be contiguous"):
        _fa2_varlen_func(*call, args.cu_seqlens_q, args.cu_seqlens_k.contiguous(), 9, 9)
    with pytest.raises(RuntimeError, match="cu_seqlens_k must have dtype int32"):
        _fa2_varlen_func(*call, args.cu_seqlens_q.contiguous(), args.cu_seqlens_k.contiguous().long(), 9, 9)


# -- varlen-attn against a stand-in -------------------------------------------------------------------------

def _varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                 window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
    """``torch.nn.attention.varlen.varlen_attn`` of torch 2.13: its own head-count checks, then the vendored
    flash kernel's checks on what it hands over unchanged."""
    if not enable_gqa and query.size(1) != key.size(1):
        raise ValueError("Expect query and key/value to have the same number of heads")
    assert seqused_k is None and block_table is None and num_splits is None
    assert window_size in ((-1, -1), (-1, 0))
    _check_offsets_as_flash_api(cu_seqlens_q=cu_seq_q, cu_seqlens_k=cu_seq_k)
    _check_unit_last_stride(query, key, value)
    out, lse = _fa2_attention(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale, window_size == (-1, 0))
    return (out, lse) if return_aux is not None and return_aux.lse else out


@pytest.fixture
def varlen_stand_in(monkeypatch):
    import torch.nn.attention.varlen as varlen

    assert inspect.signature(_varlen_attn).parameters.keys() >= {"scale", "window_size", "enable_gqa"}
    monkeypatch.setattr(varlen, "varlen_attn", _varlen_attn)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_varlen_attn(varlen_stand_in, layout):
    backend = VarlenAttn()
    problem = FA2_PROBLEM if backend.capabilities.gqa else FA2_PROBLEM.replace(heads_kv=4)
    args, grad = laid_out(problem, LAYOUTS[layout])
    assert_meets_oracle(args, run_as_laid_out(backend, args, grad), grad)


def test_varlen_attn_copies_only_a_tensor_without_a_unit_last_stride(varlen_stand_in, monkeypatch):
    """The vendored kernel checks the last stride; the other strides reach it as the caller gave them."""
    import torch.nn.attention.varlen as varlen

    seen = []

    def recording(q, k, v, *rest, **options):
        seen.append((q, k, v))
        return _varlen_attn(q, k, v, *rest, **options)

    monkeypatch.setattr(varlen, "varlen_attn", recording)
    args, _ = laid_out(FA2_PROBLEM.replace(heads_kv=4), LAYOUTS["split_kv_expanded_grad"])
    transposed_q = args.q.transpose(1, 2).contiguous().transpose(1, 2)  # same values, last stride != 1
    VarlenAttn().forward(args.replace(q=transposed_q))
    (q, k, v), = seen
    assert q.is_contiguous() and torch.equal(q, args.q)
    assert k is args.k and v is args.v


# -- the real libraries, on a GPU (skipped elsewhere) ---------------------------------------------------------
# What the stand-ins cannot show: each vendor's kernels reading the layouts the adapters hand over. FlashInfer
# has its own (tests/test_flashinfer_adapter.py).

GPU_ADAPTERS = ("fa4", "flash-attn", "varlen-attn", "njt-sdpa", "tlx-jfa", "flex",
                "sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math")
GPU_PROBLEMS = (
    Problem((5, 17, 130), (9, 17, 200), heads_q=2, heads_kv=2, head_dim=64, dtype="bfloat16", seed=8),
    Problem((3, 64, 65), (7, 64, 65), heads_q=4, heads_kv=2, head_dim=128, dtype="float16",
            causal="bottom_right", seed=9),
)


# Layouts a vendor kernel faults on with a sticky device error (the process's CUDA context is lost after
# it). They run last in the adapter's own process and must still fault: one that runs clean fails the test,
# so a fix upstream is noticed and the entry removed.
KNOWN_FAULTS = {
    ("varlen-attn", "unaligned_qkv"): "torch.nn.attention.varlen_attn on q/k/v without a 16-byte aligned base: "
                                      "CUDA error: misaligned address (the spec's edge_case:misaligned_views "
                                      "reports it as a crash)",
}


def sweep(name: str, device: str) -> list[dict]:
    """Every problem of GPU_PROBLEMS in every layout through adapter ``name`` on ``device``, one record
    per (problem, layout): ``ok``, ``failed`` (verdicts beyond the allowance), ``refused`` (the adapter's
    run-time refusal), ``error`` (anything else raised), ``fault`` (a device error: the context is unusable,
    so the layouts after it are ``not reached``). The device is synchronised after every call, so an
    asynchronous fault is named at the layout that caused it. Known faults run last."""
    from conformance import registry
    from conformance.harness import device_error

    backend = registry.resolve(name)
    layouts = sorted(LAYOUTS, key=lambda layout: (name, layout) in KNOWN_FAULTS)
    plan = [(i, problem, layout) for layout in layouts for i, problem in enumerate(GPU_PROBLEMS)
            if not backend.not_supported_reasons(problem)
            and not (name == "tlx-jfa" and LAYOUTS[layout].offsets_strided)]  # tlx-jfa: read stride-blind by the op
    records, dead = [], None
    for i, problem, layout in plan:
        record = {"problem": i, "layout": layout}
        records.append(record)
        if dead is not None:
            record.update(status="not reached", detail=dead)
            continue
        gradients = backend.capabilities.backward and not (name == "tlx-jfa" and problem.heads_q != problem.heads_kv)
        try:
            args, grad = laid_out(problem, LAYOUTS[layout], device)
            run = run_as_laid_out(backend, args, grad if gradients else None)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            failed = [str(v) for v in verdicts(args, run, grad if gradients else None) if not v.ok]
            record.update(status="failed", detail="; ".join(failed)) if failed else record.update(status="ok")
        except NotImplementedError as exc:
            record.update(status="refused", detail=str(exc))
        except Exception as exc:  # noqa: BLE001 - every outcome is a record
            message = f"{type(exc).__name__}: {exc}".splitlines()[0]
            if device_error(str(exc)):
                record.update(status="fault", detail=message)
                dead = f"after the fault in {layout}"
            else:
                record.update(status="error", detail=message)
    return records


def sweep_in_child(name: str, device: str, timeout: float = 400) -> list[dict]:
    """:func:`sweep` in a process of its own: a device fault there leaves this process's context alone."""
    import json
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = ("import json, sys; sys.path[:0] = [sys.argv[3], sys.argv[3] + '/tests']; "
            "import test_adapter_layouts as t; print('SWEEP ' + json.dumps(t.sweep(sys.argv[1], sys.argv[2])))")
    done = subprocess.run([sys.executable, "-c", code, name, device, str(root)], capture_output=True, text=True,
                          timeout=timeout, cwd=root)
    lines = [line for line in done.stdout.splitlines() if line.startswith("SWEEP ")]
    assert done.returncode == 0 and lines, f"the sweep of {name} exited {done.returncode}: {done.stderr[-2000:]}"
    return json.loads(lines[-1][len("SWEEP "):])


def judge_sweep(name: str, records: list[dict]) -> list[str]:
    """What is wrong in a sweep of adapter ``name``: every record not ok or refused, except the declared
    faults that faulted; and every declared fault that ran clean (a stale declaration)."""
    problems = []
    for r in records:
        declared = (name, r["layout"]) in KNOWN_FAULTS
        if r["status"] in ("ok", "refused") and not declared or declared and r["status"] == "fault":
            continue
        if declared and r["status"] == "not reached":
            continue  # the declared fault of another problem came first
        if declared and r["status"] == "ok":
            problems.append(f"{r['layout']} (problem {r['problem']}) runs clean now: remove it from KNOWN_FAULTS "
                            f"({KNOWN_FAULTS[name, r['layout']]})")
        else:
            problems.append(f"{r['layout']} (problem {r['problem']}): {r['status']}: {r.get('detail', '')}")
    return problems


def test_the_sweep_judges_faults_refusals_and_stale_declarations():
    ok = {"problem": 0, "status": "ok"}
    assert judge_sweep("sdpa", [dict(ok, layout="int64_offsets"), dict(ok, layout="unaligned_qkv",
                                                                       status="refused", detail="no")]) == []
    assert judge_sweep("varlen-attn", [dict(ok, layout="int64_offsets"), dict(ok, layout="unaligned_qkv", status="fault"),
                                       dict(ok, problem=1, layout="unaligned_qkv", status="not reached")]) == []
    stale = judge_sweep("varlen-attn", [dict(ok, layout="unaligned_qkv")])
    assert len(stale) == 1 and "runs clean now" in stale[0]
    wrong = judge_sweep("sdpa", [dict(ok, layout="permuted_grad", status="failed", detail="dq 3x"),
                                 dict(ok, layout="all_at_once", status="not reached", detail="after the fault")])
    assert len(wrong) == 2 and "dq 3x" in wrong[0]
    assert all(layout in LAYOUTS and name in GPU_ADAPTERS for name, layout in KNOWN_FAULTS)


def test_a_sweep_runs_in_a_process_of_its_own():
    # on the CPU through the sdpa adapter: every problem in every layout, meeting the oracle
    records = sweep_in_child("sdpa", "cpu")
    assert {r["layout"] for r in records} == set(LAYOUTS)
    assert len(records) == len(LAYOUTS) * len(GPU_PROBLEMS)
    assert judge_sweep("sdpa", records) == [], records


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", GPU_ADAPTERS)
def test_real_adapters_under_caller_layouts(name):
    from conformance import registry

    reason = registry.resolve(name).unavailable_reason("cuda")
    if reason is not None:
        pytest.skip(reason)
    problems = judge_sweep(name, sweep_in_child(name, "cuda"))
    assert not problems, "\n".join(problems)
