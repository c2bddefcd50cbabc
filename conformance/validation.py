"""Input rules of the packed layout (see SPEC.md). Every rule raises ``ValueError`` naming the field.

The harness calls this before any backend runs, so every backend is judged on well-formed problems only.
The project's kernels (kernels/validation.py) keep their own copy of these rules, with the same messages,
so that the library stands alone; tests/test_validation.py holds the two to the same table.
"""
from __future__ import annotations

import math

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
OFFSET_DTYPES = (torch.int32, torch.int64)


def _check_offsets(name: str, cu: torch.Tensor, rows: int, rows_field: str) -> list[int]:
    if not isinstance(cu, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype not in OFFSET_DTYPES:
        raise ValueError(f"{name} must be int32 or int64, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must be 1-D with B+1 >= 1 entries, got shape {tuple(cu.shape)}")
    values = cu.tolist()
    if values[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {values[0]}")
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise ValueError(
                f"{name} must be non-decreasing, but {name}[{i}]={values[i]} < {name}[{i - 1}]={values[i - 1]}"
            )
    if values[-1] != rows:
        raise ValueError(f"{name}[-1]={values[-1]} must equal the number of rows of {rows_field} ({rows})")
    return values


def _check_tensor(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")
    if t.dim() != 3:
        raise ValueError(f"{name} must be 3-D [rows, heads, head_dim], got shape {tuple(t.shape)}")


def validate_packed_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    *,
    broadcast_q: bool = False,
    softmax_scale: float | None = None,
) -> tuple[list[int], list[int]]:
    """Check a packed attention call; return the per-sequence lengths ``(seqlens_q, seqlens_k)``.

    With ``broadcast_q`` the returned ``seqlens_q`` is the dense Lq repeated once per K/V sequence.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got q={q.dtype}, k={k.dtype}, v={v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got q={q.device}, k={k.device}, v={v.device}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"head_dim of q ({q.shape[2]}) and k ({k.shape[2]}) must match")
    if q.shape[2] == 0 or v.shape[2] == 0:
        raise ValueError(f"head_dim must be positive, got q={q.shape[2]}, v={v.shape[2]}")
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"k and v must have the same number of rows, got k={k.shape[0]}, v={v.shape[0]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same number of heads, got k={k.shape[1]}, v={v.shape[1]}")
    hq, hkv = q.shape[1], k.shape[1]
    if hkv == 0 or hq == 0 or hq % hkv != 0:
        raise ValueError(f"heads: Hq ({hq}) must be a positive multiple of Hkv ({hkv})")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if isinstance(cu, torch.Tensor) and cu.device != q.device:
            raise ValueError(f"{name} must be on the device of q ({q.device}), got {cu.device}")
    cu_k = _check_offsets("cu_seqlens_k", cu_seqlens_k, k.shape[0], "k")
    batch = len(cu_k) - 1
    cu_q = _check_offsets("cu_seqlens_q", cu_seqlens_q, q.shape[0], "q")
    if broadcast_q:
        if len(cu_q) != 2:
            raise ValueError(f"cu_seqlens_q must be [0, Lq] with broadcast_q, got {len(cu_q)} entries")
        seqlens_q = [cu_q[1]] * batch
    else:
        if len(cu_q) != len(cu_k):
            raise ValueError(
                f"cu_seqlens_q ({len(cu_q)} entries) and cu_seqlens_k ({len(cu_k)} entries) must have the same length"
            )
        seqlens_q = [b - a for a, b in zip(cu_q, cu_q[1:])]
    seqlens_k = [b - a for a, b in zip(cu_k, cu_k[1:])]
    for name, bound, lens in (("max_seqlen_q", max_seqlen_q, seqlens_q), ("max_seqlen_k", max_seqlen_k, seqlens_k)):
        if bound is None:
            continue
        if isinstance(bound, bool) or not isinstance(bound, int):
            raise ValueError(f"{name} must be an int, got {type(bound).__name__}")
        if bound < max(lens, default=0):
            raise ValueError(f"{name}={bound} is smaller than the longest sequence ({max(lens)})")
    if softmax_scale is not None:
        scale = float(softmax_scale)
        if not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"softmax_scale must be finite and positive, got {softmax_scale}")
    return seqlens_q, seqlens_k
