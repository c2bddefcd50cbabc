"""Mutants of what the caller chooses: the offsets' type and strides, strided inputs and upstream
gradients, and values whose scores lie far from 0."""
from __future__ import annotations

import math

import torch

from ..oracle import attention as exact_attention
from ..problem import AttentionArgs, Output
from .base import TILE, Unmutated

FLOAT32_EXP_LIMIT = math.log(torch.finfo(torch.float32).max)  # 88.72: exp of more is inf in float32


# ---------------------------------------------------------------------------------------------------
# Offsets


class _MisreadOffsets(Unmutated):
    """The kernel reads the offsets wrongly (``misread``); it clamps what it read into a non-decreasing
    sequence within the rows, computes on it and writes the rows it thinks exist (the others stay 0)."""

    def misread(self, cu: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, args: AttentionArgs) -> Output:
        cu_q, cu_k = (self.misread(cu).to(torch.int64) for cu in (args.cu_seqlens_q, args.cu_seqlens_k))
        if torch.equal(cu_q, args.cu_seqlens_q.to(torch.int64)) and torch.equal(cu_k, args.cu_seqlens_k.to(torch.int64)):
            return super().forward(args)
        cu_q = cu_q.cummax(0).values.clamp(0, args.q.shape[0])
        cu_k = cu_k.cummax(0).values.clamp(0, args.k.shape[0])
        if args.broadcast_q:
            cu_q = args.cu_seqlens_q
        result = super().forward(args.replace(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k))
        rows = args.q.shape[0] * args.batch if args.broadcast_q else sum(args.seqlens_q)
        out, lse = result.out[:rows], result.lse[:, :rows]
        missing = rows - out.shape[0]
        out = torch.cat([out, out.new_zeros(missing, *out.shape[1:])])
        return Output(out, torch.cat([lse, lse.new_zeros(lse.shape[0], missing)], 1))


class Int64OffsetsReadAsInt32(_MisreadOffsets):
    name = "mutant-int64-offsets-read-as-int32"
    catalog_id = "offsets-int64-read-as-int32"
    bug = ("the kernel declares its offsets int32 and reads an int64 tensor's memory as int32: entry i is "
           "the low or high half of offset i // 2, and the sequences it sees are not the caller's")

    def misread(self, cu):
        if cu.dtype != torch.int64:
            return cu
        return cu.contiguous().view(torch.int32)[: cu.numel()]


class StridedOffsetsReadContiguous(_MisreadOffsets):
    name = "mutant-strided-offsets-read-contiguous"
    catalog_id = "offsets-not-contiguous"
    bug = ("the kernel takes the offsets' data pointer and reads consecutive elements: a strided view "
           "(every other element of a longer tensor) is read as the elements next to each other")

    def misread(self, cu):
        if cu.stride(0) == 1 or cu.numel() < 2:
            return cu
        return torch.as_strided(cu, (cu.numel(),), (1,))


# ---------------------------------------------------------------------------------------------------
# Strides of q, k, v and dO


def _packed_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


class TokenStrideAssumedPacked(Unmutated):
    name = "mutant-token-stride-assumed-packed"
    catalog_id = "token-stride-assumed-packed"
    bug = ("the kernel addresses q, k and v with the packed strides (H*D per row, D per head) from the "
           "tensors' data pointers: views of a fused projection or of wider heads are read misaligned")

    def read_inputs(self, args):
        def as_packed(t):
            extent = t.storage_offset() + t.numel()
            if t.is_contiguous() or extent * t.element_size() > t.untyped_storage().nbytes():
                return t
            return torch.as_strided(t, t.shape, _packed_strides(t.shape))

        return args.replace(q=as_packed(args.q), k=as_packed(args.k), v=as_packed(args.v))


class MisalignedBaseRoundedDown(Unmutated):
    name = "mutant-misaligned-base-rounded-down"
    catalog_id = "misaligned-view-base"
    bug = ("the kernel assumes q, k and v start on a 16-byte boundary (as a TMA descriptor or 128-bit loads "
           "need): a view whose base is not aligned is read from the boundary below it, a few elements early")

    def read_inputs(self, args):
        def rounded_down(t):
            per_line = max(1, 16 // t.element_size())
            offset = t.storage_offset()
            if offset % per_line == 0:
                return t
            return torch.as_strided(t, t.shape, t.stride(), offset - offset % per_line)

        return args.replace(q=rounded_down(args.q), k=rounded_down(args.k), v=rounded_down(args.v))


class NonContiguousGradOutReadPacked(Unmutated):
    name = "mutant-non-contiguous-grad-out-read-packed"
    catalog_id = "non-contiguous-grad-out"
    bug = ("the backward reads dO from its data pointer with packed strides: an expanded dO (stride 0, "
           "from out.sum()) or a transposed one is read as other numbers (past an expanded dO's memory, 0)")

    def read_grad_out(self, grad):
        if grad.is_contiguous():
            return grad
        available = grad.untyped_storage().nbytes() // grad.element_size() - grad.storage_offset()
        n = min(grad.numel(), max(available, 0))
        raw = torch.empty(0, dtype=grad.dtype, device=grad.device).set_(
            grad.untyped_storage(), grad.storage_offset(), (n,), (1,))
        read = torch.zeros(grad.numel(), dtype=grad.dtype, device=grad.device)
        read[:n] = raw
        return read.view(grad.shape)


# ---------------------------------------------------------------------------------------------------
# Scores far from 0


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


class RunningMaxResetToZero(Unmutated):
    name = "mutant-running-max-reset-to-zero"
    catalog_id = "running-max-reset-to-zero"
    bug = (f"the online softmax walks key tiles of {TILE} from the last one; where a row's tile is fully "
           "masked its running max becomes 0 (the value meant only to keep exp() finite), and if every "
           "later score is far below 0, exp(score - 0) underflows: the row comes out 0")

    def softmax_values(self, args, s, v):
        heads, rows, keys = s.shape
        running = s.new_full((heads, rows, 1), float("-inf"))
        total = s.new_zeros(heads, rows, 1)
        acc = s.new_zeros(heads, rows, v.shape[-1])
        for start in reversed(range(0, keys, TILE)):
            tile, values = s[..., start : start + TILE], v[start : start + TILE]
            new = torch.maximum(running, tile.amax(-1, keepdim=True).detach())
            new = torch.where(torch.isfinite(new), new, torch.zeros_like(new))  # the bug: stored, not only used
            rescale = torch.exp((running - new).float()).to(s.dtype)
            p = torch.exp((tile - new).float()).to(s.dtype)
            total = total * rescale + p.sum(-1, keepdim=True)
            acc = acc * rescale + self.weighted_values(args, p, values)
            running = new
        out = self.normalise(acc, total)
        return out, self.log_sum_exp(running, total).squeeze(-1)


class FixedMaxSubtraction(Unmutated):
    name = "mutant-fixed-max-subtraction"
    catalog_id = "fixed-max-subtraction-overflow"
    bug = ("the softmax subtracts a fixed 10 instead of the row max before exp (in float32): scores "
           "above about 99 overflow to inf and the row comes out NaN")

    def softmax_values(self, args, s, v):
        p = torch.exp((s - 10.0).float()).to(s.dtype)
        row_sum = p.sum(-1, keepdim=True)
        out = self.normalise(self.weighted_values(args, p, v), row_sum)
        return out, self.log_sum_exp(torch.full_like(row_sum, 10.0), row_sum).squeeze(-1)


class BackwardPaddedKeysOverflow(Unmutated):
    name = "mutant-backward-padded-keys-overflow"
    catalog_id = "backward-padded-keys-overflow"
    bug = (f"the backward pads a sequence's last key tile to {TILE} with keys scored 0 and masks them by "
           "multiplying with 0 afterwards: where a row's LSE is below -88.7, exp(0 - LSE) is inf in float32 "
           "and inf x 0 makes that row's dQ NaN")

    def edit_gradient(self, args, name, grad):
        if name != "q" or args.broadcast_q:
            return grad
        plain = args.replace(**{n: getattr(args, n).detach() for n in ("q", "k", "v")})
        lse = exact_attention(plain).lse  # [Hq, rows]
        grad = grad.clone()
        cu = args.cu_seqlens_q
        for b, lk in enumerate(args.seqlens_k):
            if lk % TILE == 0:
                continue
            start, end = int(cu[b]), int(cu[b + 1])
            rows = lse[:, start:end]
            # (a row without a visible key has an LSE of -inf, which kernels treat on its own)
            overflow = (torch.isfinite(rows) & (rows < -FLOAT32_EXP_LIMIT)).transpose(0, 1)  # [rows, Hq]
            grad[start:end][overflow] = float("nan")
        return grad
