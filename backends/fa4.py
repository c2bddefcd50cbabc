"""`fa4`: FlashAttention 4, ``flash_attn.cute.flash_attn_varlen_func`` (PyPI ``flash-attn-4``, CuTe DSL).

Conventions: FA4 already speaks the spec's packed layout (q ``[total_q, Hq, D]``, int32 ``cu_seqlens``),
bottom-right causal per sequence, and a natural-log float32 LSE ``[Hq, total_q]`` (``return_lse=True``).

Broadcast-Q is native: FA4 accepts a dense q ``(B, Lq, H, D)`` with ``cu_seqlens_q=None`` against jagged
k/v, and keeps a stride-0 ``expand`` of the shared query without copying it. That call returns out
``(B, Lq, H, Dv)`` and lse ``(B, H, Lq)``, reshaped here to the packed convention; dQ of the expand is
summed by autograd.

Head dims per architecture (FA4's ``_validate_head_dims``): sm_90 takes any multiple of 8 in 8..256 for
both D and Dv; sm_100/sm_110 take 8..128, or (192, 128), or (256, 256). The forward runs on sm_80 too,
but the backward needs sm_90 or newer, so this adapter asks for sm_90.

Releases: every keyword passed here has the same name and default in 4.0.0b29, b30, b31 and b36 (later
releases only added sparse-MLA options), and all four return ``(out, lse)`` in the layouts above. One
difference reaches this adapter: the dedicated sm_100/sm_110 head-dim-256 forward kernel of 4.0.0b31
asserts that jagged K comes with ``cu_seqlens_q``, so broadcast-Q at (256, 256) on Blackwell is refused
there; that refusal is reported as unsupported rather than as a failure (b29 and b30 run that case without
the check, and their result is judged like any other).

Tensor layouts: the forward of every release listed asserts that ``cu_seqlens_q`` / ``cu_seqlens_k`` are
int32 with ``stride(0) == 1`` (``_flash_attn_fwd`` in ``flash_attn/cute/interface.py``, Dao-AILab/
flash-attention), so the offsets are handed over that way (:func:`fa4_offsets`; ``contiguous()`` alone
would keep the stride of a one-element view). q, k, v and the upstream gradient are passed as they come:
FA4's ``maybe_contiguous`` keeps any layout whose last stride is 1 and whose other strides are 16-byte
multiples (stride 0 included) and copies the rest itself, in the forward and in the backward.
"""
from __future__ import annotations

import torch

from conformance.backend import Backend, Capabilities
from conformance.problem import AttentionArgs, Output, Problem

_BLACKWELL_PAIRS = ((192, 128), (256, 256))


def fa4_offsets(offsets: torch.Tensor) -> torch.Tensor:
    """``offsets`` as FA4 asserts them: int32 with unit stride; values and device unchanged."""
    offsets = offsets.to(torch.int32)
    return offsets if offsets.stride(0) == 1 else offsets.clone(memory_format=torch.contiguous_format)


def _arch_major() -> int | None:
    return torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else None


class FA4(Backend):
    name = "fa4"
    requires = ("flash_attn.cute", "cutlass")

    @property
    def capabilities(self) -> Capabilities:  # head dims depend on the GPU's architecture
        blackwell = _arch_major() in (10, 11)
        return Capabilities(
            devices=("cuda",),
            dtypes=("float16", "bfloat16"),
            max_head_dim=128 if blackwell else 256,
            causal_modes=("none", "bottom_right"),
            broadcast_q="native",
            min_compute_capability=(9, 0),
            compile_s=19.5,  # measured: 469 s over 24 configurations, one H200, 4.0.0b36 on CuTe DSL 4.8.1
            notes="flash_attn.cute.flash_attn_varlen_func; native broadcast-Q (dense stride-0 q, cu_seqlens_q=None); "
            "head dims: multiples of 8, <= 256 on sm_90, <= 128 (or (192,128), (256,256)) on sm_100/sm_110",
        )

    def unavailable_reason(self, device: str) -> str | None:
        reason = super().unavailable_reason(device)
        if reason is None and torch.device(device).type == "cuda":
            major = torch.cuda.get_device_capability(device)[0]
            if major not in (9, 10, 11, 12):
                reason = f"FA4 supports sm_90, sm_100, sm_110 and sm_120 (forward and backward); this GPU is sm_{major}x"
        return reason

    def not_supported_reasons(self, problem: Problem) -> list[str]:
        reasons = [r for r in super().not_supported_reasons(problem) if "head_dim" not in r]
        d, dv = problem.head_dim, problem.value_dim
        if d % 8 or dv % 8:
            reasons.append(f"FA4 needs head dims divisible by 8 (16-byte alignment), got ({d}, {dv})")
        elif _arch_major() in (10, 11):
            if not (d <= 128 and dv <= 128) and (d, dv) not in _BLACKWELL_PAIRS:
                reasons.append(f"(head_dim, head_dim_v) = ({d}, {dv}) is not supported on sm_100/sm_110 "
                               "(8..128 each, or (192, 128), or (256, 256))")
        elif not (8 <= d <= 256 and 8 <= dv <= 256):
            reasons.append(f"(head_dim, head_dim_v) = ({d}, {dv}) is not supported on sm_90 (8..256 each)")
        return reasons

    def forward(self, args: AttentionArgs) -> Output:
        from flash_attn.cute import flash_attn_varlen_func

        grouped = args.q.shape[1] != args.k.shape[1]
        wants_grad = any(t.requires_grad for t in (args.q, args.k, args.v))
        if wants_grad and grouped and args.q.shape[2] != args.v.shape[2] and _arch_major() == 9:
            # FA4 states this in its sm_90 backward (`assert self.same_hdim_kv`); refuse before the forward.
            raise NotImplementedError("FA4's sm_90 backward requires head_dim == head_dim_v under GQA")

        common = dict(
            cu_seqlens_k=fa4_offsets(args.cu_seqlens_k),
            max_seqlen_k=args.max_seqlen_k,
            softmax_scale=args.softmax_scale,
            causal=args.causal == "bottom_right",
            return_lse=True,
        )
        if args.broadcast_q:
            lq, hq = args.q.shape[0], args.q.shape[1]
            dense_q = args.q.unsqueeze(0).expand(args.batch, *args.q.shape)  # stride 0 over the batch
            try:
                out, lse = flash_attn_varlen_func(dense_q, args.k, args.v, cu_seqlens_q=None, max_seqlen_q=lq, **common)
            except AssertionError as exc:  # a declared limit of the installed release, not a wrong result
                if "requires cu_seqlens_q" not in str(exc):
                    raise
                raise NotImplementedError(f"this FA4 release refuses broadcast-Q here: {exc}") from exc
            out = out.reshape(args.batch * lq, hq, out.shape[-1])
            lse = lse.permute(1, 0, 2).reshape(hq, args.batch * lq)  # (B, H, Lq) -> [H, B*Lq]
            return Output(out, lse)
        out, lse = flash_attn_varlen_func(
            args.q, args.k, args.v, cu_seqlens_q=fa4_offsets(args.cu_seqlens_q), max_seqlen_q=args.max_seqlen_q,
            **common,
        )
        return Output(out, lse)
