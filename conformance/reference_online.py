"""`reference-online`: blockwise online-softmax attention, an implementation independent of the oracle.

It follows FlashAttention's recurrence (running max, rescaled running sum and accumulator over key
blocks), generalised to heads, GQA, both causal alignments, Lq != Lk, broadcast-Q and LSE. Float64 on
CPU; slow by design, for small problems.
"""
from __future__ import annotations

import torch

from conformance.backend import Backend, Capabilities
from conformance.problem import CAUSAL_MODES, AttentionArgs, Output, key_visible

BLOCK = 16


def _sequence(q, k, v, scale, causal, block):
    """Attention of one sequence: q [Lq, Hq, D], k [Lk, Hkv, D], v [Lk, Hkv, Dv] -> out, lse [Hq, Lq]."""
    lq, hq, _ = q.shape
    lk, hkv, dv = v.shape
    k = k.repeat_interleave(hq // hkv, dim=1)  # query head h reads kv head h // (Hq // Hkv)
    v = v.repeat_interleave(hq // hkv, dim=1)
    outs, lses = [], []
    for i0 in range(0, lq, block):
        qi = q[i0 : i0 + block].transpose(0, 1)  # [Hq, bq, D]
        rows = torch.arange(i0, i0 + qi.shape[1])[:, None]
        m = torch.full((hq, qi.shape[1], 1), float("-inf"), dtype=q.dtype)
        l = torch.zeros(hq, qi.shape[1], 1, dtype=q.dtype)
        acc = torch.zeros(hq, qi.shape[1], dv, dtype=q.dtype)
        for j0 in range(0, lk, block):
            kj, vj = k[j0 : j0 + block].transpose(0, 1), v[j0 : j0 + block].transpose(0, 1)
            cols = torch.arange(j0, j0 + kj.shape[1])[None, :]
            s = (qi @ kj.transpose(1, 2)) * scale
            s = s.masked_fill(~key_visible(rows, cols, lq, lk, causal), float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True)).detach()
            # While a row has seen no visible key its max is -inf; shift by 0 so exp() yields 0, not NaN.
            shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m - shift)
            p = torch.exp(s - shift)
            l = alpha * l + p.sum(-1, keepdim=True)
            acc = alpha * acc + p @ vj
            m = m_new
        has_key = l > 0
        safe = torch.where(has_key, l, torch.ones_like(l))
        outs.append((acc / safe).transpose(0, 1))
        lses.append(torch.where(has_key, m + torch.log(safe), torch.full_like(l, float("-inf"))).squeeze(-1))
    if not outs:
        return q.new_zeros(0, hq, dv), q.new_zeros(hq, 0)
    return torch.cat(outs), torch.cat(lses, dim=1)


class ReferenceOnline(Backend):
    name = "reference-online"
    capabilities = Capabilities(
        compile_s=0.0,  # float64 torch on the CPU: nothing to compile
        devices=("cpu", "cuda"),
        causal_modes=CAUSAL_MODES,
        broadcast_q="native",
        deterministic=True,
        max_batch=4096,  # a Python loop over sequences: 65,537 of them take minutes a call
        notes="float64 blockwise online softmax on CPU; slow, for small problems",
    )

    def forward(self, args: AttentionArgs) -> Output:
        q, k, v = (t.to("cpu", torch.float64) for t in (args.q, args.k, args.v))
        cu_q, cu_k = args.cu_seqlens_q.tolist(), args.cu_seqlens_k.tolist()
        outs, lses = [], []
        for b in range(args.batch):
            qb = q if args.broadcast_q else q[cu_q[b] : cu_q[b + 1]]
            o, lse = _sequence(qb, k[cu_k[b] : cu_k[b + 1]], v[cu_k[b] : cu_k[b + 1]], args.softmax_scale, args.causal, BLOCK)
            outs.append(o)
            lses.append(lse)
        hq, dv = q.shape[1], v.shape[2]
        out = torch.cat(outs) if outs else q.new_zeros(0, hq, dv)
        lse = torch.cat(lses, dim=1) if lses else q.new_zeros(hq, 0)
        return Output(out.to(args.q.device, args.q.dtype), lse.to(args.q.device, torch.float32))
