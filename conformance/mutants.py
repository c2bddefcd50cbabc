"""Mutant backends: correct attention with exactly one documented bug injected each.

``jfa-conformance selftest`` runs the spec against every mutant and fails if one survives: a spec that
passes a broken kernel is itself broken. Each mutant renders, on the CPU, a bug class that a real
jagged-attention kernel has had; its ``catalog_id`` names the class in :mod:`conformance.bugs` (rendered
into ``conformance/BUGS.md``), which cites where the bug was reported. Each mutant declares the same
capabilities as the ``reference`` backend it imitates, so the spec draws exactly the problems it would
draw for a correct backend; the bug, not a narrower declaration, is what must be caught.

The correct computation (:class:`Unmutated`, the control) is per-sequence attention in float64 on CPU,
written as small overridable steps; each mutant overrides one step. Use any of them with
``--backend conformance.mutants:<ClassName>``.

:data:`MUTANTS` are the ones the ``ci`` profile must catch. :data:`PENDING` render classes the spec's
drawing cannot yet reach (the catalog names the missing axis); each is checked on a problem that
triggers it (tests/test_bugs_catalog.py), and moves to :data:`MUTANTS` once the drawing reaches it.
"""
from __future__ import annotations

import functools
import math
import random

import torch

from conformance.reference import Reference

from .backend import Backend
from .problem import AttentionArgs, Output, key_visible

COMPUTE = torch.float64
TILE = 16  # rows of the key / query tiles the tile-level mutants pretend to work in
_system_random = random.SystemRandom()  # outside every seeded RNG: run-to-run variation is the point


def raw_rows(t: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows ``[start, stop)`` of ``t`` read like a raw pointer would: past ``t``'s last row, whatever its
    storage holds next (as far as the storage reaches; nothing beyond it)."""
    rows = t.shape[0]
    if stop <= rows:
        return t[start:stop]
    row_stride = t.stride(0)
    row_span = sum((n - 1) * s for n, s in zip(t.shape[1:], t.stride()[1:])) + 1
    available = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    mapped = (available - row_span) // row_stride + 1 if row_stride > 0 and available >= row_span else rows
    stop = min(stop, max(mapped, rows))
    if stop <= rows:
        return t[start:]
    view = t.detach().as_strided((stop - start, *t.shape[1:]), t.stride(), t.storage_offset() + start * row_stride)
    return torch.cat([t[start:], view[rows - start :]])


class _GradientEpilogue(torch.autograd.Function):
    """Identity forward; in backward, ``edit`` rewrites the tensor's whole gradient (what a kernel's
    epilogue finally stores for it)."""

    @staticmethod
    def forward(ctx, t, edit):
        ctx.edit = edit
        return t.clone()

    @staticmethod
    def backward(ctx, grad):
        return ctx.edit(grad), None


class Unmutated(Backend):
    """The control: the same computation as every mutant, with no bug. The spec must pass it."""

    name = "mutant-control"
    capabilities = Reference.capabilities
    bug = "none (control)"
    catalog_id = None

    # -- the steps a mutant may override ---------------------------------------------------------
    def sequence_queries(self, args: AttentionArgs, b: int) -> torch.Tensor:
        """Query rows of sequence ``b`` (the shared dense q under broadcast-Q)."""
        if args.broadcast_q:
            return args.q
        cu = args.cu_seqlens_q
        return args.q[int(cu[b]) : int(cu[b + 1])]

    def sequence_keys(self, args: AttentionArgs, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Key and value rows of sequence ``b`` and each one's position within the sequence."""
        start, end = int(args.cu_seqlens_k[b]), int(args.cu_seqlens_k[b + 1])
        return args.k[start:end], args.v[start:end], torch.arange(end - start)

    def key_length(self, args: AttentionArgs, b: int) -> int:
        """The key count of sequence ``b`` as the kernel knows it (masking aligns to it)."""
        return int(args.cu_seqlens_k[b + 1] - args.cu_seqlens_k[b])

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

    def mask(self, args: AttentionArgs, s: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """Scores with the invisible ones removed from the softmax."""
        return s.masked_fill(~visible, float("-inf"))

    def weighted_values(self, args: AttentionArgs, p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """P V: p [Hq, Lq, Lk], v [Lk, Hq, Dv] -> [Hq, Lq, Dv]."""
        return torch.einsum("hqk,khd->hqd", p, v)

    def normalise(self, acc: torch.Tensor, row_sum: torch.Tensor) -> torch.Tensor:
        """acc [Hq, Lq, Dv] / row_sum [Hq, Lq, 1]; rows without a visible key are 0."""
        return acc / torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))

    def log_sum_exp(self, row_max: torch.Tensor, row_sum: torch.Tensor) -> torch.Tensor:
        safe = torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))
        return torch.where(row_sum > 0, row_max + torch.log(safe), torch.full_like(row_sum, float("-inf")))

    def softmax_values(self, args: AttentionArgs, s: torch.Tensor,
                       v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked scores s [Hq, Lq, Lk] and values v [Lk, Hq, Dv] -> out [Hq, Lq, Dv], lse [Hq, Lq]."""
        if s.shape[-1]:
            row_max = s.amax(-1, keepdim=True).detach()
            row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        else:
            row_max = s.new_zeros(*s.shape[:2], 1)
        p = torch.exp(s - row_max)
        row_sum = p.sum(-1, keepdim=True)
        out = self.normalise(self.weighted_values(args, p, v), row_sum)
        return out, self.log_sum_exp(row_max, row_sum).squeeze(-1)

    def assemble(self, args: AttentionArgs,
                 parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed out [rows, Hq, Dv] and lse [Hq, rows] from the per-sequence results, in order."""
        return torch.cat([o for o, _ in parts]), torch.cat([lse for _, lse in parts], dim=1)

    def empty_output(self, args: AttentionArgs) -> torch.Tensor:
        """The output of a call with no sequence at all."""
        return torch.zeros(0, args.q.shape[1], args.v.shape[2], dtype=COMPUTE)

    def finish(self, args: AttentionArgs, out: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return out, lse

    def edit_gradient(self, args: AttentionArgs, name: str, grad: torch.Tensor) -> torch.Tensor:
        """The gradient stored for input ``name`` ('q', 'k' or 'v'), given the correct one."""
        return grad

    # -- the computation -----------------------------------------------------------------------
    def attend(self, args: AttentionArgs, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of sequence ``b``: out [Lq, Hq, Dv] and lse [Hq, Lq], in float64."""
        q = self.compute_view(self.sequence_queries(args, b))
        k, v, k_pos = self.sequence_keys(args, b)
        k, v = self.compute_view(k), self.compute_view(v)
        len_q, len_k = q.shape[0], self.key_length(args, b)
        kv_head = self.kv_head_of(q.shape[1], k.shape[1])
        s = self.scores(q, k[:, kv_head]) * self.scale(args)
        visible = self.visible(args, torch.arange(len_q)[:, None], k_pos[None, :], len_q, len_k)
        out, lse = self.softmax_values(args, self.mask(args, s, visible), self.expand_values(v, kv_head))
        return out.transpose(0, 1), lse

    def _with_gradient_epilogue(self, args: AttentionArgs) -> AttentionArgs:
        if type(self).edit_gradient is Unmutated.edit_gradient:
            return args
        wrapped = {}
        for name in ("q", "k", "v"):
            t = getattr(args, name)
            if t.requires_grad:
                wrapped[name] = _GradientEpilogue.apply(t, functools.partial(self.edit_gradient, args, name))
        return args.replace(**wrapped)

    def forward(self, args: AttentionArgs) -> Output:
        call = self._with_gradient_epilogue(args)
        parts = [self.attend(call, b) for b in range(call.batch)]
        if parts:
            out, lse = self.assemble(call, parts)
        else:
            out, lse = self.empty_output(call), torch.zeros(call.q.shape[1], 0, dtype=COMPUTE)
        out, lse = self.finish(call, out, lse)
        return Output(out.to(args.q.device, args.q.dtype), lse.to(args.q.device, torch.float32))


# ---------------------------------------------------------------------------------------------------
# Offsets, lengths and sequence boundaries


class ZeroLengthCompacted(Unmutated):
    name = "mutant-zero-length-compacted"
    catalog_id = "zero-length-kv-writes-misplaced"
    bug = ("sequences without keys are skipped when results are written, so every later sequence's rows "
           "shift up into the skipped rows (the empty sequences' rows end up at the end)")

    def assemble(self, args, parts):
        order = [b for b in range(len(parts)) if args.seqlens_k[b] > 0] + [b for b in range(len(parts)) if args.seqlens_k[b] == 0]
        return super().assemble(args, [parts[b] for b in order])


class KeyPastEnd(Unmutated):
    name = "mutant-key-past-end"
    catalog_id = "key-read-past-sequence-end"
    bug = ("the key loop runs to j <= Lk: each sequence also attends to the key stored right after its "
           "last one (the next sequence's first key, or whatever memory follows the tensor)")

    def sequence_keys(self, args, b):
        start, end = int(args.cu_seqlens_k[b]), int(args.cu_seqlens_k[b + 1])
        k, v = raw_rows(args.k, start, end + 1), raw_rows(args.v, start, end + 1)
        return k, v, torch.arange(k.shape[0])


class KeyOffsetsFromQuery(Unmutated):
    name = "mutant-key-offsets-from-query"
    catalog_id = "key-addressing-from-query-metadata"
    bug = ("keys are located with cu_seqlens_q (a self-attention assumption): wherever Lq != Lk a sequence "
           "attends to the wrong keys")

    def sequence_keys(self, args, b):
        if args.broadcast_q:  # the broadcast path has no per-sequence query offsets to confuse
            return super().sequence_keys(args, b)
        rows = args.k.shape[0]
        start, end = (min(int(args.cu_seqlens_q[i]), rows) for i in (b, b + 1))
        return args.k[start:end], args.v[start:end], torch.arange(end - start)


class CrossSequenceLeak(Unmutated):
    name = "mutant-cross-sequence-leak"
    catalog_id = "document-mask-leak"
    bug = "the document mask is missing at the left edge: queries also see every key of the previous sequence"

    def sequence_keys(self, args, b):
        start = int(args.cu_seqlens_k[max(b - 1, 0)])
        own, end = int(args.cu_seqlens_k[b]), int(args.cu_seqlens_k[b + 1])
        return args.k[start:end], args.v[start:end], torch.arange(start - own, end - own)  # leaked keys sit at negative positions


class MaxSeqlenOffByOne(Unmutated):
    name = "mutant-max-seqlen-off-by-one"
    catalog_id = "key-extent-from-max-seqlen"
    bug = "the key loop stops at max_seqlen_k - 1: the last key of the longest sequences is never read"

    def visible(self, args, q_pos, k_pos, len_q, len_k):
        return super().visible(args, q_pos, k_pos, len_q, len_k) & (k_pos < args.max_seqlen_k - 1)


class KeyExtentFromMaxSeqlen(Unmutated):
    name = "mutant-key-extent-from-max-seqlen"
    catalog_id = "key-extent-from-max-seqlen"
    bug = ("each sequence's key count is taken from the batch-wide max_seqlen_k instead of its own offsets: "
           "shorter sequences read on into the next sequence's keys (or past the tensor)")

    def sequence_keys(self, args, b):
        start = int(args.cu_seqlens_k[b])
        k, v = raw_rows(args.k, start, start + args.max_seqlen_k), raw_rows(args.v, start, start + args.max_seqlen_k)
        return k, v, torch.arange(k.shape[0])

    def key_length(self, args, b):
        return args.max_seqlen_k


class KeyTailBlockSkipped(Unmutated):
    name = "mutant-key-tail-block-skipped"
    catalog_id = "length-not-multiple-of-tile"
    bug = (f"the key loop runs Lk // {TILE} full tiles: the keys of a partial last tile are never read "
           f"(a sequence shorter than {TILE} keys sees none)")

    def visible(self, args, q_pos, k_pos, len_q, len_k):
        return super().visible(args, q_pos, k_pos, len_q, len_k) & (k_pos < len_k // TILE * TILE)


class KeyTailScoredZero(Unmutated):
    name = "mutant-key-tail-scored-zero"
    catalog_id = "tail-tile-keys-scored-zero"
    bug = (f"the last key tile is loaded whole ({TILE} rows, zero-filled past the sequence) and only the "
           "causal mask is applied to it: the padding keys score 0, take softmax weight and add zero values")

    def sequence_keys(self, args, b):
        k, v, k_pos = super().sequence_keys(args, b)
        pad = -k.shape[0] % TILE
        k = torch.cat([k, k.new_zeros(pad, *k.shape[1:])])
        v = torch.cat([v, v.new_zeros(pad, *v.shape[1:])])
        return k, v, torch.arange(k.shape[0])


class DuplicatedExtendKeys(Unmutated):
    name = "mutant-duplicated-extend-keys"
    catalog_id = "extend-keys-counted-twice"
    bug = ("the key list of each sequence is built from its full length and then the new (extend) tokens "
           "are appended again: the last min(Lq, Lk) keys are attended twice")

    def sequence_keys(self, args, b):
        k, v, k_pos = super().sequence_keys(args, b)
        again = min(self.sequence_queries(args, b).shape[0], k.shape[0])
        tail = slice(k.shape[0] - again, k.shape[0])
        return torch.cat([k, k[tail]]), torch.cat([v, v[tail]]), torch.cat([k_pos, k_pos[tail]])


class ValueTilePastEnd(Unmutated):
    name = "mutant-value-tile-past-end"
    catalog_id = "masked-tail-times-nan"
    bug = (f"values are loaded in {TILE}-row tiles and the last tile runs past the sequence end; its "
           "probabilities are 0, but 0 x (NaN or Inf in the memory after the tensor) is NaN")

    def sequence_keys(self, args, b):
        k, _, k_pos = super().sequence_keys(args, b)
        start = int(args.cu_seqlens_k[b])
        return k, raw_rows(args.v, start, start + -(-k.shape[0] // TILE) * TILE), k_pos

    def weighted_values(self, args, p, v):
        """The whole value tile times P, P being 0 past the keys."""
        p = torch.cat([p, p.new_zeros(*p.shape[:2], v.shape[0] - p.shape[-1])], -1)
        return super().weighted_values(args, p, v)


# ---------------------------------------------------------------------------------------------------
# Causal masking


class CausalTopLeft(Unmutated):
    name = "mutant-causal-top-left"
    catalog_id = "causal-top-left"
    bug = "bottom-right causal masking is computed top-left (j <= i instead of j <= i + Lk - Lq)"

    def visible(self, args, q_pos, k_pos, len_q, len_k):
        causal = "top_left" if args.causal == "bottom_right" else args.causal
        return key_visible(q_pos, k_pos, len_q, len_k, causal)


class CausalDiagonalFromMaxSeqlen(Unmutated):
    name = "mutant-causal-diagonal-from-max-seqlen"
    catalog_id = "causal-offset-from-padded-maxima"
    bug = ("bottom-right causal uses one diagonal offset for the whole batch, max_seqlen_k - max_seqlen_q, "
           "instead of each sequence's Lk - Lq")

    def visible(self, args, q_pos, k_pos, len_q, len_k):
        return super().visible(args, q_pos, k_pos, args.max_seqlen_q, args.max_seqlen_k)


class CausalShiftFromFirstSequence(Unmutated):
    name = "mutant-causal-shift-from-first-sequence"
    catalog_id = "batch-mask-from-first-sequence"
    bug = ("the mask is evaluated for the first sequence and broadcast over the batch: every sequence gets "
           "the first sequence's bottom-right diagonal (its Lk - Lq)")

    def visible(self, args, q_pos, k_pos, len_q, len_k):
        return super().visible(args, q_pos, k_pos, args.seqlens_q[0], args.seqlens_k[0])


class GqaPackedRowCausal(Unmutated):
    name = "mutant-gqa-packed-row-causal"
    catalog_id = "gqa-pack-flag-without-packing"
    bug = ("the causal limit of query row i is computed as if query heads were packed into rows "
           "(row i // (Hq / Hkv)) although they are not")

    def visible(self, args, q_pos, k_pos, len_q, len_k):
        group = args.q.shape[1] // args.k.shape[1]
        if args.causal != "none" and group > 1:
            q_pos = q_pos // group
        return super().visible(args, q_pos, k_pos, len_q, len_k)


# ---------------------------------------------------------------------------------------------------
# Rows without a visible key


class NanForMaskedRows(Unmutated):
    name = "mutant-nan-masked-rows"
    catalog_id = "empty-row-nan-forward"
    bug = "a row with no visible key divides 0 by 0: its output is NaN instead of 0"

    def normalise(self, acc, row_sum):
        return acc / row_sum


class FiniteMaskSentinel(Unmutated):
    name = "mutant-finite-mask-sentinel"
    catalog_id = "finite-mask-sentinel"
    bug = ("masked scores get the dtype's most negative finite value instead of -inf, so a row with no "
           "visible key averages all of its sequence's values (and reports a huge negative LSE)")

    def mask(self, args, s, visible):
        sentinel = torch.finfo(args.q.dtype).min
        return s + torch.where(visible, 0.0, sentinel)


class EmptyStateMergeNan(Unmutated):
    name = "mutant-empty-state-merge-nan"
    catalog_id = "split-kv-empty-merge-nan"
    bug = (f"split-KV ({TILE} keys a split): the merge of partial states computes exp(lse_i - max lse) "
           "unguarded, so a row whose splits are all empty gets exp(-inf - -inf) = NaN")

    guard_empty = False

    def split_states(self, s, v):
        """Per split of TILE keys: (out [Hq, Lq, Dv], lse [Hq, Lq]), each guarded for empty rows."""
        states = []
        for j in range(0, max(s.shape[-1], 1), TILE):
            out, lse = Unmutated.softmax_values(self, None, s[..., j : j + TILE], v[j : j + TILE])
            states.append((out, lse))
        return states

    def merge(self, states):
        lses = torch.stack([lse for _, lse in states])
        top = lses.amax(0)
        if self.guard_empty:
            top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        weights = torch.exp(lses - top)
        total = weights.sum(0)
        out = sum(w[..., None] * o for w, (o, _) in zip(weights, states))
        if self.guard_empty:
            out = out / torch.where(total > 0, total, torch.ones_like(total))[..., None]
            return out, torch.where(total > 0, top + torch.log(total), torch.full_like(total, float("-inf")))
        return out / total[..., None], top + torch.log(total)

    def softmax_values(self, args, s, v):
        return self.merge(self.split_states(s, v))


class LseFromLastSplit(EmptyStateMergeNan):
    name = "mutant-lse-from-last-split"
    catalog_id = "split-kv-lse-wrong"
    bug = (f"split-KV ({TILE} keys a split): the output is merged correctly but the LSE returned is the "
           "last split's partial LSE, not the merged one")
    guard_empty = True

    def softmax_values(self, args, s, v):
        states = self.split_states(s, v)
        out, _ = self.merge(states)
        return out, states[-1][1]


# ---------------------------------------------------------------------------------------------------
# Head layout and head dims


class GqaHeadModulo(Unmutated):
    name = "mutant-gqa-head-modulo"
    catalog_id = "gqa-head-mapping-modulo"
    bug = "query head h reads KV head h % Hkv instead of h // (Hq / Hkv)"

    def kv_head_of(self, heads_q, heads_kv):
        return torch.arange(heads_q) % heads_kv


class HeadDimTruncated16(Unmutated):
    name = "mutant-head-dim-truncated-16"
    catalog_id = "head-dim-not-multiple-of-16"
    bug = ("the number of 16-wide MMA steps is head_dim // 16: for a head dim that is not a multiple of 16 "
           "the last channels drop out of Q K^T and the last output channels are never written")

    def scores(self, q, k):
        used = q.shape[-1] // 16 * 16
        return super().scores(q[..., :used], k[..., :used])

    def finish(self, args, out, lse):
        written = out.shape[-1] // 16 * 16
        return torch.cat([out[..., :written], torch.full_like(out[..., written:], float("nan"))], -1), lse


class HeadDimFixed64(Unmutated):
    name = "mutant-head-dim-fixed-64"
    catalog_id = "head-dim-hard-coded"
    bug = ("the kernel's head-dim tile is fixed at 64: above 64 it attends with the first 64 channels of "
           "q, k and v and never writes the output channels past 64")

    def scores(self, q, k):
        return super().scores(q[..., :64], k[..., :64])

    def finish(self, args, out, lse):
        if out.shape[-1] <= 64:
            return out, lse
        return torch.cat([out[..., :64], torch.full_like(out[..., 64:], float("nan"))], -1), lse


class ScaleFromValueDim(Unmutated):
    name = "mutant-scale-from-value-dim"
    catalog_id = "scale-from-wrong-dim"
    bug = "softmax_scale is ignored; the kernel always uses 1/sqrt(Dv) (the value head dim, not D)"

    def scale(self, args):
        return 1.0 / math.sqrt(args.v.shape[2])


class Float32AsBfloat16(Unmutated):
    name = "mutant-float32-as-bfloat16"
    catalog_id = "float32-reduced-precision-matmul"
    bug = "float32 inputs are multiplied at bfloat16 precision (a reduced-precision matmul mode left on)"

    def compute_view(self, t):
        if t.dtype == torch.float32:
            t = t.to(torch.bfloat16)
        return super().compute_view(t)


# ---------------------------------------------------------------------------------------------------
# Output and LSE layout


class UnwrittenTail(Unmutated):
    name = "mutant-unwritten-tail"
    catalog_id = "output-rows-unwritten"
    bug = ("the launch grid is rows // 16 blocks instead of ceil(rows / 16): the last rows % 16 output rows "
           "are never written and keep the buffer's contents (NaN here, garbage on a GPU)")
    block = 16

    def finish(self, args, out, lse):
        written = out.shape[0] // self.block * self.block
        unwritten = torch.full_like(out[written:], float("nan"))
        return torch.cat([out[:written], unwritten]), lse


class OutHeadMajorLayout(Unmutated):
    name = "mutant-out-head-major-layout"
    catalog_id = "output-written-with-wrong-strides"
    bug = ("the output is stored head-major ([Hq, rows, Dv]) into the token-major buffer [rows, Hq, Dv]: "
           "with more than one head every row holds the wrong numbers")

    def finish(self, args, out, lse):
        return out.transpose(0, 1).contiguous().reshape(out.shape), lse


class LseBase2(Unmutated):
    name = "mutant-lse-base2"
    catalog_id = "lse-base-2"
    bug = "the LSE is returned in base 2 (log2 of the sum of exp2), not the natural log the convention uses"

    def log_sum_exp(self, row_max, row_sum):
        return super().log_sum_exp(row_max, row_sum) * math.log2(math.e)


class LsePaddedLayout(Unmutated):
    name = "mutant-lse-padded-layout"
    catalog_id = "lse-padded-layout"
    bug = ("the LSE is written padded, [B, Hq, max_seqlen_q], and handed over as if it were the packed "
           "[Hq, total_q]: past the first sequence every entry belongs to another row")

    def assemble(self, args, parts):
        out, _ = super().assemble(args, parts)
        heads, longest = args.q.shape[1], args.max_seqlen_q
        padded = torch.zeros(len(parts), heads, longest, dtype=COMPUTE)
        for b, (_, lse) in enumerate(parts):
            padded[b, :, : lse.shape[1]] = lse
        rows = out.shape[0]
        return out, padded.reshape(-1)[: heads * rows].reshape(heads, rows)


class LseTokenMajor(Unmutated):
    name = "mutant-lse-token-major"
    catalog_id = "lse-token-major"
    bug = "the LSE is written token-major ([rows, Hq]) into the head-major [Hq, rows] buffer"

    def finish(self, args, out, lse):
        return out, lse.t().contiguous().reshape(lse.shape)


class LseEmptyKvPaddedOffset(Unmutated):
    name = "mutant-lse-empty-kv-padded-offset"
    catalog_id = "lse-early-exit-offset"
    bug = ("for a sequence without keys the early-exit path writes its -inf LSE at the padded offset "
           "((b * Hq + h) * max_seqlen_q + i) of the packed buffer: its own entries stay 0 and other rows' "
           "entries are overwritten")

    def assemble(self, args, parts):
        out, lse = super().assemble(args, parts)
        heads, rows, longest = lse.shape[0], lse.shape[1], args.max_seqlen_q
        flat = lse.detach().clone().reshape(-1)
        first = 0
        for b, (o, _) in enumerate(parts):
            if args.seqlens_k[b] == 0 and o.shape[0]:
                for h in range(heads):
                    flat.view(heads, rows)[h, first : first + o.shape[0]] = 0.0
                    for i in range(o.shape[0]):
                        at = (b * heads + h) * longest + i
                        if at < flat.numel():
                            flat[at] = float("-inf")
            first += o.shape[0]
        return out, flat.view(heads, rows)


class LseGqaDecodeFirstHeadOnly(Unmutated):
    name = "mutant-lse-gqa-decode-first-head-only"
    catalog_id = "lse-gqa-single-query-first-head"
    bug = ("when max_seqlen_q == 1 under GQA the LSE is written only for the first query head of each KV "
           "group; the other heads' entries keep the buffer's contents (NaN here)")

    def finish(self, args, out, lse):
        heads_q, heads_kv = args.q.shape[1], args.k.shape[1]
        if args.max_seqlen_q != 1 or heads_q == heads_kv:
            return out, lse
        group = heads_q // heads_kv
        first = (torch.arange(heads_q) % group == 0)[:, None]
        return out, torch.where(first, lse, torch.full_like(lse, float("nan")))


class GqaDecodeFastPathOneQueryEach(Unmutated):
    name = "mutant-gqa-decode-fast-path-one-query-each"
    catalog_id = "gqa-decode-fast-path-empty-query"
    bug = ("under GQA with max_seqlen_q == 1 a fast path folds the query-head group into the sequence axis, "
           "assuming exactly one query row per sequence: a batch with an empty query sequence fails")

    def forward(self, args):
        heads_q, heads_kv = args.q.shape[1], args.k.shape[1]
        if not args.broadcast_q and args.max_seqlen_q == 1 and heads_q > heads_kv and args.q.shape[0] != args.batch:
            shape = [args.batch, heads_q // heads_kv, heads_kv, args.q.shape[2]]
            raise RuntimeError(f"shape '{shape}' is invalid for input of size {args.q.numel()}")
        return super().forward(args)


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


# ---------------------------------------------------------------------------------------------------
# Pending: the bug classes below need a problem the ci drawing does not produce yet (see BUGS.md).


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


class FiniteRunningMaxSentinel(Unmutated):
    name = "mutant-finite-running-max-sentinel"
    catalog_id = "finite-running-max-sentinel"
    bug = ("the online softmax starts its running max at -5e4 (a finite stand-in for -inf) and computes "
           "exp in float32: a row whose every score is below about -5e4 underflows to 0 and returns zeros")

    sentinel = -5.0e4

    def softmax_values(self, args, s, v):
        if s.shape[-1]:
            row_max = s.amax(-1, keepdim=True).detach().clamp(min=self.sentinel)
        else:
            row_max = s.new_full((*s.shape[:2], 1), self.sentinel)
        p = torch.exp((s - row_max).float()).to(s.dtype)
        row_sum = p.sum(-1, keepdim=True)
        out = self.normalise(self.weighted_values(args, p, v), row_sum)
        # An underflowed row reports the sentinel as its LSE; a row with no visible key reports -inf.
        seen = torch.where(torch.isfinite(s).any(-1, keepdim=True), row_max, torch.full_like(row_max, float("-inf")))
        safe = torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))
        return out, torch.where(row_sum > 0, row_max + torch.log(safe), seen).squeeze(-1)


def _registry(*classes: type[Unmutated]) -> dict[str, type[Unmutated]]:
    return {cls.__name__: cls for cls in classes}


MUTANTS: dict[str, type[Unmutated]] = _registry(
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
    KeyExtentFromMaxSeqlen,
    KeyTailBlockSkipped,
    KeyTailScoredZero,
    DuplicatedExtendKeys,
    ValueTilePastEnd,
    CausalDiagonalFromMaxSeqlen,
    CausalShiftFromFirstSequence,
    GqaPackedRowCausal,
    FiniteMaskSentinel,
    EmptyStateMergeNan,
    LseFromLastSplit,
    HeadDimTruncated16,
    HeadDimFixed64,
    OutHeadMajorLayout,
    LsePaddedLayout,
    LseTokenMajor,
    LseEmptyKvPaddedOffset,
    NanGradRowsWithoutKeys,
    UnwrittenGradRows,
    DkvTileWritePastEnd,
    BackwardKeyExtentFromQuery,
    GradientsAllZero,
    EmptyWorkBackwardError,
    LseGqaDecodeFirstHeadOnly,
    GqaDecodeFastPathOneQueryEach,
)

PENDING: dict[str, type[Unmutated]] = _registry(
    ValueDimNarrowedInDq,
    FiniteRunningMaxSentinel,
)


def backend_spec(class_name: str) -> str:
    """The ``--backend`` value that selects a mutant (or the control, ``Unmutated``)."""
    return f"conformance.mutants:{class_name}"
