"""Plain callables as backends: any function with flash-attn's varlen signature is testable as is.

    fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, softmax_scale=None)
        -> out | (out, lse)

Causal means bottom-right. If the function takes a ``broadcast_q`` keyword, broadcast-Q problems are
passed natively (q ``[Lq, Hq, D]``, ``cu_seqlens_q = [0, Lq]``); otherwise q is replicated per sequence.
``NotImplementedError`` raised for a case marks that case unsupported, with its message as the reason.
"""
from __future__ import annotations

import inspect

from conformance.backend import Backend, Capabilities
from conformance.problem import AttentionArgs, Output

_CAUSAL_FLAG = {"none": False, "bottom_right": True}


def _accepts_broadcast_q(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins and some C extensions have no signature
        return False
    return "broadcast_q" in params


class CallableBackend(Backend):
    # Capabilities of a callable are not declared, so what it cannot do shows up at run time:
    # a missing LSE or a non-differentiable output is "unsupported", not a contract violation.
    infers_capabilities = True

    def __init__(self, fn, name: str):
        self.fn = fn
        self.name = name
        self.capabilities = Capabilities(
            devices=("cpu", "cuda"),
            causal_modes=tuple(_CAUSAL_FLAG),
            broadcast_q="native" if _accepts_broadcast_q(fn) else "emulated",
            notes="plain callable with the flash-attn varlen signature",
        )

    def forward(self, args: AttentionArgs) -> Output:
        kwargs = {"causal": _CAUSAL_FLAG[args.causal], "softmax_scale": args.softmax_scale}
        if args.broadcast_q:
            kwargs["broadcast_q"] = True
        result = self.fn(
            args.q, args.k, args.v, args.cu_seqlens_q, args.cu_seqlens_k, args.max_seqlen_q, args.max_seqlen_k, **kwargs
        )
        if isinstance(result, (tuple, list)):
            return Output(result[0], result[1] if len(result) > 1 else None)
        return Output(result)
