"""`triton-jfa`: the project's own Triton kernel (kernels/). On CPU it runs under Triton's interpreter."""
from __future__ import annotations

import dataclasses
import os

import torch

from conformance.backend import Backend, Capabilities
from conformance.problem import AttentionArgs, Output, Problem
from kernels import DQ_DETERMINISTIC, SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS, jagged_flash_attention
from kernels.config import default as kernel_config

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _long_sequence():
    """A warm-up batch with one sequence long enough for the Gluon forward (``Config.gluon_split_keys``),
    which the warm-up's small problems never reach, beside a short one for the tl forward."""
    lengths = (1, max(kernel_config().gluon_split_keys, 1) + 88)
    return lengths, lengths


class TritonJfa(Backend):
    name = "triton-jfa"
    requires = ("triton",)
    capabilities = Capabilities(
        devices=("cuda", "cpu"),
        dtypes=tuple(_DTYPE_NAMES[d] for d in SUPPORTED_DTYPES),
        head_dims=tuple(SUPPORTED_HEAD_DIMS),
        broadcast_q="native",
        deterministic=DQ_DETERMINISTIC,
        min_compute_capability=(8, 0),
        compile_s=13.0,  # measured: 394 s over 30 configurations, one H200, Triton 3.6
        notes="forward, dK/dV and dQ kernels over tile lists launched sequence by sequence, heaviest first; "
              "CPU only under TRITON_INTERPRET=1",
    )

    def __init__(self):
        # which kernels answer is part of what a report describes: the kernels' Config (JFA_* environment
        # variables, kernels/README.md) picks them
        self.capabilities = dataclasses.replace(
            self.capabilities, notes=f"{self.capabilities.notes}; kernels.Config {kernel_config()}")
        if _interpreting():  # the interpreter runs every program in Python: keep drawn problems small
            self.capabilities = dataclasses.replace(self.capabilities, max_drawn_rows=160,
                                                    interpreted_by="Triton's interpreter (TRITON_INTERPRET=1)")
        else:
            self.capabilities = dataclasses.replace(self.capabilities, warmup_lengths=(_long_sequence(),))

    def unavailable_reason(self, device: str) -> str | None:
        reason = super().unavailable_reason(device)
        if reason is None and torch.device(device).type == "cpu" and not _interpreting():
            reason = "on CPU it runs only under Triton's interpreter (set TRITON_INTERPRET=1)"
        return reason

    def not_supported_reasons(self, problem: Problem) -> list[str]:
        reasons = super().not_supported_reasons(problem)
        if problem.dtype == "bfloat16" and _interpreting():
            reasons.append(
                "bfloat16 under Triton's interpreter is unusable: tl.dot multiplies the raw bit patterns "
                "(triton-lang/triton#11584); bfloat16 is checked on GPU"
            )
        return reasons

    def forward(self, args: AttentionArgs) -> Output:
        out, lse = jagged_flash_attention(
            args.q, args.k, args.v, args.cu_seqlens_q, args.cu_seqlens_k, args.max_seqlen_q, args.max_seqlen_k,
            causal=args.causal == "bottom_right", softmax_scale=args.softmax_scale, broadcast_q=args.broadcast_q,
        )
        return Output(out, lse)
