"""The kernel as PyTorch custom operators, for torch.compile.

Inside a compiled region ``jagged_flash_attention`` and ``JaggedPlan`` call
``torch.ops.jfa_conformance.jagged_attention_forward`` instead of the autograd Function: dynamo and
AOTAutograd see one opaque operator with a shape-only fake implementation (``fullgraph=True`` works), and
its registered backward calls ``jagged_attention_backward``.  Both run the same host code and kernels as an
eager call (validation, the tile lists built on the device) when the graph runs, under the Config the call
was traced with (passed as its string), so the backward runs what an eager backward would; having no
forward plan to start from, it builds the sequence order in the same pass as its own lists (the same lists
an eager backward builds from its forward's order; tests/test_schedule.py).  A plan's call
is a plain call with the plan's own offsets.
"""
from typing import Optional, Tuple

import torch

from . import launch
from .config import Config, default
from .plan import prepare

Tensor = torch.Tensor


def _config(text: str) -> Config:
    """The Config a traced call passed: its string, or "" for the environment's (config.default)."""
    return default() if text == "" else Config.from_string(text)


@torch.library.custom_op("jfa_conformance::jagged_attention_forward", mutates_args=())
def jagged_attention_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                             max_seqlen_q: Optional[int], max_seqlen_k: Optional[int], causal: bool,
                             softmax_scale: Optional[float], broadcast_q: bool, config: str) -> Tuple[Tensor, Tensor]:
    return launch.forward(*prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                   softmax_scale, broadcast_q, _config(config)))


@jagged_attention_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, broadcast_q, config):
    # output rows: the packed queries, or one copy of the shared queries per sequence (broadcast-Q)
    rows = q.shape[0] * (cu_seqlens_k.shape[0] - 1) if broadcast_q else q.shape[0]
    return (q.new_empty((rows, q.shape[1], v.shape[2])),
            q.new_empty((q.shape[1], rows), dtype=torch.float32))


@torch.library.custom_op("jfa_conformance::jagged_attention_backward", mutates_args=())
def jagged_attention_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                              cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: Optional[int],
                              max_seqlen_k: Optional[int], causal: bool, softmax_scale: Optional[float],
                              broadcast_q: bool, config: str) -> Tuple[Tensor, Tensor, Tensor]:
    q, k, v, cu_q, cu_k, plan = prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                        softmax_scale, broadcast_q, _config(config), lists="backward")
    return launch.backward(grad_out, q, k, v, out, lse, cu_q, cu_k, plan)


@jagged_attention_backward.register_fake
def _(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
      broadcast_q, config):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, *rest = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], cu_q, cu_k)
    ctx.rest = rest
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = jagged_attention_backward(grad_out.contiguous(), q, k, v, out, lse, cu_q, cu_k, *ctx.rest)
    return (dq, dk, dv, None, None) + (None,) * len(ctx.rest)


jagged_attention_forward.register_autograd(_backward, setup_context=_setup_context)
