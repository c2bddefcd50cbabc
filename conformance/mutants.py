"""Mutant backends: correct attention with exactly one documented bug injected each.

``jfa-conformance selftest`` runs the spec against every mutant and fails if one survives: a spec that
passes a broken kernel is itself broken. Each mutant declares the same capabilities as the
``reference`` backend it imitates, so the spec draws exactly the problems it would draw for a correct
backend; the bug, not a narrower declaration, is what must be caught.

The correct computation (:class:`Unmutated`, the control) is per-sequence attention in float64 on CPU,
written as small overridable steps; each mutant overrides one step. Use any of them with
``--backend conformance.mutants:<ClassName>``.
"""
from __future__ import annotations

import math
import random

import torch

from backends.reference import Reference

from .backend import Backend
from .problem import AttentionArgs, Output, key_visible

COMPUTE = torch.float64
_system_random = random.SystemRandom()  # outside every seeded RNG: run-to-run variation is the point


class Unmutated(Backend):
    """The control: the same computation as every mutant, with no bug. The spec must pass it."""

    name = "mutant-control"
    capabilities = Reference.capabilities
    bug = "none (control)"

    # -- the steps a mutant may override ---------------------------------------------------------
    def sequence_queries(self, args: AttentionArgs, b: int) -> torch.Tensor:
        """Query rows of sequence ``b`` (the shared dense q under broadcast-Q)."""
        if args.broadcast_q:
            return args.q
        cu = args.cu_seqlens_q
        return args.q[int(cu[b]) : int(cu[b + 1])]

    def sequence_keys(self, args: AttentionArgs, b: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Key and value rows of sequence ``b``, and the position of the first one (0: the sequence start)."""
        start, end = int(args.cu_seqlens_k[b]), int(args.cu_seqlens_k[b + 1])
        return args.k[start:end], args.v[start:end], 0

    def kv_head_of(self, heads_q: int, heads_kv: int) -> torch.Tensor:
        """Which KV head each query head reads."""
        return torch.arange(heads_q) // (heads_q // heads_kv)

    def expand_values(self, v: torch.Tensor, kv_head: torch.Tensor) -> torch.Tensor:
        return v[:, kv_head]

    def scale(self, args: AttentionArgs) -> float:
        return args.softmax_scale

    def compute_view(self, t: torch.Tensor) -> torch.Tensor:
        """An input as the kernel computes with it."""
        return t.to("cpu", COMPUTE)

    def visible(self, args: AttentionArgs, q_pos, k_pos, len_q: int, len_k: int) -> torch.Tensor:
        return key_visible(q_pos, k_pos, len_q, len_k, args.causal)

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Q K^T per head: q [Lq, Hq, D], k [Lk, Hq, D] -> [Hq, Lq, Lk]."""
        return torch.einsum("qhd,khd->hqk", q, k)

    def normalise(self, acc: torch.Tensor, row_sum: torch.Tensor) -> torch.Tensor:
        """acc [Hq, Lq, Dv] / row_sum [Hq, Lq, 1]; rows without a visible key are 0."""
        return acc / torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))

    def log_sum_exp(self, row_max: torch.Tensor, row_sum: torch.Tensor) -> torch.Tensor:
        safe = torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))
        return torch.where(row_sum > 0, row_max + torch.log(safe), torch.full_like(row_sum, float("-inf")))

    def assemble(self, args: AttentionArgs, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed out [rows, Hq, Dv] and lse [Hq, rows] from the per-sequence results, in order."""
        return torch.cat([o for o, _ in parts]), torch.cat([lse for _, lse in parts], dim=1)

    def finish(self, out: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return out, lse

    # -- the computation -----------------------------------------------------------------------
    def attend(self, args: AttentionArgs, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of sequence ``b``: out [Lq, Hq, Dv] and lse [Hq, Lq], in float64."""
        q = self.compute_view(self.sequence_queries(args, b))
        k, v, first_key = self.sequence_keys(args, b)
        k, v = self.compute_view(k), self.compute_view(v)
        len_q = q.shape[0]
        len_k = int(args.cu_seqlens_k[b + 1] - args.cu_seqlens_k[b])
        kv_head = self.kv_head_of(q.shape[1], k.shape[1])
        s = self.scores(q, k[:, kv_head]) * self.scale(args)
        q_pos = torch.arange(len_q)[:, None]
        k_pos = first_key + torch.arange(k.shape[0])[None, :]
        s = s.masked_fill(~self.visible(args, q_pos, k_pos, len_q, len_k), float("-inf"))
        if k.shape[0]:
            row_max = s.amax(-1, keepdim=True).detach()
            row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        else:
            row_max = s.new_zeros(*s.shape[:2], 1)
        p = torch.exp(s - row_max)
        row_sum = p.sum(-1, keepdim=True)
        acc = torch.einsum("hqk,khd->hqd", p, self.expand_values(v, kv_head))
        out = self.normalise(acc, row_sum).transpose(0, 1)
        return out, self.log_sum_exp(row_max, row_sum).squeeze(-1)

    def forward(self, args: AttentionArgs) -> Output:
        hq, dv = args.q.shape[1], args.v.shape[2]
        parts = [self.attend(args, b) for b in range(args.batch)]
        if parts:
            out, lse = self.assemble(args, parts)
        else:
            out, lse = torch.zeros(0, hq, dv, dtype=COMPUTE), torch.zeros(hq, 0, dtype=COMPUTE)
        out, lse = self.finish(out, lse)
        return Output(out.to(args.q.device, args.q.dtype), lse.to(args.q.device, torch.float32))


class ZeroLengthCompacted(Unmutated):
    name = "mutant-zero-length-compacted"
    bug = ("sequences without keys are skipped when results are written, so every later sequence's rows "
           "shift up into the skipped rows (the empty sequences' rows end up at the end)")

    def assemble(self, args, parts):
        order = [b for b in range(len(parts)) if args.seqlens_k[b] > 0] + [b for b in range(len(parts)) if args.seqlens_k[b] == 0]
        return super().assemble(args, [parts[b] for b in order])


class CausalTopLeft(Unmutated):
    name = "mutant-causal-top-left"
    bug = "bottom-right causal masking is computed top-left (j <= i instead of j <= i + Lk - Lq)"

    def visible(self, args, q_pos, k_pos, len_q, len_k):
        causal = "top_left" if args.causal == "bottom_right" else args.causal
        return key_visible(q_pos, k_pos, len_q, len_k, causal)


class NanForMaskedRows(Unmutated):
    name = "mutant-nan-masked-rows"
    bug = "a row with no visible key divides 0 by 0: its output is NaN instead of 0"

    def normalise(self, acc, row_sum):
        return acc / row_sum


class KeyPastEnd(Unmutated):
    name = "mutant-key-past-end"
    bug = ("the key loop runs to j <= Lk: each sequence also attends to the key stored right after its "
           "last one (the next sequence's first key, or whatever memory follows the tensor)")

    @staticmethod
    def _rows(t: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) read from t's storage like a raw pointer would, even past t's last row."""
        if stop <= t.shape[0]:
            return t[start:stop]
        inner = t.stride(0)
        last_element = t.storage_offset() + (stop - 1) * inner + sum((n - 1) * s for n, s in zip(t.shape[1:], t.stride()[1:]))
        if last_element >= t.untyped_storage().nbytes() // t.element_size():
            return t[start:]  # nothing mapped after the tensor: the stray read is lost
        view = t.detach().as_strided((stop - start, *t.shape[1:]), t.stride(), t.storage_offset() + start * inner)
        return torch.cat([t[start:], view[t.shape[0] - start :]])

    def sequence_keys(self, args, b):
        start, end = int(args.cu_seqlens_k[b]), int(args.cu_seqlens_k[b + 1])
        return self._rows(args.k, start, end + 1), self._rows(args.v, start, end + 1), 0


class KeyOffsetsFromQuery(Unmutated):
    name = "mutant-key-offsets-from-query"
    bug = ("keys are located with cu_seqlens_q (a self-attention assumption): wherever Lq != Lk a sequence "
           "attends to the wrong keys")

    def sequence_keys(self, args, b):
        if args.broadcast_q:  # the broadcast path has no per-sequence query offsets to confuse
            return super().sequence_keys(args, b)
        rows = args.k.shape[0]
        start, end = (min(int(args.cu_seqlens_q[i]), rows) for i in (b, b + 1))
        return args.k[start:end], args.v[start:end], 0


class LseBase2(Unmutated):
    name = "mutant-lse-base2"
    bug = "the LSE is returned in base 2 (log2 of the sum of exp2), not the natural log the convention uses"

    def log_sum_exp(self, row_max, row_sum):
        return super().log_sum_exp(row_max, row_sum) * math.log2(math.e)


class GqaHeadModulo(Unmutated):
    name = "mutant-gqa-head-modulo"
    bug = "query head h reads KV head h % Hkv instead of h // (Hq / Hkv)"

    def kv_head_of(self, heads_q, heads_kv):
        return torch.arange(heads_q) % heads_kv


class BroadcastQDqFirstSequence(Unmutated):
    name = "mutant-broadcast-q-dq-first-sequence"
    bug = "with broadcast-Q, dQ is not reduced over the sequences: it holds only the first sequence's dQ"

    def sequence_queries(self, args, b):
        q = super().sequence_queries(args, b)
        return q.detach() if args.broadcast_q and b > 0 else q


class CrossSequenceLeak(Unmutated):
    name = "mutant-cross-sequence-leak"
    bug = "the document mask is missing at the left edge: queries also see every key of the previous sequence"

    def sequence_keys(self, args, b):
        start = int(args.cu_seqlens_k[max(b - 1, 0)])
        own, end = int(args.cu_seqlens_k[b]), int(args.cu_seqlens_k[b + 1])
        return args.k[start:end], args.v[start:end], start - own  # leaked keys sit at negative positions


class _RandomOrderSum(torch.autograd.Function):
    """Forward: ``copies`` views of q, one per key block. Backward: the blocks' dQ contributions are
    summed in float32 in an order that changes from call to call, as atomic adds do."""

    @staticmethod
    def forward(ctx, q, copies: int):
        return q.unsqueeze(0).expand(copies, *q.shape).clone()

    @staticmethod
    def backward(ctx, grad):
        order = list(range(grad.shape[0]))
        _system_random.shuffle(order)
        total = torch.zeros(grad.shape[1:], dtype=torch.float32)
        for i in order:
            total = total + grad[i].float()
        return total.to(grad.dtype), None


class NondeterministicDq(Unmutated):
    name = "mutant-nondeterministic-dq"
    bug = ("declares deterministic=True but accumulates dQ over key blocks in a run-dependent order "
           "(float32 atomic adds), so dQ differs in its last bits from run to run")
    block = 8

    def scores(self, q, k):
        blocks = max(1, math.ceil(k.shape[0] / self.block))
        copies = _RandomOrderSum.apply(q, blocks)
        parts = [torch.einsum("qhd,khd->hqk", copies[j], k[j * self.block : (j + 1) * self.block]) for j in range(blocks)]
        return torch.cat(parts, dim=-1)


class ScaleFromValueDim(Unmutated):
    name = "mutant-scale-from-value-dim"
    bug = "softmax_scale is ignored; the kernel always uses 1/sqrt(Dv) (the value head dim, not D)"

    def scale(self, args):
        return 1.0 / math.sqrt(args.v.shape[2])


class GqaDvNotReduced(Unmutated):
    name = "mutant-gqa-dv-not-reduced"
    bug = "dV of a KV head takes only the first query head of its group, not the sum over the group"

    def expand_values(self, v, kv_head):
        first_of_group = torch.ones_like(kv_head, dtype=torch.bool)
        first_of_group[1:] = kv_head[1:] != kv_head[:-1]
        expanded = v[:, kv_head]
        return torch.where(first_of_group[None, :, None], expanded, expanded.detach())


class UnwrittenTail(Unmutated):
    name = "mutant-unwritten-tail"
    bug = ("the launch grid is rows // 16 blocks instead of ceil(rows / 16): the last rows % 16 output rows "
           "are never written and keep the buffer's contents (NaN here, garbage on a GPU)")
    block = 16

    def finish(self, out, lse):
        written = out.shape[0] // self.block * self.block
        unwritten = torch.full_like(out[written:], float("nan"))
        return torch.cat([out[:written], unwritten]), lse


class MaxSeqlenOffByOne(Unmutated):
    name = "mutant-max-seqlen-off-by-one"
    bug = "the key loop stops at max_seqlen_k - 1: the last key of the longest sequences is never read"

    def visible(self, args, q_pos, k_pos, len_q, len_k):
        return super().visible(args, q_pos, k_pos, len_q, len_k) & (k_pos < args.max_seqlen_k - 1)


class Float32AsBfloat16(Unmutated):
    name = "mutant-float32-as-bfloat16"
    bug = "float32 inputs are multiplied at bfloat16 precision (a reduced-precision matmul mode left on)"

    def compute_view(self, t):
        if t.dtype == torch.float32:
            t = t.to(torch.bfloat16)
        return super().compute_view(t)


MUTANTS: dict[str, type[Unmutated]] = {
    cls.__name__: cls
    for cls in (
        ZeroLengthCompacted,
        CausalTopLeft,
        NanForMaskedRows,
        KeyPastEnd,
        KeyOffsetsFromQuery,
        LseBase2,
        GqaHeadModulo,
        BroadcastQDqFirstSequence,
        CrossSequenceLeak,
        NondeterministicDq,
        ScaleFromValueDim,
        GqaDvNotReduced,
        UnwrittenTail,
        MaxSeqlenOffByOne,
        Float32AsBfloat16,
    )
}


def backend_spec(class_name: str) -> str:
    """The ``--backend`` value that selects a mutant (or the control, ``Unmutated``)."""
    return f"conformance.mutants:{class_name}"
