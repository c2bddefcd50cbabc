"""`sdpa-flash`, `sdpa-efficient`, `sdpa-cudnn`, `sdpa-math`: SDPA with its kernel choice pinned.

``torch.nn.attention.sdpa_kernel`` allows exactly one kernel, so the dispatcher either runs that kernel
or refuses the call. A refusal ("No available kernel" on CUDA, "No viable backend" on CPU) becomes an unsupported example whose reason is the
dispatcher's own warning, so checks never silently run a different kernel.

The efficient, cuDNN and math kernels take the padded batch with an explicit boolean mask
(:func:`backends.sdpa.sdpa_packed`). The flash kernel takes no mask at all, so ``sdpa-flash`` calls it
once per group of equally long sequences, unpadded; its ``is_causal`` is top-left, which equals
bottom-right only when Lq == Lk. None of them returns an LSE through the public API. Offsets and q, k, v
of any layout are read by value (each kernel gets gathered rows, :mod:`backends.sdpa`).
"""
from __future__ import annotations

import contextlib
import functools
import re
import warnings

import torch
import torch.nn.functional as F

from conformance.backend import Backend, Capabilities
from conformance.problem import CAUSAL_MODES, AttentionArgs, Output, Problem

from .sdpa import sdpa_packed


def _dispatcher_reasons(messages) -> str:
    """The dispatcher's explanations, without its "(Triggered internally at file:line.)" suffixes and the
    bare "X kernel not used because:" headers that precede them."""
    reasons = []
    for message in messages:
        text = re.sub(r"\s*\(Triggered internally at [^)]*\)", "", message).strip()
        if text and not text.endswith("because:") and text not in reasons:
            reasons.append(text)
    return "; ".join(reasons)


@contextlib.contextmanager
def only_kernel(kernel_name: str):
    """Allow only ``SDPBackend.<kernel_name>``; turn the dispatcher's refusal into NotImplementedError."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with warnings.catch_warnings(record=True) as caught, sdpa_kernel([getattr(SDPBackend, kernel_name)]):
        warnings.simplefilter("always")
        try:
            yield
        except RuntimeError as exc:
            if not any(refusal in str(exc) for refusal in ("No available kernel", "No viable backend")):
                raise
            why = _dispatcher_reasons(str(w.message) for w in caught)
            raise NotImplementedError(
                f"SDPA's {kernel_name} kernel refused this call" + (f": {why}" if why else f" ({exc})")
            ) from exc


class _PinnedSdpa(Backend):
    """The padded-batch SDPA path with one kernel allowed."""

    kernel_name = "MATH"

    def forward(self, args: AttentionArgs) -> Output:
        return Output(sdpa_packed(args, functools.partial(only_kernel, self.kernel_name)))


class SdpaEfficient(_PinnedSdpa):
    name = "sdpa-efficient"
    kernel_name = "EFFICIENT_ATTENTION"
    capabilities = Capabilities(
        compile_s=0.0,  # prebuilt kernels (cuDNN builds its plans per process): nothing for the warm-up to cache
        devices=("cuda",),
        causal_modes=CAUSAL_MODES,
        broadcast_q="emulated",
        lse=False,
        min_compute_capability=(5, 0),
        notes="memory-efficient kernel; padded batch with the boolean mask turned into an additive bias (any "
        "causal alignment); fp32/fp16/bf16; returns no LSE",
    )


class SdpaCudnn(_PinnedSdpa):
    name = "sdpa-cudnn"
    kernel_name = "CUDNN_ATTENTION"
    capabilities = Capabilities(
        compile_s=0.0,  # prebuilt kernels (cuDNN builds its plans per process): nothing for the warm-up to cache
        devices=("cuda",),
        dtypes=("float16", "bfloat16"),
        max_head_dim=128,
        value_dim_differs=False,
        causal_modes=CAUSAL_MODES,
        broadcast_q="emulated",
        lse=False,
        min_compute_capability=(8, 0),
        notes="cuDNN attention; padded batch with a [B, 1, Lq, Lk] boolean mask; fp16/bf16, head dim <= 128 "
        "(its backward limit), equal q/k/v head dims; off under torch.use_deterministic_algorithms; no LSE",
    )


class SdpaMath(_PinnedSdpa):
    name = "sdpa-math"
    kernel_name = "MATH"
    capabilities = Capabilities(
        compile_s=0.0,  # prebuilt kernels (cuDNN builds its plans per process): nothing for the warm-up to cache
        devices=("cuda",),
        causal_modes=CAUSAL_MODES,
        broadcast_q="emulated",
        lse=False,
        deterministic=True,
        notes="SDPA's unfused math kernel on GPU (on CPU the plain 'sdpa' backend already runs it); no LSE",
    )


class SdpaFlash(Backend):
    name = "sdpa-flash"
    capabilities = Capabilities(
        compile_s=0.0,  # prebuilt kernels (cuDNN builds its plans per process): nothing for the warm-up to cache
        devices=("cuda",),
        dtypes=("float16", "bfloat16"),
        max_head_dim=256,
        value_dim_differs=False,
        causal_modes=CAUSAL_MODES,
        broadcast_q="emulated",
        lse=False,
        min_compute_capability=(8, 0),
        notes="flash kernel through dense SDPA, one call per group of equal (Lq, Lk), unpadded (it takes no mask); "
        "is_causal is top-left, used for bottom-right only where Lq == Lk; empty sequences are not sent to "
        "the kernel (it refuses length 0) and their rows are 0; no LSE",
    )

    def not_supported_reasons(self, problem: Problem) -> list[str]:
        reasons = super().not_supported_reasons(problem)
        if problem.causal == "bottom_right" and any(
            lq != lk and lq and lk for lq, lk in zip(problem.seqlens_q, problem.seqlens_k)
        ):
            reasons.append(
                "bottom-right causal with Lq != Lk needs a mask, and SDPA's flash kernel takes none "
                "(its is_causal is top-left)"
            )
        return reasons

    def forward(self, args: AttentionArgs) -> Output:
        hq, hkv, dv = args.q.shape[1], args.k.shape[1], args.v.shape[2]
        out = args.q.new_zeros(args.q.shape[0], hq, dv)
        cu_q, cu_k = args.cu_seqlens_q.tolist(), args.cu_seqlens_k.tolist()
        groups: dict[tuple[int, int], list[int]] = {}
        for b in range(args.batch):
            lq, lk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
            if lq and lk:  # rows of sequences without keys stay 0
                groups.setdefault((lq, lk), []).append(b)
        device = args.q.device
        for (lq, lk), seqs in groups.items():
            if args.causal == "bottom_right" and lq != lk:
                raise NotImplementedError("bottom-right causal with Lq != Lk is not expressible with is_causal")
            q_rows = (torch.tensor([cu_q[b] for b in seqs], device=device)[:, None] + torch.arange(lq, device=device)).flatten()
            k_rows = (torch.tensor([cu_k[b] for b in seqs], device=device)[:, None] + torch.arange(lk, device=device)).flatten()
            q = args.q[q_rows].view(len(seqs), lq, hq, -1).transpose(1, 2)
            k = args.k[k_rows].view(len(seqs), lk, hkv, -1).transpose(1, 2)
            v = args.v[k_rows].view(len(seqs), lk, hkv, -1).transpose(1, 2)
            with only_kernel("FLASH_ATTENTION"):
                o = F.scaled_dot_product_attention(
                    q, k, v, is_causal=args.causal != "none", scale=args.softmax_scale, enable_gqa=hq != hkv
                )
            out = out.index_copy(0, q_rows, o.transpose(1, 2).reshape(-1, hq, dv))
        return Output(out)
