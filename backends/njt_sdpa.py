"""`njt-sdpa`: nested jagged tensors (``torch.nested.nested_tensor_from_jagged``) through SDPA.

q, k and v become ``(B, H, j, D)`` NJTs built on the packed tensors and their offsets (q and k may have
different lengths per sequence), and ``F.scaled_dot_product_attention`` runs on them. The kernel is
pinned to flash: of SDPA's NJT kernels it is the only one with a backward and a defined causal alignment
for Lq != Lk (it calls FlashAttention's varlen forward, bottom-right per sequence; the efficient kernel
would be top-left and has no NJT backward; math refuses ``is_causal`` for NJTs). So: fp16/bf16, equal
q/k/v head dims, no zero-length sequences (the NJT flash path refuses them). NJT SDPA needs equal head
counts (no GQA) and takes no mask; no LSE comes back. An empty batch fails inside SDPA's NJT path
(torch 2.11 on an H200: "min(): Expected reduction dim to be specified for input.numel() == 0").

Tensor layouts: the offsets are made int64, the jagged layout's stated index type ("Jagged layout
specifies that offsets are stored as int64", ``torch/nested/_internal/nested_tensor.py``); their strides
are left alone. q, k and v become NJTs as views, whatever their row and head strides: SDPA's NJT path
(``torch/nested/_internal/sdpa.py``) copies what its kernels cannot read and converts the offsets to the
int32 the flash kernel takes. The upstream gradient reaches PyTorch's backward as autograd gives it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from conformance.backend import Backend, Capabilities
from conformance.problem import AttentionArgs, Output, Problem

from .sdpa_kernels import only_kernel


def _nested(values: torch.Tensor, offsets: torch.Tensor, max_len: int) -> torch.Tensor:
    """``(B, H, j, D)`` NJT over packed ``values [total, H, D]``."""
    njt = torch.nested.nested_tensor_from_jagged(values, offsets=offsets.to(torch.int64), max_seqlen=max(max_len, 1))
    return njt.transpose(1, 2)


class NjtSdpa(Backend):
    name = "njt-sdpa"
    capabilities = Capabilities(
        compile_s=0.0,  # prebuilt kernels: nothing the warm-up could compile and cache
        devices=("cuda",),
        dtypes=("float16", "bfloat16"),
        max_head_dim=256,
        value_dim_differs=False,
        causal_modes=("none", "bottom_right"),
        gqa=False,
        zero_length=False,
        broadcast_q="emulated",
        lse=False,
        min_compute_capability=(8, 0),
        notes="nested_tensor_from_jagged + SDPA pinned to the flash kernel (bottom-right causal, backward); "
        "no GQA, no zero-length sequences, no LSE",
    )

    kernel_name = "FLASH_ATTENTION"  # the SDPA kernel allowed (see above)

    def not_supported_reasons(self, problem: Problem) -> list[str]:
        reasons = super().not_supported_reasons(problem)
        if problem.batch == 0:
            reasons.append("an empty batch is not a nested tensor SDPA accepts (it fails reducing over zero sequences)")
        return reasons

    def forward(self, args: AttentionArgs) -> Output:
        q = _nested(args.q, args.cu_seqlens_q, args.max_seqlen_q)
        k = _nested(args.k, args.cu_seqlens_k, args.max_seqlen_k)
        v = _nested(args.v, args.cu_seqlens_k, args.max_seqlen_k)
        with only_kernel(self.kernel_name):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=args.causal == "bottom_right", scale=args.softmax_scale)
        return Output(out.transpose(1, 2).values())
