"""The oracle: exact jagged attention, vectorised and memory-bounded.

Sequences are cut into work items (a sequence, or a slice of its queries when one sequence alone would
exceed the memory budget), items of similar size are padded into groups, and each group is one batched
masked softmax. There is no Python loop over query blocks. Gradients come from autograd.

Run in float64 it is the oracle every check is judged against; run in the test dtype it is the
"low-precision reference" whose own error calibrates the tolerance (see tolerance.py).
"""
from __future__ import annotations

import torch

from .problem import AttentionArgs, Output, key_visible

# Score elements (items x heads x queries x keys) materialised per group; bounds memory at ~32 MB of
# float64 per saved tensor whatever the lengths are.
SCORE_BUDGET = 1 << 22


def _work_items(seqlens_q, seqlens_k, heads, budget):
    """(sequence, first query, end query) slices, each with at most ``budget`` score elements."""
    items = []
    for b, (lq, lk) in enumerate(zip(seqlens_q, seqlens_k)):
        step = max(1, budget // max(1, lk * heads))
        items.extend((b, q0, min(lq, q0 + step)) for q0 in range(0, lq, step))
    return items


def _groups(items, seqlens_k, heads, budget):
    """Greedy grouping of items sorted by size so that padded group size stays within the budget."""
    order = sorted(items, key=lambda it: (seqlens_k[it[0]], it[2] - it[1]), reverse=True)
    group, max_q, max_k = [], 0, 0
    for it in order:
        nq, nk = it[2] - it[1], seqlens_k[it[0]]
        new_q, new_k = max(max_q, nq), max(max_k, nk)
        if group and (len(group) + 1) * new_q * max(new_k, 1) * heads > budget:
            yield group
            group, new_q, new_k = [], nq, nk
        group.append(it)
        max_q, max_k = new_q, new_k
    if group:
        yield group


def attention(args: AttentionArgs, compute_dtype: torch.dtype = torch.float64, budget: int = SCORE_BUDGET) -> Output:
    """Attention of ``args`` computed on CPU in ``compute_dtype``; out and lse keep that dtype (lse is
    float32 when computing in a narrower type, the convention's LSE dtype)."""
    if args.broadcast_q:
        args = args.with_broadcast_q_expanded()
    q, k, v = (t.to("cpu", compute_dtype) for t in (args.q, args.k, args.v))
    total_q, hq, _ = q.shape
    hkv, dv = k.shape[1], v.shape[2]
    group_size = hq // hkv
    seqlens_q, seqlens_k = args.seqlens_q, args.seqlens_k
    cu_q = args.cu_seqlens_q.to("cpu", torch.int64)
    cu_k = args.cu_seqlens_k.to("cpu", torch.int64)
    lse_dtype = compute_dtype if compute_dtype == torch.float64 else torch.float32

    row_ids, outs, lses = [], [], []
    for group in _groups(_work_items(seqlens_q, seqlens_k, hq, budget), seqlens_k, hq, budget):
        items = torch.tensor(group, dtype=torch.int64)  # [G, 3]: sequence, q0, q1
        seq, q0, q1 = items.unbind(1)
        len_q = torch.tensor(seqlens_q, dtype=torch.int64)[seq]
        len_k = torch.tensor(seqlens_k, dtype=torch.int64)[seq]
        n_q, n_k = int((q1 - q0).max()), int(len_k.max())
        q_pos = q0[:, None] + torch.arange(n_q)[None, :]  # [G, Mq] position within the sequence
        q_valid = q_pos < q1[:, None]
        q_rows = (cu_q[seq][:, None] + q_pos).clamp(max=max(total_q - 1, 0))
        if n_k == 0:  # no keys anywhere in the group: every row is empty
            outs.append(torch.zeros(int(q_valid.sum()), hq, dv, dtype=compute_dtype))
            lses.append(torch.full((int(q_valid.sum()), hq), float("-inf"), dtype=lse_dtype))
            row_ids.append(q_rows[q_valid])
            continue
        k_pos = torch.arange(n_k)[None, :].expand(len(group), n_k)  # [G, Mk]
        k_valid = k_pos < len_k[:, None]
        k_rows = (cu_k[seq][:, None] + k_pos).clamp(max=k.shape[0] - 1)

        qg = q[q_rows].view(len(group), n_q, hkv, group_size, -1)  # [G, Mq, Hkv, R, D]
        kg, vg = k[k_rows], v[k_rows]  # [G, Mk, Hkv, D]
        scores = torch.einsum("gqhrd,gkhd->ghrqk", qg, kg) * args.softmax_scale
        visible = key_visible(q_pos[:, :, None], k_pos[:, None, :], len_q[:, None, None], len_k[:, None, None], args.causal)
        visible = visible & k_valid[:, None, :] & q_valid[:, :, None]  # [G, Mq, Mk]
        scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
        # Softmax is shift-invariant, so the row max is a constant for autograd; rows without a
        # visible key use 0 so that exp() gives exact zeros instead of NaN.
        row_max = scores.amax(-1, keepdim=True).detach()
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        p = torch.exp(scores - row_max)
        row_sum = p.sum(-1, keepdim=True)
        has_key = row_sum > 0
        safe_sum = torch.where(has_key, row_sum, torch.ones_like(row_sum))
        out = torch.einsum("ghrqk,gkhd->gqhrd", p / safe_sum, vg).reshape(len(group), n_q, hq, dv)
        lse = torch.where(has_key, row_max + torch.log(safe_sum), torch.full_like(row_sum, float("-inf")))
        lse = lse.squeeze(-1).permute(0, 3, 1, 2).reshape(len(group), n_q, hq)  # [G, Mq, Hq]
        row_ids.append(q_rows[q_valid])
        outs.append(out[q_valid])
        lses.append(lse[q_valid].to(lse_dtype))

    if not row_ids:
        return Output(torch.zeros(total_q, hq, dv, dtype=compute_dtype), torch.zeros(hq, total_q, dtype=lse_dtype))
    # Every packed query row belongs to exactly one item: invert the permutation to restore order.
    order = torch.argsort(torch.cat(row_ids))
    return Output(torch.cat(outs)[order], torch.cat(lses)[order].transpose(0, 1).contiguous())
