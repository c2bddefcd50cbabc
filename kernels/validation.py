"""What a call must satisfy: a ValueError naming the field for a malformed call (the spec's input rules,
with the same messages), a NotImplementedError for a device the kernels do not run on.

Reading the offsets' values means copying them to the host, which waits for the GPU work queued before
them; a call does it only where the offsets are on the CPU already, or where the Config asks for it
(``check_offsets``), and a JaggedPlan once.  Elsewhere the kernels read clamped offsets (schedule.py), so
malformed ones give wrong answers but touch no memory outside the call's tensors.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .tl import INTERPRET

# Head dims compiled and checked on the H200 and under the interpreter.
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DTYPE_NAMES = "float32, float16 or bfloat16"


def _check_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name} must be {_DTYPE_NAMES}, got {t.dtype}")
    if t.dim() != 3:
        raise ValueError(f"{name} must be 3-D [rows, heads, head_dim], got shape {tuple(t.shape)}")


def _offsets_meta(name, cu, device):
    if not isinstance(cu, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.device != device:
        raise ValueError(f"{name} must be on the device of q ({device}), got {cu.device}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be int32 or int64, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must be 1-D with B+1 >= 1 entries, got shape {tuple(cu.shape)}")


def _offsets_values(name, cu, rows, rows_field):
    values = cu.detach().to("cpu", torch.int64).numpy()
    if values[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {values[0]}")
    down = np.flatnonzero(np.diff(values) < 0)
    if down.size:
        i = int(down[0]) + 1
        raise ValueError(f"{name} must be non-decreasing, but {name}[{i}]={values[i]} < "
                         f"{name}[{i - 1}]={values[i - 1]}")
    if values[-1] != rows:
        raise ValueError(f"{name}[-1]={values[-1]} must equal the number of rows of {rows_field} ({rows})")
    return values


def max_seqlen(name, bound):
    """A max_seqlen argument: None, or an int (numpy's too) that is not a bool."""
    if bound is None:
        return None
    if isinstance(bound, bool) or not isinstance(bound, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {type(bound).__name__}")
    return int(bound)


def validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, broadcast_q, softmax_scale,
             read_offsets: bool) -> None:
    """Checks a call.  Everything the host knows without reading a tensor's values is always checked; the
    offsets' values (start, order, end, the max_seqlen bounds) only with ``read_offsets``, which copies
    them to the host."""
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
    for name, d in (("head_dim", q.shape[2]), ("v head_dim", v.shape[2])):
        if d not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"{name} {d} not supported (supported: {', '.join(map(str, SUPPORTED_HEAD_DIMS))})")
    bounds = [max_seqlen("max_seqlen_q", max_seqlen_q), max_seqlen("max_seqlen_k", max_seqlen_k)]
    if softmax_scale is not None:
        try:
            scale = float(softmax_scale)
        except (TypeError, ValueError):
            raise ValueError(f"softmax_scale must be a number, got {softmax_scale!r}") from None
        if not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"softmax_scale must be finite and positive, got {softmax_scale}")
    _offsets_meta("cu_seqlens_k", cu_seqlens_k, q.device)
    _offsets_meta("cu_seqlens_q", cu_seqlens_q, q.device)
    if broadcast_q:
        if cu_seqlens_q.shape[0] != 2:
            raise ValueError(f"cu_seqlens_q must be [0, Lq] with broadcast_q, got {cu_seqlens_q.shape[0]} entries")
    elif cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise ValueError(f"cu_seqlens_q ({cu_seqlens_q.shape[0]} entries) and cu_seqlens_k "
                         f"({cu_seqlens_k.shape[0]} entries) must have the same length")
    if read_offsets:
        cu_k = _offsets_values("cu_seqlens_k", cu_seqlens_k, k.shape[0], "k")
        cu_q = _offsets_values("cu_seqlens_q", cu_seqlens_q, q.shape[0], "q")
        lens_k = np.diff(cu_k)
        lens_q = np.full(lens_k.shape[0], cu_q[1], dtype=np.int64) if broadcast_q else np.diff(cu_q)
        for name, bound, lens in (("max_seqlen_q", bounds[0], lens_q), ("max_seqlen_k", bounds[1], lens_k)):
            longest = int(lens.max()) if lens.size else 0
            if bound is not None and bound < longest:
                raise ValueError(f"{name}={bound} is smaller than the longest sequence ({longest})")
    if q.device.type == "cpu":
        if not INTERPRET:
            raise NotImplementedError("CPU tensors need TRITON_INTERPRET=1 set before triton is imported; "
                                      "otherwise use CUDA tensors")
    elif q.device.type != "cuda":
        raise NotImplementedError(f"device {q.device} not supported")
