"""Poisoned memory, so that a kernel which reads or returns memory it never wrote shows NaN.

Two tools:

* :func:`poison_free_memory` fills every free block of PyTorch's CUDA caching allocator with 0xFF bytes
  before a backend runs (the harness calls it in ``call_backend``). The next ``torch.empty`` a kernel
  or adapter makes is carved from those blocks, so an output row it forgets to write is NaN instead of
  a stale copy of some earlier, plausible result. A no-op off CUDA.
* :func:`guarded` places a tensor between rows of NaN, so a kernel reading past either end of its
  input reads NaN, and a kernel writing past either end is seen when the guard rows change.

0xFF bytes are NaN in every float format (float32, float16, bfloat16) and -1 in every integer format.
"""
from __future__ import annotations

import torch

POISON_BYTE = 0xFF


def _free_cached_blocks(index: int) -> list[int]:
    """Sizes of the allocator's free (cached but unallocated) blocks on device ``index``, largest first."""
    sizes = [
        block["size"]
        for segment in torch.cuda.memory_snapshot()
        if segment.get("device") == index
        for block in segment.get("blocks", ())
        if block.get("state") == "inactive"
    ]
    return sorted(sizes, reverse=True)


def poison_free_memory(device) -> int:
    """Fill the CUDA caching allocator's free blocks on ``device`` with NaN bytes; return how many bytes.

    Each free block is taken with an allocation of its exact size (the allocator's best fit returns that
    block), filled, and handed back once all are held, so the cache ends as it began, only poisoned. An
    allocation the cache could not serve from a free block is released unfilled and the rest skipped, so
    poisoning never grows the memory the process reserves by more than that one block.
    """
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    with torch.cuda.device(index):
        reserved = torch.cuda.memory_reserved(index)
        held, poisoned = [], 0
        for size in _free_cached_blocks(index):
            block = torch.empty(size, dtype=torch.uint8, device=f"cuda:{index}")
            if torch.cuda.memory_reserved(index) > reserved:
                del block
                break
            block.fill_(POISON_BYTE)
            held.append(block)
            poisoned += size
        del held
    return poisoned


def guarded(t: torch.Tensor, rows: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """``(buffer, view)``: ``view`` equals ``t`` and lies in ``buffer`` between ``rows`` NaN rows on each side.

    ``view`` has ``t``'s strides and storage offset (a contiguous ``t`` gives a contiguous view with a nonzero
    storage offset, as any slice of a larger packed tensor is; a strided one, NaN in its gaps as well; an
    expanded one, its zero strides: broadcast-Q's one query row repeated per sequence is such a tensor)."""
    if t.is_contiguous():
        buffer = torch.empty(t.shape[0] + 2 * rows, *t.shape[1:], dtype=t.dtype, device=t.device)
        buffer.view(torch.uint8).fill_(POISON_BYTE)
        view = buffer[rows : rows + t.shape[0]]
    else:
        margin = rows * max(t.stride(0), t[0].numel() if t.shape[0] else 0, 1)  # an expanded row: its size
        extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1 if t.numel() else 0
        buffer = torch.empty(2 * margin + t.storage_offset() + extent, dtype=t.dtype, device=t.device)
        buffer.view(torch.uint8).fill_(POISON_BYTE)
        view = buffer.as_strided(t.shape, t.stride(), margin + t.storage_offset())
    # an expanded dimension holds one element many times: write it once (a copy into overlapping
    # memory is refused)
    source, target = t, view
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride())):
        if stride == 0 and size > 1:
            source, target = source.narrow(dim, 0, 1), target.narrow(dim, 0, 1)
    target.copy_(source)
    return buffer, view


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaN payloads included), which ``torch.equal`` is not for NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
