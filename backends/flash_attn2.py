"""`flash-attn`: FlashAttention 2, ``flash_attn.flash_attn_varlen_func`` (PyPI ``flash-attn``).

Conventions: packed layout with int32 ``cu_seqlens`` (all four length arguments are required), bottom-right
causal per sequence (since 2.1), natural-log LSE. The LSE comes back only with ``return_attn_probs=True``,
as ``[H, total_q]`` since 2.6.0 and as a padded ``[B, H, max_seqlen_q]`` before; both are converted to the
spec's ``[Hq, total_q]``. A row with no visible key gets LSE **+inf** from FA2's non-split kernel (its
output is 0); the spec's convention is -inf, so +inf is mapped to -inf. There is no dense-q option, so
broadcast-Q is emulated by replicating q.

Tensor layouts (Dao-AILab/flash-attention, ``csrc/flash_attn/flash_api.cpp`` ``mha_varlen_fwd`` and
``mha_varlen_bwd``): ``cu_seqlens`` must be int32 and ``is_contiguous()`` (checked), so they are converted
to that. q, k, v and dout go through ``maybe_contiguous`` in ``flash_attn/flash_attn_interface.py``
(a copy only when the last stride is not 1) and the kernels take row and head strides, so they are
passed as they come.
"""
from __future__ import annotations

import torch

from conformance.backend import Backend, Capabilities
from conformance.problem import AttentionArgs, Output


def packed_lse(lse: torch.Tensor, seqlens_q: list[int]) -> torch.Tensor:
    """FA2's LSE as ``[H, total_q]``: unchanged for >= 2.6, gathered from the padded ``[B, H, Lq_max]`` before."""
    if lse.dim() == 2:
        return lse
    parts = [lse[b, :, :n] for b, n in enumerate(seqlens_q)]
    return torch.cat(parts, dim=1) if parts else lse.new_zeros(lse.shape[1], 0)


def empty_rows_to_minus_inf(lse: torch.Tensor) -> torch.Tensor:
    """FA2 marks rows without a visible key with +inf; the spec (and FA4, flex) say -inf."""
    return torch.where(lse == float("inf"), torch.full_like(lse, float("-inf")), lse)


class FlashAttn2(Backend):
    name = "flash-attn"
    requires = ("flash_attn.flash_attn_interface",)
    capabilities = Capabilities(
        devices=("cuda",),
        dtypes=("float16", "bfloat16"),
        max_head_dim=256,
        value_dim_differs=False,
        causal_modes=("none", "bottom_right"),
        broadcast_q="emulated",
        min_compute_capability=(8, 0),
        notes="flash_attn.flash_attn_varlen_func (FA2); LSE via return_attn_probs, +inf for rows without keys mapped "
        "to -inf; LSE [B, H, Lq_max] of versions < 2.6 repacked; no dense-q option (broadcast-Q emulated)",
    )

    def forward(self, args: AttentionArgs) -> Output:
        from flash_attn import flash_attn_varlen_func

        out, lse, _ = flash_attn_varlen_func(
            args.q, args.k, args.v,
            args.cu_seqlens_q.to(torch.int32).contiguous(), args.cu_seqlens_k.to(torch.int32).contiguous(),
            args.max_seqlen_q, args.max_seqlen_k,
            dropout_p=0.0, softmax_scale=args.softmax_scale, causal=args.causal == "bottom_right",
            return_attn_probs=True,
        )
        return Output(out, empty_rows_to_minus_inf(packed_lse(lse, args.seqlens_q)).float())
