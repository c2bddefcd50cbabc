"""The control every mutant derives from: per-sequence attention in float64, as small overridable steps."""
from __future__ import annotations

import functools

import torch

from conformance.reference import Reference

from ..backend import Backend
from ..problem import AttentionArgs, Output, key_visible

COMPUTE = torch.float64
TILE = 16  # rows of the key / query tiles the tile-level mutants pretend to work in


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

    def expand_keys(self, k: torch.Tensor, kv_head: torch.Tensor) -> torch.Tensor:
        """Key rows per query head: k [Lk, Hkv, D] -> [Lk, Hq, D]."""
        return k[:, kv_head]

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

    def read_inputs(self, args: AttentionArgs) -> AttentionArgs:
        """q, k, v and the offsets as the kernel reads them from the caller's tensors."""
        return args

    def read_grad_out(self, grad: torch.Tensor) -> torch.Tensor:
        """The upstream gradient dO as the backward reads it from what autograd hands over."""
        return grad

    # -- the computation -----------------------------------------------------------------------
    def attend(self, args: AttentionArgs, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of sequence ``b``: out [Lq, Hq, Dv] and lse [Hq, Lq], in float64."""
        q = self.compute_view(self.sequence_queries(args, b))
        k, v, k_pos = self.sequence_keys(args, b)
        k, v = self.compute_view(k), self.compute_view(v)
        len_q, len_k = q.shape[0], self.key_length(args, b)
        kv_head = self.kv_head_of(q.shape[1], k.shape[1])
        s = self.scores(q, self.expand_keys(k, kv_head)) * self.scale(args)
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
        call = self.read_inputs(self._with_gradient_epilogue(args))
        parts = [self.attend(call, b) for b in range(call.batch)]
        if parts:
            out, lse = self.assemble(call, parts)
        else:
            out, lse = self.empty_output(call), torch.zeros(call.q.shape[1], 0, dtype=COMPUTE)
        out, lse = self.finish(call, out, lse)
        out = out.to(args.q.device, args.q.dtype)
        if type(self).read_grad_out is not Unmutated.read_grad_out and out.requires_grad:
            out = _GradientEpilogue.apply(out, self.read_grad_out)
        return Output(out, lse.to(args.q.device, torch.float32))

