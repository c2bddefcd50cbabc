"""`reference`: the float64 oracle itself as a backend (computes on CPU, returns in the input dtype)."""
from __future__ import annotations

import torch

from conformance import oracle
from conformance.backend import Backend, Capabilities
from conformance.problem import CAUSAL_MODES, AttentionArgs, Output


class Reference(Backend):
    name = "reference"
    capabilities = Capabilities(
        compile_s=0.0,  # float64 torch on the CPU: nothing to compile
        devices=("cpu", "cuda"),
        causal_modes=CAUSAL_MODES,
        broadcast_q="native",
        deterministic=True,
        notes="float64 on CPU whatever the input device; vectorised and memory-bounded",
    )

    def forward(self, args: AttentionArgs) -> Output:
        result = oracle.attention(args, torch.float64)
        return Output(result.out.to(args.q.device, args.q.dtype), result.lse.to(args.q.device, torch.float32))
