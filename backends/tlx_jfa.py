"""`tlx-jfa`: Meta's TLX jagged flash attention (``tlx_jfa/src/tlx_jagged_flash_attention.py``).

Installation: the sources are a flat folder of modules, not a package. Point ``JFA_TLX_PATH`` at that
folder (``.../tlx_jfa/src``) or put it on ``PYTHONPATH``; it needs Meta's Triton fork with TLX
(``fbtriton``, ``triton.language.extra.tlx``) and a Blackwell GPU (sm_100: tcgen05, TMEM, CLC).

The adapter calls the raw custom op ``tlx_jagged_flash_attention(query, key, value, query_offset,
key_offset, max_seq_len_q, max_seq_len_kv, output_offset, sm_scale, window_size, broadcast_q, ...)``
which returns ``(o, M)``. Conventions converted here:

* ``M`` is the base-2 logsumexp of the scaled scores, ``[H, rows]``: the natural-log LSE is ``M * ln 2``.
* broadcast-Q is native: ``query`` is the single dense ``[Lq, H, D]`` sequence, ``query_offset = [0, Lq]``,
  and ``output_offset = [0, Lq, 2 Lq, ..., B Lq]`` must be passed for the backward, which reads o and dO
  through it (the forward ignores it).
* ``max_seq_len_q`` sizes the grid and silently truncates longer sequences: the true maximum is passed.
* There is no causal flag (``window_size`` is a symmetric band), so only non-causal attention is offered.

Declared limits from the source: head dim <= 128 and D == Dv (asserted); fp16/bf16 (TMA byte counts assume
2-byte elements); GQA in the forward only (the backward asserts G == 1); the dQ of broadcast-Q is
accumulated with atomics (not deterministic). Inferred, not run: a sequence with queries but no keys
would hang (the MMA warp waits for a softmax barrier that zero iterations never arrive at), and head
dims that are not powers of two read a neighbouring head through the ``next_pow2(D)``-wide TMA tile.

Tensor layouts, from the op's source: the forward copies non-contiguous q, k, v itself
(``expect_contiguous``) but saves the caller's tensors for the backward, whose entry asserts
``do.is_contiguous()`` and ``q.stride() == k.stride() == v.stride() == o.stride() == do.stride()`` (o is
allocated contiguous). So when gradients are wanted q, k, v are handed over contiguous and the upstream
gradient is made contiguous on its way into the op (:class:`ContiguousGrad`); a forward-only call passes
them as they are. The offsets are passed as given (int32 or int64): the kernels load them through typed
pointers, and read them as contiguous without a check, which the spec is there to see.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys

import torch

from conformance.backend import Backend, Capabilities
from conformance.problem import AttentionArgs, Output, Problem

MODULE = "tlx_jagged_flash_attention"
PATH_VARIABLE = "JFA_TLX_PATH"


def _add_source_path() -> None:
    path = os.environ.get(PATH_VARIABLE)
    if path and path not in sys.path:
        sys.path.insert(0, path)


def _module_found(name: str) -> bool:
    try:
        return name in sys.modules or importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class ContiguousGrad(torch.autograd.Function):
    """Identity whose backward hands on a contiguous gradient (TLX's backward asserts ``do.is_contiguous()``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class TlxJfa(Backend):
    name = "tlx-jfa"
    capabilities = Capabilities(
        devices=("cuda",),
        dtypes=("float16", "bfloat16"),
        head_dims=(16, 32, 64, 128),
        value_dim_differs=False,
        causal_modes=("none",),
        broadcast_q="native",
        min_compute_capability=(10, 0),
        notes="tlx_jagged_flash_attention op; LSE = M * ln 2; native broadcast-Q with output_offset; no causal; "
        "GQA forward only; no sequence with queries but no keys",
    )

    def unavailable_reason(self, device: str) -> str | None:
        _add_source_path()
        missing = []
        if not _module_found("triton.language.extra.tlx"):
            missing.append("Meta's Triton fork with TLX (fbtriton; triton.language.extra.tlx is missing)")
        if not _module_found(MODULE):
            missing.append(f"the tlx_jfa sources ({MODULE}.py not importable; set {PATH_VARIABLE} to tlx_jfa/src)")
        kind = torch.device(device).type
        if kind != "cuda":
            missing.append(f"a Blackwell GPU (sm_100+), not {kind}")
        elif not torch.cuda.is_available():
            missing.append("a Blackwell GPU (sm_100+); no CUDA GPU is visible")
        elif torch.cuda.get_device_capability(device) < (10, 0):
            major, minor = torch.cuda.get_device_capability(device)
            missing.append(f"a Blackwell GPU (sm_100+); this one is sm_{major}{minor}")
        return "needs " + "; ".join(missing) if missing else None

    def not_supported_reasons(self, problem: Problem) -> list[str]:
        reasons = super().not_supported_reasons(problem)
        if any(lq and not lk for lq, lk in zip(problem.seqlens_q, problem.seqlens_k)):
            reasons.append("a sequence with queries but no keys is not supported (the kernel would wait forever "
                           "on a barrier; inferred from its source)")
        return reasons

    def forward(self, args: AttentionArgs) -> Output:
        hq, hkv = args.q.shape[1], args.k.shape[1]
        wants_grad = any(t.requires_grad for t in (args.q, args.k, args.v))
        if hq != hkv and wants_grad:
            raise NotImplementedError("TLX JFA has no GQA backward (it asserts G == 1)")
        rows = args.batch * args.q.shape[0] if args.broadcast_q else args.q.shape[0]
        if rows == 0:  # no query row: nothing to launch
            return Output(args.q.new_zeros(0, hq, args.v.shape[2]), torch.zeros(hq, 0, device=args.q.device))
        _add_source_path()
        kernel = importlib.import_module(MODULE).tlx_jagged_flash_attention
        query_offset, key_offset = args.cu_seqlens_q, args.cu_seqlens_k
        output_offset = None
        max_seq_len_q = max(args.seqlens_q, default=0)
        if args.broadcast_q:  # offsets made here take the caller's index type
            lq = args.q.shape[0]
            query_offset = torch.tensor([0, lq], dtype=key_offset.dtype, device=args.q.device)
            output_offset = torch.arange(0, rows + 1, lq, dtype=key_offset.dtype, device=args.q.device)
        q, k, v = args.q, args.k, args.v
        if wants_grad:  # the backward asserts equal, contiguous strides (see above)
            q, k, v = (t.contiguous() for t in (q, k, v))
        out, m = kernel(
            q, k, v, query_offset, key_offset, max_seq_len_q, max(args.seqlens_k, default=0),
            output_offset=output_offset, sm_scale=args.softmax_scale, window_size=None,
            broadcast_q=args.broadcast_q,
        )
        if wants_grad:
            out = ContiguousGrad.apply(out)
        return Output(out, m * math.log(2.0))
