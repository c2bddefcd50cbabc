"""`flex`: ``torch.nn.attention.flex_attention`` over the packed batch with a document mask.

The packed q, k, v become one "sequence" each (``(1, H, total, D)``); a ``mask_mod`` keeps a query
and a key when they belong to the same document and the causal convention
(:func:`conformance.problem.key_visible`, as a per-document diagonal shift) allows the pair, so every causal
alignment is expressible. GQA is ``enable_gqa``. The LSE comes back through
``return_aux=AuxRequest(lse=True)`` (``return_lse=True`` on torch < 2.9), natural log, ``(1, Hq, total_q)``.

The BlockMask is built from the offsets alone (:func:`document_block_mask`), at block granularity:
``create_block_mask`` evaluates the mask densely, which over ~500k packed tokens asks for hundreds of GiB.

Compiling is bounded: the packed rows are padded to a multiple of :data:`ROW_BUCKET` (rows of a sentinel
document that sees nothing), so every problem up to that size has the same shapes, and flex is compiled
with ``dynamic=False``; the mask_mod's per-document tables are sized by a power-of-two bucket of the batch,
and the causal mode is data in them. One kernel configuration (dtype, head dims, heads, scale, ...) then
compiles once per bucket, instead of once per drawn length or batch size or causal mode, or once into a slow
dynamic-shape kernel.

On GPU flex_attention is compiled (the fused kernel, forward and backward). On CPU its compiled path
returns no LSE and has no backward, so there the adapter runs flex's eager implementation, which
evaluates ``mask_mod`` over the full score matrix (the BlockMask's sparsity is not used) and has no
backward either: on CPU this checks the adapter's conventions, not the fused kernel, so it runs only
when ``JFA_FLEX_CPU=1`` asks for it.

Tensor layouts: flex_attention takes tensors of any strides, so nothing is converted for it. The offsets
(int32 or int64, any strides) are read only here, to build the BlockMask and the mask_mod's lookup tables.
"""
from __future__ import annotations

import functools
import inspect
import os

import torch

from conformance.backend import Backend, Capabilities
from conformance.problem import CAUSAL_MODES, AttentionArgs, Output, diagonal_shift

BLOCK_SIZE = 128
ROW_BUCKET = 4096  # padded rows cost nothing: their blocks are empty
DOC_BUCKET = 64  # fewest per-document table entries (doc_slots)
CPU_OPT_IN = "JFA_FLEX_CPU"  # the CPU path costs minutes per spec run and checks no flex kernel


def _interval_matrix(rows: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, n_rows: int, n_cols: int) -> torch.Tensor:
    """Boolean ``[n_rows, n_cols]`` with ``[lo, hi)`` set in each given row (empty intervals ignored)."""
    keep = hi > lo
    rows, lo, hi = rows[keep], lo[keep], hi[keep]
    marks = torch.zeros(n_rows, n_cols + 1, dtype=torch.int32, device=rows.device)
    ones = torch.ones_like(rows, dtype=torch.int32)
    marks.index_put_((rows, lo), ones, accumulate=True)
    marks.index_put_((rows, hi), -ones, accumulate=True)
    return marks.cumsum(1)[:, :n_cols] > 0


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(num_blocks [1, 1, nQ], indices [1, 1, nQ, nKV])`` of a boolean block matrix, present blocks first."""
    num = blocks.sum(-1, dtype=torch.int32)
    order = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return num[None, None], order[None, None]


def document_blocks(cu_q: torch.Tensor, cu_k: torch.Tensor, causal: str, block_size: int = BLOCK_SIZE):
    """Partial and full ``[nQb, nKVb]`` block matrices of the packed document mask, with the same meaning as
    ``create_block_mask``'s (a block is full when every one of its block_size**2 pairs is visible, so tail
    blocks are never full), computed from the offsets without evaluating any token pair."""
    cu_q, cu_k = cu_q.long(), cu_k.long()
    total_q, total_k = int(cu_q[-1]), int(cu_k[-1])
    n_qb, n_kb = -(-total_q // block_size), -(-total_k // block_size)
    len_q, len_k = cu_q.diff(), cu_k.diff()
    docs = torch.nonzero(len_q > 0).flatten()
    first_block = cu_q[docs] // block_size
    counts = (cu_q[docs + 1] - 1) // block_size - first_block + 1
    doc = torch.repeat_interleave(docs, counts)  # one entry per (document, q block) pair
    qb = torch.repeat_interleave(first_block, counts) + torch.arange(int(counts.sum()), device=cu_q.device) - \
        torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    g0 = torch.maximum(qb * block_size, cu_q[doc])  # first and last query of the block inside the document
    g1 = torch.minimum((qb + 1) * block_size, cu_q[doc + 1]) - 1
    lq, lk = len_q[doc], len_k[doc]
    if causal == "none":
        n_any = n_all = lk
    else:  # the visible keys of local query p are the first min(lk, p + shift + 1) of the document
        shift = lk - lq if causal == "bottom_right" else torch.zeros_like(lk)
        n_any = torch.clamp(torch.minimum(lk, g1 - cu_q[doc] + shift + 1), min=0)
        n_all = torch.clamp(torch.minimum(lk, g0 - cu_q[doc] + shift + 1), min=0)
    k0 = cu_k[doc]
    any_blocks = _interval_matrix(qb, k0 // block_size, torch.where(n_any > 0, (k0 + n_any - 1) // block_size + 1, 0), n_qb, n_kb)
    whole_q_block = (g0 == qb * block_size) & (g1 == (qb + 1) * block_size - 1)
    full_lo = -(-k0 // block_size)
    full_hi = torch.where(whole_q_block, (k0 + n_all) // block_size, full_lo)
    full_blocks = _interval_matrix(qb, full_lo, full_hi, n_qb, n_kb)
    return any_blocks & ~full_blocks, full_blocks


def doc_slots(batch: int) -> int:
    """How many per-document entries the mask_mod's lookup tables hold: ``batch`` documents and two sentinels,
    rounded up to a power of two (at least :data:`DOC_BUCKET`). The tables' shapes are part of what dynamo
    compiles for, so batches of similar size share one graph instead of compiling one each."""
    return max(DOC_BUCKET, 1 << (batch + 1).bit_length())


def document_mask_mod(cu_q: torch.Tensor, cu_k: torch.Tensor, causal: str, pad_to: tuple[int, int]):
    """``mask_mod(b, h, q_idx, kv_idx)``: same document and visible under ``causal``. Padded positions up to
    ``pad_to`` belong to sentinel documents that never match, so the kernel may evaluate them safely. Every
    shape it captures depends on ``pad_to`` and :func:`doc_slots` alone, and the causal mode enters as data
    (:func:`diagonal_shift`): one compiled graph per bucket serves every batch and causal mode."""
    batch = cu_q.numel() - 1
    cu_q, cu_k = cu_q.long(), cu_k.long()
    slots = doc_slots(batch)

    def doc_ids(cu, sentinel, length):
        ids = torch.full((length,), sentinel, dtype=torch.long, device=cu.device)
        ids[: int(cu[-1])] = torch.repeat_interleave(torch.arange(batch, device=cu.device), cu.diff())
        return ids

    def table(values):
        out = values.new_zeros(slots)
        out[:batch] = values
        return out

    doc_q, doc_k = doc_ids(cu_q, batch, pad_to[0]), doc_ids(cu_k, batch + 1, pad_to[1])
    start_q, start_k = table(cu_q[:-1]), table(cu_k[:-1])
    shift = table(diagonal_shift(cu_q.diff(), cu_k.diff(), causal))

    def mask_mod(b, h, q_idx, kv_idx):
        d = doc_q[q_idx]
        same = d == doc_k[kv_idx]
        return same & (kv_idx - start_k[d] <= q_idx - start_q[d] + shift[d])

    return mask_mod


def bucket(rows: int) -> int:
    """The padded row count of ``rows``: the next multiple of :data:`ROW_BUCKET` (at least one bucket)."""
    return max(ROW_BUCKET, -(-rows // ROW_BUCKET) * ROW_BUCKET)


def document_block_mask(cu_q: torch.Tensor, cu_k: torch.Tensor, causal: str, block_size: int = BLOCK_SIZE,
                        rows: tuple[int, int] | None = None):
    """The flex BlockMask of a packed batch, from its offsets (no dense evaluation). ``rows``: the
    (query, key) row counts the tensors are padded to; the padded rows see nothing and are seen by none."""
    from torch.nn.attention.flex_attention import BlockMask

    partial, full = document_blocks(cu_q, cu_k, causal, block_size)
    rows = rows or (int(cu_q[-1]), int(cu_k[-1]))
    n_qb, n_kb = -(-rows[0] // block_size), -(-rows[1] // block_size)
    partial = torch.nn.functional.pad(partial, (0, n_kb - partial.shape[1], 0, n_qb - partial.shape[0]))
    full = torch.nn.functional.pad(full, (0, n_kb - full.shape[1], 0, n_qb - full.shape[0]))
    pad = (n_qb * block_size + block_size, n_kb * block_size + block_size)
    kv_num, kv_idx = _ordered(partial)
    full_num, full_idx = _ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size,
        mask_mod=document_mask_mod(cu_q, cu_k, causal, pad), seq_lengths=rows,
    )


def allow_recompiles(n: int) -> None:
    """Let dynamo recompile flex at least ``n`` times. Past its limit (8 by default) it runs flex's unfused
    eager path, which materializes the full score matrix (thousands of GiB over a big packed batch)."""
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), n))


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    # Static shapes (rows padded to buckets): one compile per kernel configuration and bucket. The limit
    # only has to exceed their number; past it dynamo would fall back to flex's unfused eager path.
    allow_recompiles(256)
    return torch.compile(flex_attention, dynamic=False)


class Flex(Backend):
    name = "flex"
    requires = ("torch.nn.attention.flex_attention",)

    @property
    def capabilities(self) -> Capabilities:
        # flex has no backward on CPU; a machine without a GPU checks the forward and LSE only.
        gpu = torch.cuda.is_available()
        return Capabilities(
            devices=("cuda", "cpu"),
            causal_modes=CAUSAL_MODES,
            broadcast_q="emulated",
            backward=gpu,
            min_compute_capability=(8, 0),
            compile_s=16.0 if gpu else None,  # measured: 574 s over 36 configurations, one H200, torch 2.11
            notes="document mask_mod + BlockMask built from offsets; compiled on GPU; on CPU flex's eager "
            "implementation, forward and LSE only (flex has no backward on CPU)",
        )

    def unavailable_reason(self, device: str) -> str | None:
        reason = super().unavailable_reason(device)
        if reason is None and torch.device(device).type == "cpu" and os.environ.get(CPU_OPT_IN) != "1":
            reason = (f"on CPU flex_attention has only its unfused eager implementation (forward and LSE, no "
                      f"backward), which checks this adapter but no flex kernel; set {CPU_OPT_IN}=1 to run it")
        return reason

    def forward(self, args: AttentionArgs) -> Output:
        from torch.nn.attention import flex_attention as flex_module

        hq, hkv, dv = args.q.shape[1], args.k.shape[1], args.v.shape[2]
        total_q, total_k = args.q.shape[0], args.k.shape[0]
        on_cpu = args.q.device.type == "cpu"
        if on_cpu and any(t.requires_grad for t in (args.q, args.k, args.v)):
            raise NotImplementedError("flex_attention has no backward on CPU")
        if total_q == 0 or total_k == 0:  # nothing to attend to: no kernel call
            lse = torch.full((hq, total_q), float("-inf"), device=args.q.device)
            return Output(args.q.new_zeros(total_q, hq, dv), lse)
        rows = (total_q, total_k) if on_cpu else (bucket(total_q), bucket(total_k))
        block_mask = document_block_mask(args.cu_seqlens_q, args.cu_seqlens_k, args.causal, rows=rows)
        # Padded to the bucket where need be; otherwise q, k, v reach flex as the views they are.
        padded = [t if n == t.shape[0] else torch.nn.functional.pad(t, (0, 0, 0, 0, 0, n - t.shape[0]))
                  for t, n in ((args.q, rows[0]), (args.k, rows[1]), (args.v, rows[1]))]
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in padded)  # (1, H, rows, D)
        flex = flex_module.flex_attention if on_cpu else _compiled_flex()
        options = dict(block_mask=block_mask, scale=args.softmax_scale, enable_gqa=hq != hkv)
        if "return_aux" in inspect.signature(flex_module.flex_attention).parameters:
            out, aux = flex(q, k, v, return_aux=flex_module.AuxRequest(lse=True), **options)
            lse = aux.lse
        else:
            out, lse = flex(q, k, v, return_lse=True, **options)
        return Output(out[0, :, :total_q].transpose(0, 1), lse[0, :, :total_q].float())
