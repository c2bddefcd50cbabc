"""The kernel as PyTorch custom operators, for torch.compile.

Inside a compiled region ``jagged_flash_attention`` and ``JaggedPlan`` call
``torch.ops.jfa_conformance.jagged_attention_forward`` instead of the autograd Function: dynamo and
AOTAutograd see one opaque operator with a shape-only fake implementation (``fullgraph=True`` works), and
its registered backward calls ``jagged_attention_backward``.  Each operator runs the same host code and
kernels as an eager call (validation, the cached schedule, the module switches), at run time.

Two differences from eager, both because an operator takes tensors and plain values only: the backward
reads the module switches when it runs (eager's backward acts on those its forward read), and a plan's
offsets are read on the host at each call, as in a plain call (a plan's eager calls never wait for the GPU).
"""
from typing import Optional, Tuple

import torch

from . import jfa

Tensor = torch.Tensor


@torch.library.custom_op("jfa_conformance::jagged_attention_forward", mutates_args=())
def jagged_attention_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                             max_seqlen_q: Optional[int], max_seqlen_k: Optional[int], causal: bool,
                             softmax_scale: Optional[float], broadcast_q: bool,
                             deterministic: bool) -> Tuple[Tensor, Tensor]:
    prepared = jfa._prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                            broadcast_q, deterministic)
    return jfa._forward(*prepared)


@jagged_attention_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, broadcast_q,
      deterministic):
    # output rows: the packed queries, or one copy of the shared queries per sequence (broadcast-Q)
    rows = q.shape[0] * (cu_seqlens_k.shape[0] - 1) if broadcast_q else q.shape[0]
    return (q.new_empty((rows, q.shape[1], v.shape[2])),
            q.new_empty((q.shape[1], rows), dtype=torch.float32))


@torch.library.custom_op("jfa_conformance::jagged_attention_backward", mutates_args=())
def jagged_attention_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                              cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: Optional[int],
                              max_seqlen_k: Optional[int], causal: bool, softmax_scale: Optional[float],
                              broadcast_q: bool, deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    (q2, k2, v2, cu_q, cu_k, s, cfgs, causal_, scale, broadcast, _) = jfa._prepare(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, broadcast_q,
        deterministic)
    return jfa._backward(grad_out, q2, k2, v2, out, lse, cu_q, cu_k, s, cfgs, causal_, scale, broadcast)


@jagged_attention_backward.register_fake
def _(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
      softmax_scale, broadcast_q, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


_NON_TENSOR_ARGS = ("max_seqlen_q", "max_seqlen_k", "causal", "softmax_scale", "broadcast_q", "deterministic")


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, *rest = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], cu_q, cu_k)
    ctx.rest = rest
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = jagged_attention_backward(grad_out.contiguous(), q, k, v, out, lse, cu_q, cu_k, *ctx.rest)
    return (dq, dk, dv, None, None) + (None,) * len(_NON_TENSOR_ARGS)


jagged_attention_forward.register_autograd(_backward, setup_context=_setup_context)
