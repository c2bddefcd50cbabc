"""Malformed calls, one per input rule of the packed layout (conformance/validation.py): each must be
rejected with a ValueError that names the offending field, by the harness before any backend runs and
by the project's own Triton kernel."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # the Triton kernel runs under its interpreter on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

from conformance import registry
from conformance.harness import call_backend
from conformance.problem import AttentionArgs, Problem, make_inputs

# Two sequences, GQA 4 -> 2, a head dim every backend and the kernel accept.
GOOD = Problem((3, 5), (4, 6), heads_q=4, heads_kv=2, head_dim=16)
BROADCAST = Problem((5, 5), (4, 6), heads_q=4, heads_kv=2, head_dim=16, broadcast_q=True)
OTHER_DEVICE = "meta"  # a second device that exists on every machine


def _int(t):
    return t.to(torch.int32)


def _cu(values, like):
    return torch.tensor(values, dtype=like.dtype, device=like.device)


# (id, problem, change to the good call, words the error message must contain)
MALFORMED = [
    ("q_not_a_tensor", GOOD, lambda a: a.replace(q=a.q.tolist()), "q must be a torch.Tensor"),
    ("q_integer_dtype", GOOD, lambda a: a.replace(q=_int(a.q)), "q must be float32"),
    ("k_not_3d", GOOD, lambda a: a.replace(k=a.k.flatten(1)), "k must be 3-D"),
    ("mixed_dtypes", GOOD, lambda a: a.replace(v=a.v.half()), "q, k, v must share one dtype"),
    ("mixed_devices", GOOD, lambda a: a.replace(k=a.k.to(OTHER_DEVICE)), "q, k, v must be on one device"),
    ("head_dim_q_k_differ", GOOD, lambda a: a.replace(k=a.k[..., :8].contiguous()), "head_dim of q (16) and k (8)"),
    ("head_dim_zero", GOOD, lambda a: a.replace(q=a.q[..., :0], k=a.k[..., :0]), "head_dim must be positive"),
    ("k_v_rows_differ", GOOD, lambda a: a.replace(v=a.v[:-1]), "k and v must have the same number of rows"),
    ("k_v_heads_differ", GOOD, lambda a: a.replace(v=a.v[:, :1]), "k and v must have the same number of heads"),
    ("heads_not_a_multiple", GOOD, lambda a: a.replace(q=a.q[:, :3]), "Hq (3) must be a positive multiple of Hkv (2)"),
    ("offsets_not_a_tensor", GOOD, lambda a: a.replace(cu_seqlens_q=a.cu_seqlens_q.tolist()), "cu_seqlens_q must be a torch.Tensor"),
    ("offsets_float_dtype", GOOD, lambda a: a.replace(cu_seqlens_k=a.cu_seqlens_k.float()), "cu_seqlens_k must be int32 or int64"),
    ("offsets_on_other_device", GOOD, lambda a: a.replace(cu_seqlens_k=a.cu_seqlens_k.to(OTHER_DEVICE)), "cu_seqlens_k must be on the device of q"),
    ("offsets_not_1d", GOOD, lambda a: a.replace(cu_seqlens_k=a.cu_seqlens_k[None]), "cu_seqlens_k must be 1-D"),
    ("offsets_first_not_zero", GOOD, lambda a: a.replace(cu_seqlens_q=_cu([1, 3, 8], a.cu_seqlens_q)), "cu_seqlens_q[0] must be 0"),
    ("offsets_decreasing", GOOD, lambda a: a.replace(cu_seqlens_k=_cu([0, 11, 10], a.cu_seqlens_k)), "cu_seqlens_k must be non-decreasing"),
    ("offsets_last_not_rows", GOOD, lambda a: a.replace(cu_seqlens_q=_cu([0, 3, 7], a.cu_seqlens_q)), "cu_seqlens_q[-1]=7 must equal the number of rows of q (8)"),
    ("offsets_lengths_differ", GOOD, lambda a: a.replace(cu_seqlens_q=_cu([0, 8], a.cu_seqlens_q), max_seqlen_q=8),
     "cu_seqlens_q (2 entries) and cu_seqlens_k (3 entries) must have the same length"),
    ("broadcast_q_offsets_not_0_lq", BROADCAST, lambda a: a.replace(cu_seqlens_q=_cu([0, 2, 5], a.cu_seqlens_q)),
     "cu_seqlens_q must be [0, Lq] with broadcast_q"),
    ("max_seqlen_q_too_small", GOOD, lambda a: a.replace(max_seqlen_q=4), "max_seqlen_q=4 is smaller than the longest sequence (5)"),
    ("max_seqlen_k_too_small", GOOD, lambda a: a.replace(max_seqlen_k=0), "max_seqlen_k=0 is smaller than the longest sequence (6)"),
    ("max_seqlen_not_an_int", GOOD, lambda a: a.replace(max_seqlen_k=6.0), "max_seqlen_k must be an int"),
    ("scale_nan", GOOD, lambda a: a.replace(softmax_scale=float("nan")), "softmax_scale must be finite and positive"),
    ("scale_infinite", GOOD, lambda a: a.replace(softmax_scale=float("inf")), "softmax_scale must be finite and positive"),
    ("scale_zero", GOOD, lambda a: a.replace(softmax_scale=0.0), "softmax_scale must be finite and positive"),
    ("scale_negative", GOOD, lambda a: a.replace(softmax_scale=-0.125), "softmax_scale must be finite and positive"),
]
CASES = [pytest.param(problem, change, words, id=name) for name, problem, change, words in MALFORMED]


def malformed_args(problem: Problem, change) -> AttentionArgs:
    good = make_inputs(problem, "cpu")
    return change(good)


def test_the_table_covers_every_rule():
    """Every ``raise ValueError`` line of the validator runs for some row of the table, so a new rule
    without a row fails here."""
    import inspect
    import sys

    from conformance import validation

    source = inspect.getsource(validation).splitlines()
    rule_lines = {number for number, line in enumerate(source, start=1) if "raise ValueError(" in line}
    path, reached = validation.__file__, set()

    def trace(frame, event, arg):
        if frame.f_code.co_filename == path and event == "line":
            reached.add(frame.f_lineno)
        return trace

    sys.settrace(trace)
    try:
        for _, problem, change, _ in MALFORMED:
            args = malformed_args(problem, change)
            with pytest.raises(ValueError):
                validation.validate_packed_inputs(
                    args.q, args.k, args.v, args.cu_seqlens_q, args.cu_seqlens_k, args.max_seqlen_q,
                    args.max_seqlen_k, broadcast_q=args.broadcast_q, softmax_scale=args.softmax_scale,
                )
    finally:
        sys.settrace(None)
    missing = sorted(rule_lines - reached)
    assert not missing, f"rules of conformance/validation.py without a malformed case: lines {missing}"


def test_the_good_call_is_accepted():
    for problem in (GOOD, BROADCAST):
        run = call_backend(registry.resolve("reference"), make_inputs(problem, "cpu"))
        assert run.out.shape[0] == problem.out_rows


CPU_BACKENDS = [b.name for b in registry.available("cpu")]


@pytest.mark.parametrize("backend_name", CPU_BACKENDS)
@pytest.mark.parametrize("problem, change, words", CASES)
def test_harness_rejects_before_the_backend_runs(backend_name, problem, change, words, monkeypatch):
    backend = registry.resolve(backend_name)
    called = []
    monkeypatch.setattr(backend, "forward", lambda args: called.append(args))
    with pytest.raises(ValueError) as excinfo:
        call_backend(backend, malformed_args(problem, change))
    assert words in str(excinfo.value)
    assert not called, f"{backend_name}.forward ran on a malformed call"


def _kernel():
    try:
        from kernels import jagged_flash_attention
    except ImportError as exc:
        pytest.skip(f"the Triton kernel is not importable: {exc}")
    return jagged_flash_attention


@pytest.mark.parametrize("problem, change, words", CASES)
def test_kernel_rejects(problem, change, words):
    """The kernel has its own validator (it imports nothing from the suite): the same rules, the same words."""
    jagged_flash_attention = _kernel()
    args = malformed_args(problem, change)
    with pytest.raises(ValueError) as excinfo:
        jagged_flash_attention(
            args.q, args.k, args.v, args.cu_seqlens_q, args.cu_seqlens_k, args.max_seqlen_q, args.max_seqlen_k,
            causal=False, softmax_scale=args.softmax_scale, broadcast_q=args.broadcast_q,
        )
    assert words in str(excinfo.value)
