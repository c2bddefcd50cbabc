"""Mutants of the backward."""
from __future__ import annotations

import math
import random

import torch

from .base import COMPUTE, TILE, Unmutated
from .forward import CausalTopLeft

_system_random = random.SystemRandom()  # outside every seeded RNG: run-to-run variation is the point


# ---------------------------------------------------------------------------------------------------
# Gradients


class BroadcastQDqFirstSequence(Unmutated):
    name = "mutant-broadcast-q-dq-first-sequence"
    catalog_id = "shared-operand-gradient-not-reduced"
    bug = "with broadcast-Q, dQ is not reduced over the sequences: it holds only the first sequence's dQ"

    def sequence_queries(self, args, b):
        q = super().sequence_queries(args, b)
        return q.detach() if args.broadcast_q and b > 0 else q


class GqaDvNotReduced(Unmutated):
    name = "mutant-gqa-dv-not-reduced"
    catalog_id = "shared-operand-gradient-not-reduced"
    bug = "dV of a KV head takes only the first query head of its group, not the sum over the group"

    def expand_values(self, v, kv_head):
        first_of_group = torch.ones_like(kv_head, dtype=torch.bool)
        first_of_group[1:] = kv_head[1:] != kv_head[:-1]
        expanded = v[:, kv_head]
        return torch.where(first_of_group[None, :, None], expanded, expanded.detach())


class _RandomOrderSum(torch.autograd.Function):
    """Forward: ``copies`` views of q, one per key block. Backward: the blocks' dQ contributions are
    summed in float32 in an order that changes from call to call, as atomic adds do."""

    @staticmethod
    def forward(ctx, q, copies: int):
        return q.unsqueeze(0).expand(copies, *q.shape).clone()

    last_order: dict[int, list[int]] = {}  # per block count: the order the previous call used

    @staticmethod
    def backward(ctx, grad):
        # Each call a new order (from three blocks up, where the order can change a float sum): repeated
        # runs differ as atomics under contention do, not only when two shuffles happen to differ.
        blocks = grad.shape[0]
        order = list(range(blocks))
        while True:
            _system_random.shuffle(order)
            if blocks < 3 or order != _RandomOrderSum.last_order.get(blocks):
                break
        _RandomOrderSum.last_order[blocks] = list(order)
        total = torch.zeros(grad.shape[1:], dtype=torch.float32)
        for i in order:
            total = total + grad[i].float()
        return total.to(grad.dtype), None


class NondeterministicDq(Unmutated):
    name = "mutant-nondeterministic-dq"
    catalog_id = "declared-deterministic-but-atomic"
    bug = ("declares deterministic=True but accumulates dQ over key blocks in a run-dependent order "
           "(float32 atomic adds), so dQ differs in its last bits from run to run")
    block = 4

    def scores(self, q, k):
        blocks = max(1, math.ceil(k.shape[0] / self.block))
        copies = _RandomOrderSum.apply(q, blocks)
        parts = [torch.einsum("qhd,khd->hqk", copies[j], k[j * self.block : (j + 1) * self.block]) for j in range(blocks)]
        return torch.cat(parts, dim=-1)


def _rows_of(cu: torch.Tensor, select) -> torch.Tensor:
    """Row indices of the sequences ``select(b)`` picks, for packed offsets ``cu``."""
    rows = [torch.arange(int(cu[b]), int(cu[b + 1])) for b in range(cu.numel() - 1) if select(b)]
    return torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)


class NanGradRowsWithoutKeys(Unmutated):
    name = "mutant-nan-grad-rows-without-keys"
    catalog_id = "empty-row-nan-backward"
    bug = ("the forward writes 0 for causal rows that see no key, but the backward recomputes their "
           "probabilities from an LSE of -inf: dQ of those rows is NaN")

    def edit_gradient(self, args, name, grad):
        if name != "q" or args.causal != "bottom_right" or args.broadcast_q:
            return grad
        grad = grad.clone()
        for b, (lq, lk) in enumerate(zip(args.seqlens_q, args.seqlens_k)):
            blind = lq - lk  # bottom-right: the first Lq - Lk rows see no key
            if lk > 0 and blind > 0:
                first = int(args.cu_seqlens_q[b])
                grad[first : first + blind] = float("nan")
        return grad


class DqRowsPastHeadDim(Unmutated):
    name = "mutant-dq-rows-past-head-dim"
    catalog_id = "backward-max-seqlen-from-head-dim"
    bug = ("the backward reads max_seqlen_q from the packed query tensor's last axis (the head dim D): its dQ "
           "accumulator holds D rows per sequence, so the rows of a sequence past its D-th get no dQ (0 here; "
           "the reported kernel walked past the buffer's end)")

    def edit_gradient(self, args, name, grad):
        if name != "q":
            return grad
        d = args.q.shape[-1]
        grad = grad.clone()
        if args.broadcast_q:  # one dense block of Lq query rows
            grad[d:] = 0
            return grad
        for b, lq in enumerate(args.seqlens_q):
            if lq > d:
                first = int(args.cu_seqlens_q[b])
                grad[first + d : first + lq] = 0
        return grad


class UnwrittenGradRows(Unmutated):
    name = "mutant-unwritten-grad-rows"
    catalog_id = "gradients-of-empty-sequences-unwritten"
    bug = ("the backward skips empty work without storing zeros: dQ rows of sequences without keys and "
           "dK/dV rows of sequences without queries keep the buffer's contents (NaN here)")

    def edit_gradient(self, args, name, grad):
        if name == "q" and not args.broadcast_q:
            rows = _rows_of(args.cu_seqlens_q, lambda b: args.seqlens_k[b] == 0)
        elif name in ("k", "v"):
            rows = _rows_of(args.cu_seqlens_k, lambda b: args.seqlens_q[b] == 0)
        else:
            return grad
        grad = grad.clone()
        grad[rows] = float("nan")
        return grad


class DkvTileWritePastEnd(Unmutated):
    name = "mutant-dkv-tile-write-past-end"
    catalog_id = "backward-tile-crosses-sequence-boundary"
    bug = (f"the dK/dV epilogue stores whole {TILE}-row tiles: a sequence whose key count is not a multiple "
           f"of {TILE} overwrites the first dK/dV rows of the next sequence with its own (zero) values")

    def edit_gradient(self, args, name, grad):
        if name not in ("k", "v"):
            return grad
        grad = grad.clone()
        cu = args.cu_seqlens_k
        for b in range(args.batch):
            start, end = int(cu[b]), int(cu[b + 1])
            tile_end = min(start + -(-(end - start) // TILE) * TILE, grad.shape[0])
            grad[end:tile_end] = 0
        return grad


class BackwardKeyExtentFromQuery(Unmutated):
    name = "mutant-backward-key-extent-from-query"
    catalog_id = "backward-max-seqlen-k-from-q"
    bug = ("the backward is launched with max_seqlen_q in place of max_seqlen_k: keys at positions "
           ">= max_seqlen_q get no dK/dV and contribute nothing to dQ (the forward is right)")

    def softmax_values(self, args, s, v):
        beyond = torch.arange(s.shape[-1]) >= args.max_seqlen_q
        s = torch.where(beyond, s.detach(), s)
        v = torch.where(beyond[:, None, None], v.detach(), v)
        return super().softmax_values(args, s, v)


class GradientsAllZero(Unmutated):
    name = "mutant-gradients-all-zero"
    catalog_id = "backward-silently-zero"
    bug = ("the backward's scratch buffers are sized for the wrong LSE layout and the kernel returns "
           "all-zero dQ, dK and dV without an error (the forward is right)")

    def edit_gradient(self, args, name, grad):
        return torch.zeros_like(grad)


class EmptyWorkBackwardError(Unmutated):
    name = "mutant-empty-work-backward-error"
    catalog_id = "empty-workload-error"
    bug = ("the backward launches a zero-size grid when there are no query or no key rows (an empty batch, "
           "or every sequence empty) and fails instead of returning zero / empty gradients")

    def empty_output(self, args):
        connected = args.q.reshape(-1)[:0].sum() + args.k.reshape(-1)[:0].sum()
        return super().empty_output(args) + connected.to(COMPUTE)

    def edit_gradient(self, args, name, grad):
        if args.q.shape[0] == 0 or args.k.shape[0] == 0 or sum(args.seqlens_q) == 0:
            raise RuntimeError("backward kernel launch failed: invalid configuration argument (empty grid)")
        return grad


class ValueDimNarrowedInDq(Unmutated):
    name = "mutant-value-dim-narrowed-in-dq"
    catalog_id = "dq-uses-qk-head-dim-for-values"
    bug = ("the dQ kernel sizes its V and dO tiles with the query/key head dim: when D < Dv the value "
           "channels past D drop out of dP = dO V^T, so dQ (and dK) are wrong while dV is right")

    def weighted_values(self, args, p, v):
        return _NarrowedValueProduct.apply(p, v, args.q.shape[2])


class _NarrowedValueProduct(torch.autograd.Function):
    """P V, whose backward computes dP from the first ``width`` value channels only."""

    @staticmethod
    def forward(ctx, p, v, width):
        ctx.save_for_backward(p, v)
        ctx.width = width
        return torch.einsum("hqk,khd->hqd", p, v)

    @staticmethod
    def backward(ctx, grad):
        p, v = ctx.saved_tensors
        w = min(ctx.width, v.shape[-1])
        grad_p = torch.einsum("hqd,khd->hqk", grad[..., :w], v[..., :w])
        grad_v = torch.einsum("hqk,hqd->khd", p, grad)
        return grad_p, grad_v, None


class BackwardCausalTopLeft(Unmutated):
    name = "mutant-backward-causal-top-left"
    catalog_id = "backward-mask-differs-from-forward"
    bug = ("the forward masks bottom-right, the backward top-left (j <= i): out and LSE are right, dQ, dK and dV "
           "are those of another mask wherever Lq != Lk")

    def attend(self, args, b):
        out, lse = super().attend(args, b)
        if args.causal != "bottom_right":
            return out, lse
        other, _ = CausalTopLeft().attend(args, b)
        return out.detach() + (other - other.detach()), lse  # the forward's values, the other mask's gradients


class _ReducedByAnotherMap(torch.autograd.Function):
    """Rows per query head, t[:, heads]; the backward sums each query head's gradient into ``other[h]``."""

    @staticmethod
    def forward(ctx, t, heads, other):
        ctx.kv_heads, ctx.other = t.shape[1], other
        return t[:, heads]

    @staticmethod
    def backward(ctx, grad):
        reduced = grad.new_zeros(grad.shape[0], ctx.kv_heads, grad.shape[2])
        return reduced.index_add_(1, ctx.other, grad), None, None


class GqaDkvHeadMapInterleaved(Unmutated):
    name = "mutant-gqa-dkv-head-map-interleaved"
    catalog_id = "gqa-backward-head-map-mismatch"
    bug = ("the dK/dV reduction maps query head h to KV head h % Hkv while the forward and dQ use h // (Hq / Hkv): "
           "under GQA with more than one KV head, dK and dV sum the wrong query heads")

    def expand_keys(self, k, kv_head):
        return _ReducedByAnotherMap.apply(k, kv_head, torch.arange(len(kv_head)) % k.shape[1])

    def expand_values(self, v, kv_head):
        return _ReducedByAnotherMap.apply(v, kv_head, torch.arange(len(kv_head)) % v.shape[1])
