"""`varlen-attn`: ``torch.nn.attention.varlen.varlen_attn`` (PyTorch >= 2.10, CUDA only).

It wraps PyTorch's vendored FlashAttention (``aten._flash_attention_forward``), so it inherits FA2's
conventions: packed layout, int32 ``cu_seq_*``, bottom-right causal per sequence, a natural-log LSE
``[H, T_q]`` (the docstring's ``(T_q, H)`` is not what CUDA returns; both are accepted here), and +inf as
the LSE of a row without a visible key, mapped to the spec's -inf.

The signature changed between releases, so it is read at run time: causal is ``is_causal=True`` in the
first release and ``window_size=(-1, 0)`` later; GQA exists only where ``enable_gqa`` does (torch 2.11
has ``scale`` and ``window_size`` but no ``enable_gqa``). An empty batch is refused ("batch size must be
positive").

Tensor layouts: the vendored ``mha_varlen_fwd`` / ``mha_varlen_bwd`` (pytorch/pytorch,
``aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp``) check that ``cu_seq_*`` are int32 and
``is_contiguous()`` and that q, k and v have a unit last stride; ``varlen_attn`` hands its arguments over
unchanged, so the adapter converts exactly that and passes row and head strides through (the kernel takes
them). The upstream gradient needs nothing: ``_flash_attention_backward`` (``attention_backward.cu``) makes
it contiguous itself.
"""
from __future__ import annotations

import functools
import inspect

import torch

from conformance.backend import Backend, Capabilities
from conformance.problem import AttentionArgs, Output, Problem

from .flash_attn2 import empty_rows_to_minus_inf


@functools.lru_cache(maxsize=1)
def _parameters() -> frozenset[str]:
    from torch.nn.attention.varlen import varlen_attn

    return frozenset(inspect.signature(varlen_attn).parameters)


class VarlenAttn(Backend):
    name = "varlen-attn"
    requires = ("torch.nn.attention.varlen",)

    @property
    def capabilities(self) -> Capabilities:  # GQA depends on the installed torch's signature
        try:
            gqa = "enable_gqa" in _parameters()
        except ImportError:
            gqa = False
        return Capabilities(
            compile_s=0.0,  # prebuilt kernels: nothing the warm-up could compile and cache
            devices=("cuda",),
            dtypes=("float16", "bfloat16"),
            max_head_dim=256,
            value_dim_differs=False,
            causal_modes=("none", "bottom_right"),
            gqa=gqa,
            broadcast_q="emulated",
            min_compute_capability=(8, 0),
            notes=f"torch {torch.__version__.split('+')[0]}: varlen_attn over the vendored FlashAttention; "
            f"LSE +inf for rows without keys mapped to -inf; GQA {'via enable_gqa' if gqa else 'absent in this signature'}",
        )

    def not_supported_reasons(self, problem: Problem) -> list[str]:
        reasons = super().not_supported_reasons(problem)
        if problem.batch == 0:
            reasons.append("an empty batch is refused by varlen_attn ('batch size must be positive')")
        return reasons

    def forward(self, args: AttentionArgs) -> Output:
        from torch.nn.attention.varlen import AuxRequest, varlen_attn

        params = _parameters()
        options = {"return_aux": AuxRequest(lse=True)}
        if "scale" in params:
            options["scale"] = args.softmax_scale
        elif args.softmax_scale != args.q.shape[-1] ** -0.5:
            raise NotImplementedError("this varlen_attn has no scale argument; only 1/sqrt(D) is expressible")
        if args.causal == "bottom_right":
            if "is_causal" in params:
                options["is_causal"] = True
            else:
                options["window_size"] = (-1, 0)
        if args.q.shape[1] != args.k.shape[1]:
            options["enable_gqa"] = True
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (args.q, args.k, args.v))
        out, lse = varlen_attn(
            q, k, v, args.cu_seqlens_q.to(torch.int32).contiguous(), args.cu_seqlens_k.to(torch.int32).contiguous(),
            args.max_seqlen_q, args.max_seqlen_k, **options,
        )
        hq, rows = args.q.shape[1], args.q.shape[0]
        if lse.shape == (rows, hq) and lse.shape != (hq, rows):
            lse = lse.transpose(0, 1)
        return Output(out, empty_rows_to_minus_inf(lse).float())
