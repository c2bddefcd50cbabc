"""`sdpa`: pad the jagged batch, mask it explicitly, and call ``F.scaled_dot_product_attention``.

Padding and the boolean mask are built from the spec's masking convention; rows with no visible key
get one dummy visible key (SDPA would return NaN for them) and are then zeroed, which also zeroes their
gradients. SDPA returns no LSE. The GPU kernel variants (sdpa-flash, ...) pin SDPA's kernel choice.

Layouts: the offsets (int32 or int64, any strides) are read by value, and the padded batch is gathered
from q, k, v by row index, so every layout the caller may pass is read as it is and SDPA gets the padded
copies; the upstream gradient reaches SDPA's backward as autograd shapes it.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from conformance.backend import Backend, Capabilities
from conformance.problem import CAUSAL_MODES, AttentionArgs, Output, key_visible


def pad_indices(cu: torch.Tensor, lengths: torch.Tensor, width: int):
    """Row index into the packed tensor for each padded slot [B, width], and the validity mask."""
    pos = torch.arange(width, device=cu.device)[None, :]
    valid = pos < lengths[:, None]
    rows = (cu[:-1, None].long() + pos).clamp(min=0)
    return rows, valid, pos


def padded_mask(args: AttentionArgs, width_q: int, width_k: int):
    """The boolean visibility mask [B, Lq_max, Lk_max] and the per-row 'has a visible key' flag."""
    device = args.cu_seqlens_k.device
    len_q = torch.tensor(args.seqlens_q, device=device)
    len_k = torch.tensor(args.seqlens_k, device=device)
    q_pos = torch.arange(width_q, device=device)[None, :, None]
    k_pos = torch.arange(width_k, device=device)[None, None, :]
    visible = key_visible(q_pos, k_pos, len_q[:, None, None], len_k[:, None, None], args.causal)
    visible = visible & (k_pos < len_k[:, None, None]) & (q_pos < len_q[:, None, None])
    return visible, visible.any(-1), len_q, len_k


def sdpa_packed(args: AttentionArgs, kernel_context=contextlib.nullcontext) -> torch.Tensor:
    """Jagged attention through padded SDPA; returns packed out [rows, Hq, Dv]."""
    args = args.with_broadcast_q_expanded()
    hq, hkv = args.q.shape[1], args.k.shape[1]
    if args.q.shape[0] == 0 or args.batch == 0:
        return args.q.new_zeros(0, hq, args.v.shape[2])
    width_q, width_k = max(args.max_seqlen_q, 1), max(args.max_seqlen_k, 1)
    visible, has_key, len_q, len_k = padded_mask(args, width_q, width_k)
    # A row with no visible key sees key 0 (a padded slot if need be); its output is zeroed below.
    dummy = (~has_key)[:, :, None] & (torch.arange(width_k, device=visible.device) == 0)
    mask = (visible | dummy)[:, None]  # [B, 1, Lq, Lk]

    q_rows, q_valid, _ = pad_indices(args.cu_seqlens_q, len_q, width_q)
    k_rows, k_valid, _ = pad_indices(args.cu_seqlens_k, len_k, width_k)
    def gather(t, rows, valid):
        if t.shape[0] == 0:
            return t.new_zeros(*rows.shape, *t.shape[1:])
        padded = t[rows.clamp(max=t.shape[0] - 1)]
        return padded * valid[..., None, None].to(t.dtype)  # [B, L, H, D]
    q = gather(args.q, q_rows, q_valid).transpose(1, 2)
    k = gather(args.k, k_rows, k_valid).repeat_interleave(hq // hkv, dim=2).transpose(1, 2)
    v = gather(args.v, k_rows, k_valid).repeat_interleave(hq // hkv, dim=2).transpose(1, 2)
    with kernel_context():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=args.softmax_scale)
    out = out.transpose(1, 2)  # [B, Lq, Hq, Dv]
    out = torch.where(has_key[:, :, None, None], out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out[q_valid]


class Sdpa(Backend):
    name = "sdpa"
    capabilities = Capabilities(
        compile_s=0.0,  # prebuilt kernels: nothing the warm-up could compile and cache
        devices=("cpu", "cuda"),
        causal_modes=CAUSAL_MODES,
        broadcast_q="emulated",
        lse=False,
        deterministic=False,  # on CUDA its backward accumulates in a varying order (dQ differs by ~1e-8 run to run)
        notes="padded batch + explicit boolean mask through F.scaled_dot_product_attention (returns no LSE)",
    )

    def forward(self, args: AttentionArgs) -> Output:
        return Output(sdpa_packed(args))
