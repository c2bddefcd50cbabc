"""Tile lists kept across plain calls with the same offsets.

A model calls attention once per layer with the same ``cu_seqlens`` tensors, and a plain call builds its tile
lists on the device at every call (schedule.py): two or three small launches, most of a short problem's host
time.  So a plain call keeps what it built (the Order and the forward's and backward's tile lists) under its
offsets tensors, and a later call whose offsets are *the same tensor objects, unwritten since* runs on the
lists kept, launching only the attention kernels, as a JaggedPlan does.

"Unwritten since" is PyTorch's version counter: every in-place write through PyTorch (``copy_``, indexing,
``out=``), through any view of the storage, advances it.  The key holds each offsets tensor's identity (a weak
reference, checked on a hit: a new tensor at a freed one's address is another tensor), storage address,
version, shape, strides and dtype, the row counts, causal and broadcast flags, and the current stream (a
stream other than the builders' might read the lists before they are written).  Nothing is kept or reused:

* for inference tensors, which have no version counter;
* while the current CUDA stream is being captured into a graph: a graph must contain its own builders, or its
  replays would read lists built from the offsets of the capture, whatever the buffers hold later;
* under ``Config(reuse_lists=False)``.

What the counter cannot see is a write outside PyTorch (a custom kernel or a foreign framework writing the
offsets' memory in place); such callers turn reuse off.  A JaggedPlan has its own lists and never looks here,
and inside torch.compile the custom operators (torch_ops.py) build their lists at every call.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import NamedTuple, Optional

import torch

from . import schedule as sched

MAX_ENTRIES = 16


class _Entry(NamedTuple):
    refs: tuple  # weak references to the caller's offsets tensors
    stream: object
    order: sched.Order
    lists: dict  # (kind, key) -> what schedule built


_lock = threading.Lock()
_entries: "OrderedDict[tuple, _Entry]" = OrderedDict()
_stats = {"hits": 0, "misses": 0}


def _stream(device):
    if device.type != "cuda":
        return None
    return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None
                                              else torch.cuda.current_device())


def _key(cu_q, cu_k, rows_q, rows_k, causal, broadcast):
    """The entry key of a call's offsets, or None where nothing may be kept (module docstring)."""
    if cu_q.is_inference() or cu_k.is_inference():
        return None
    device = cu_k.device
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    return (id(cu_q), cu_q.data_ptr(), cu_q._version, tuple(cu_q.shape), cu_q.stride(), cu_q.dtype,
            id(cu_k), cu_k.data_ptr(), cu_k._version, tuple(cu_k.shape), cu_k.stride(), cu_k.dtype,
            device, rows_q, rows_k, bool(causal), bool(broadcast), _stream(device))


def _drop(key):
    with _lock:
        _entries.pop(key, None)


def lookup(cu_q, cu_k, rows_q, rows_k, causal, broadcast) -> tuple[Optional[tuple], Optional[_Entry]]:
    """(key, entry): the entry kept for these offsets, if any; key None where nothing may be kept."""
    key = _key(cu_q, cu_k, rows_q, rows_k, causal, broadcast)
    if key is None:
        return None, None
    with _lock:
        entry = _entries.get(key)
        if entry is not None and entry.refs[0]() is cu_q and entry.refs[1]() is cu_k:
            _entries.move_to_end(key)
            _stats["hits"] += 1
            return key, entry
        _stats["misses"] += 1
    return key, None


def keep(key, cu_q, cu_k, order) -> _Entry:
    """A new entry for ``order`` built from these offsets (the key ``lookup`` gave); its lists are added by
    the caller."""
    # the entry goes when either offsets tensor does (its weak reference's callback), so no kept list
    # outlives the offsets it came from
    refs = (weakref.ref(cu_q, lambda _, k=key: _drop(k)), weakref.ref(cu_k, lambda _, k=key: _drop(k)))
    entry = _Entry(refs, key[-1], order, {})
    with _lock:
        _entries[key] = entry
        while len(_entries) > MAX_ENTRIES:
            _entries.popitem(last=False)
    return entry


def forward_lists(cu_q, cu_k, rows_q, rows_k, specs, *, causal, broadcast, enabled: bool, fused_items_seqs: int):
    """``schedule.order_and_lists`` for a plain call's forward, reusing what an earlier call with the same
    offsets built (``fused_items_seqs``: schedule.order_and_lists).  Returns (order, lists, entry): the entry
    (None where nothing is kept) holds the backward's lists once built (``backward``)."""
    key, entry = lookup(cu_q, cu_k, rows_q, rows_k, causal, broadcast) if enabled else (None, None)
    specs_key = ("forward", tuple(specs))
    if entry is not None:
        lists = entry.lists.get(specs_key)
        if lists is None:
            _, lists = sched.order_and_lists(entry.order.cu_q, entry.order.cu_k, rows_q, rows_k, specs, causal=causal,
                                             broadcast=broadcast, order=entry.order)
            entry.lists[specs_key] = lists
        return entry.order, lists, entry
    order, lists = sched.order_and_lists(cu_q, cu_k, rows_q, rows_k, specs, causal=causal, broadcast=broadcast,
                                         fused_items_seqs=fused_items_seqs)
    if key is not None:
        entry = keep(key, cu_q, cu_k, order)
        entry.lists[specs_key] = lists
    return order, lists, entry


def backward(entry: Optional[_Entry], plan_key, build):
    """The backward's lists for a plan kept in ``entry`` (``build()`` makes them where none are kept, or the
    current stream is not the one the entry's lists were built on)."""
    if entry is None or _stream(entry.order.cu_k.device) != entry.stream \
            or (entry.order.cu_k.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return build()
    lists = entry.lists.get(("backward", plan_key))
    if lists is None:
        lists = build()
        entry.lists[("backward", plan_key)] = lists
    return lists


def stats() -> dict:
    """Hits and misses so far, and the entries kept (for tests and benchmarks)."""
    with _lock:
        return dict(_stats, entries=len(_entries))


def clear() -> None:
    with _lock:
        _entries.clear()
        _stats.update(hits=0, misses=0)
