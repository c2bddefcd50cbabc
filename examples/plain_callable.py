"""A plain function with flash-attn's varlen signature: all a vendor needs to test a kernel.

    jfa-conformance run --backend examples/plain_callable.py:attention
    python -m pytest conformance/spec --backend examples/plain_callable.py:attention

``attention_top_left`` is the same function with a planted bug (causal aligned top-left instead of
bottom-right), which the spec must catch with a shrunk counterexample.
"""
import torch


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, top_left):
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    group = q.shape[1] // k.shape[1]  # GQA: query head h reads kv head h // group
    outs, lses = [], []
    for b in range(len(cu_seqlens_k) - 1):
        qb = q[cu_seqlens_q[b] : cu_seqlens_q[b + 1]].float().transpose(0, 1)  # [H, Lq, D]
        kb = k[cu_seqlens_k[b] : cu_seqlens_k[b + 1]].float().repeat_interleave(group, 1).transpose(0, 1)
        vb = v[cu_seqlens_k[b] : cu_seqlens_k[b + 1]].float().repeat_interleave(group, 1).transpose(0, 1)
        s = qb @ kb.transpose(1, 2) * scale
        if causal:
            lq, lk = qb.shape[1], kb.shape[1]
            shift = 0 if top_left else lk - lq  # bottom-right: last query sees the last key
            visible = torch.arange(lk, device=q.device)[None, :] <= torch.arange(lq, device=q.device)[:, None] + shift
            s = s.masked_fill(~visible, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)  # -inf for rows without a visible key
        p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
        outs.append((p @ vb).transpose(0, 1).to(q.dtype))
        lses.append(lse)
    if not outs:  # empty batch
        return q.new_zeros(0, q.shape[1], v.shape[2]), q.new_zeros(q.shape[1], 0, dtype=torch.float32)
    return torch.cat(outs), torch.cat(lses, dim=1)


def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, softmax_scale=None):
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, top_left=False)


def attention_top_left(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, softmax_scale=None):
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, top_left=True)
