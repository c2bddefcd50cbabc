"""Mutants of the forward: offsets and boundaries, causal masks, rows without keys, heads, output and LSE."""
from __future__ import annotations

import math

import torch

from ..problem import key_visible
from .base import COMPUTE, TILE, Unmutated, raw_rows


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


class CausalOffsetWrapsUnsigned(Unmutated):
    name = "mutant-causal-offset-wraps-unsigned"
    catalog_id = "bottom-right-offset-unsigned-wrap"
    bug = (f"the bottom-right diagonal offset Lk - Lq is held unsigned: where Lq > Lk it wraps, so the per-tile "
           f"test 'does this tile need the mask?' fails for every {TILE}-row query tile starting above row Lq - Lk, "
           f"and those tiles' rows see every key below the tile's end + Lk - Lq (rows that should see none included)")

    def visible(self, args, q_pos, k_pos, len_q, len_k):
        correct = super().visible(args, q_pos, k_pos, len_q, len_k)
        if args.causal != "bottom_right" or len_q <= len_k:
            return correct
        tile_start = q_pos // TILE * TILE
        unmasked = k_pos < torch.clamp(tile_start + TILE + len_k - len_q, max=len_k)
        return torch.where(tile_start < len_q - len_k, unmasked, correct)


class QueryRowsFromBatchIndex(Unmutated):
    name = "mutant-query-rows-from-batch-index"
    catalog_id = "query-start-from-batch-index"
    bug = ("sequence b reads its queries from token b, not from cu_seqlens_q[b] (a batch stride of one token): "
           "every sequence after the first attends with other sequences' query rows")

    def sequence_queries(self, args, b):
        if args.broadcast_q:  # one shared query block: no per-sequence query offset to get wrong
            return super().sequence_queries(args, b)
        length = int(args.cu_seqlens_q[b + 1] - args.cu_seqlens_q[b])
        return raw_rows(args.q, b, b + length)


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


class ScaleKeyedOnShapes(Unmutated):
    name = "mutant-scale-keyed-on-shapes"
    catalog_id = "kernel-cache-key-incomplete"
    bug = ("the softmax scale is baked into a kernel kept in a cache keyed on the tensors' shapes alone: a later "
           "call with the same shapes and another scale runs with the first call's scale")

    def scale(self, args):
        kernels = self.__dict__.setdefault("_kernels", {})
        key = (tuple(args.q.shape), tuple(args.k.shape), tuple(args.v.shape), args.q.dtype)
        return kernels.setdefault(key, args.softmax_scale)


class OffsetsPlanKeyedOnIdentity(Unmutated):
    name = "mutant-offsets-plan-keyed-on-identity"
    catalog_id = "kernel-cache-key-incomplete"
    bug = ("the sequences are read from the offsets once and kept under the offsets tensors' identity and version "
           "counter: offsets tensors rebound to new storage (which leaves the counter) are read as they were")

    def plan_key(self, cu_q, cu_k) -> tuple:
        return (id(cu_q), cu_q._version, id(cu_k), cu_k._version)

    def read_inputs(self, args):
        plans = self.__dict__.setdefault("_plans", {})
        cu_q, cu_k = args.cu_seqlens_q, args.cu_seqlens_k
        # the tensors themselves are kept too, so their ids are not reused by other tensors
        _, _, kept_q, kept_k = plans.setdefault(self.plan_key(cu_q, cu_k), (cu_q, cu_k, cu_q.clone(), cu_k.clone()))
        return args.replace(cu_seqlens_q=kept_q, cu_seqlens_k=kept_k)


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


class LsePositiveInfWithoutKeys(Unmutated):
    name = "mutant-lse-positive-inf-without-keys"
    catalog_id = "empty-row-lse-positive-inf"
    bug = "a query row with no visible key gets LSE +inf (out 0 as it should), not -inf"

    def log_sum_exp(self, row_max, row_sum):
        lse = super().log_sum_exp(row_max, row_sum)
        return torch.where(row_sum > 0, lse, torch.full_like(lse, float("inf")))


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
