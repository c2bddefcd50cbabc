"""Planning a call: which kernels run (``Paths``), their tiles, and their tile lists (schedule.py, built on
the device).

    kernels ............ where ...................................................... else
    Gluon forward        sm_90, bf16/fp16, D and Dv in (64, 128), TMA layouts; the     tl forward
                         sequences with >= Config.gluon_split_keys keys
    Gluon dK/dV          the same, and D == Dv in (64, 128)                                  tl dK/dV
    Gluon dQ + delta     the same as dK/dV, and not broadcast-Q; runs first            preprocess pass, tl dQ

Every path is deterministic: each gradient element has one writer, and broadcast-Q's dQ sums fp32 partials
of batch chunks in a fixed order.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional

import torch

from . import reuse
from . import schedule as sched
from .config import Config
from .tl import INTERPRET
from .validation import max_seqlen, validate

# tl tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel: fwd, dK/dV, dQ.  D=128 chosen by sweeps on
# the H200; the other head dims checked for correctness there, not tuned.  The interpreter's tiles are small
# (still BLOCK_M != BLOCK_N, so that the peeled causal loops are exercised).
_GPU_TILES = {
    16: dict(fwd=(64, 64, 4, 3), kv=(32, 64, 4, 3), q=(128, 64, 8, 3)),
    32: dict(fwd=(64, 64, 4, 3), kv=(32, 64, 4, 3), q=(128, 64, 8, 3)),
    64: dict(fwd=(64, 64, 4, 3), kv=(32, 64, 4, 3), q=(128, 64, 8, 3)),
    128: dict(fwd=(128, 32, 4, 4), kv=(32, 64, 4, 3), q=(128, 64, 8, 3)),
}
_GPU_TILES_FP32 = dict(fwd=(128, 32, 8, 2), kv=(32, 128, 8, 2), q=(128, 32, 8, 2))  # ieee dots
_CPU_TILES = dict(fwd=(32, 16, 4, 1), kv=(16, 32, 4, 1), q=(32, 16, 4, 1))


class Tiles(NamedTuple):
    fwd: tuple
    kv: tuple
    q: tuple


def tl_tiles(head_dim, dtype, device, config: Config) -> Tiles:
    if config.tl_tiles:
        table = _GPU_TILES[config.tl_tiles]
    elif device.type == "cpu":
        table = _CPU_TILES
    else:
        table = _GPU_TILES_FP32 if dtype == torch.float32 else _GPU_TILES[head_dim]
    return Tiles(table["fwd"], table["kv"], table["q"])


class Paths(NamedTuple):
    """What a call runs.  forward: "gluon", "tl" or "gluon+tl" (two launches, each sequence in one);
    dkdv, dq: "gluon" or "tl"; delta: "dq kernel" (the Gluon dQ kernel computes it) or "preprocess";
    why_not_gluon: why the Gluon kernels do not run here ("" where they do)."""
    forward: str
    dkdv: str
    dq: str
    delta: str
    why_not_gluon: str = ""

    def __str__(self):
        why = f" (no Gluon: {self.why_not_gluon})" if self.why_not_gluon else ""
        return f"forward {self.forward}; dK/dV {self.dkdv}; dQ {self.dq}; delta {self.delta}{why}"


class LaunchPlan(NamedTuple):
    """Everything launch.py needs besides the tensors: fixed at the forward, kept by autograd for the
    backward."""
    config: Config
    paths: Paths
    tiles: Tiles
    causal: bool
    scale: float
    broadcast: bool
    n_out_rows: int
    split: Optional[int]  # the Gluon forward's key split (None: no Gluon forward)
    group_rows: tuple  # ListSpec.group_rows of the query tiles' lists and of the key tiles' (head_groups)
    schedule: dict  # schedule.TileList etc. by kernel; the backward's added at the backward (a plan: at once)


@functools.lru_cache(maxsize=None)
def num_sms(device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def gluon_programs(n_items, device, config: Config):
    """(programs, dynamic) for a Gluon kernel's n_items: one program per SM (at most Config.gluon_programs),
    each claiming items from an atomic counter when some program has more than one."""
    cap = config.gluon_programs or num_sms(device)
    n_programs = min(n_items, cap)
    return n_programs, n_programs < n_items


def tma_refusal(t, block_rows):
    """Why TMA cannot load tiles of t [rows, heads, dim] as [block_rows, dim] blocks of its 2-D
    [rows, heads * dim] view ("" if it can)."""
    if t.shape[0] == 0:
        return "empty tensor"
    if t.shape[0] >= 2 ** 31 or t.shape[1] * t.shape[2] >= 2 ** 31:
        return "more than 2**31 rows or columns (TMA coordinates are int32)"
    if block_rows > 256 or t.shape[2] > 256:
        return "block larger than a TMA box (256 per dim)"
    if t.shape[2] * t.element_size() < 16:
        return "block rows shorter than 16 bytes"
    try:
        t2 = t.view(t.shape[0], t.shape[1] * t.shape[2])
    except RuntimeError:
        return "heads and head dim do not merge into one row (strided heads)"
    if t2.stride(1) != 1:
        return "last dim not contiguous"
    if t2.data_ptr() % 16 != 0:
        return "base not 16-byte aligned"
    if (t2.stride(0) * t.element_size()) % 16 != 0:
        return "row stride not a multiple of 16 bytes"
    return ""


def gluon_refusal(q, k, v, n_out_rows) -> str:
    """Why the Gluon kernels cannot run these tensors ("" if they can)."""
    if INTERPRET:
        return "the Triton interpreter does not run Gluon"
    if q.device.type != "cuda":
        return f"no Gluon kernels on {q.device.type}"
    if torch.cuda.get_device_capability(q.device) != (9, 0):
        return "the Gluon kernels use wgmma, which only sm_90 has"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"the Gluon kernels are bf16/fp16 only, got {q.dtype}"
    try:
        from .gluon import fwd
    except Exception as exc:  # a Triton without Gluon's Hopper API
        return f"this Triton has no Gluon Hopper API ({type(exc).__name__}: {exc})"
    if q.shape[2] not in fwd.HEAD_DIMS or v.shape[2] not in fwd.HEAD_DIMS:
        return f"the Gluon kernels cover head dims {fwd.HEAD_DIMS}, got {q.shape[2]}/{v.shape[2]}"
    for name, t, rows in (("q", q, fwd.HALF_M), ("k", k, fwd.BLOCK_N), ("v", v, fwd.BLOCK_N)):
        why = tma_refusal(t, rows)
        if why:
            return f"{name}: {why}"
    if n_out_rows >= 2 ** 31:  # dO, made contiguous where it is not, must be a TMA layout too
        return "more than 2**31 output rows"
    return ""


def choose_paths(q, k, v, broadcast, n_out_rows, config: Config) -> Paths:
    why = gluon_refusal(q, k, v, n_out_rows) if config.gluon else "Config.gluon is off"
    if why:
        return Paths("tl", "tl", "tl", "preprocess", why)
    from .gluon import dkdv
    bwd = "gluon" if q.shape[2] in dkdv.HEAD_DIMS and v.shape[2] == q.shape[2] else "tl"
    dq = "gluon" if bwd == "gluon" and not broadcast else "tl"
    # (forward "gluon": the Gluon forward takes the long sequences; prepare names what the schedule gives it)
    return Paths("gluon", bwd, dq, "dq kernel" if dq == "gluon" else "preprocess")


def kernel_layout(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the kernels take it: unit last stride and a 16-byte aligned base, which every compiled variant
    assumes (Triton would compile variants of their own for unaligned bases; TMA cannot load them).  Any other
    view is copied; autograd carries the gradient back to it."""
    if t.stride(-1) == 1 and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


class _Decision(NamedTuple):
    """What the host decides for a call from its layouts alone (no tensor values): kept by ``_decisions``."""
    scale: float
    paths: Paths
    tiles: Tiles
    split: Optional[int]
    n_out_rows: int
    group_rows: tuple
    specs: tuple  # the forward's tile lists (schedule.ListSpec) ...
    names: tuple  # ... and their names in LaunchPlan.schedule


# Decisions by layout: a call whose tensors have the shapes, strides, dtypes, devices and base alignment of an
# earlier call's, with the same arguments and Config, passes the same validation (values aside) and runs the
# same kernels.  Bounded; cleared when full.
_decisions: dict = {}
_MAX_DECISIONS = 256


def _layout_key(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, broadcast_q, config):
    """The key of a call's decision, or None (not tensors: validation names the field)."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v, cu_q, cu_k)):
        return None
    # (the types of the scalars too: 3 and 3.0 are one dict key, and only one of them passes validation)
    return (tuple((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16) for t in (q, k, v)),
            cu_q.shape, cu_q.stride(), cu_q.dtype, cu_q.device, cu_k.shape, cu_k.stride(), cu_k.dtype, cu_k.device,
            type(max_seqlen_q), max_seqlen_q, type(max_seqlen_k), max_seqlen_k, type(causal), causal,
            type(softmax_scale), softmax_scale, type(broadcast_q), broadcast_q, config)


def head_groups(q, k, v, config: Config) -> tuple:
    """ListSpec.group_rows for the query tiles' lists and the key tiles' lists: the streamed rows (K and V for a
    query tile, Q and dO for a key tile, which takes the query heads of its KV head) whose bytes fit
    ``Config.head_group_bytes``."""
    row_bytes = (q.shape[2] + v.shape[2]) * q.element_size()
    gqa = max(1, q.shape[1] // max(1, k.shape[1]))
    rows = config.head_group_bytes // row_bytes
    return rows * gqa, rows // gqa


def _decide(q, k, v, n_seqs, max_seqlen_k, causal, softmax_scale, broadcast, config: Config) -> _Decision:
    """Paths, tiles, the forward's key split and lists for q, k, v as the kernels take them (kernel_layout)."""
    d = q.shape[2]
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(d)
    n_out_rows = q.shape[0] * n_seqs if broadcast else q.shape[0]
    paths = choose_paths(q, k, v, broadcast, n_out_rows, config)
    tiles = tl_tiles(max(d, v.shape[2]), q.dtype, q.device, config)
    split = None
    if paths.forward == "gluon":
        split = config.gluon_split_keys
        hint = max_seqlen("max_seqlen_k", max_seqlen_k)
        if hint is not None and hint < split:  # (a wrong hint only moves sequences to the tl forward)
            split = None
            paths = paths._replace(forward="tl")
        elif split > 0:
            paths = paths._replace(forward="gluon+tl")
    groups = head_groups(q, k, v, config)
    specs, names = [], []
    if split is not None:
        from .gluon import fwd
        specs.append(sched.ListSpec(fwd.BLOCK_M, q.shape[1], side=sched.ALL if split == 0 else sched.KEYS_AT_LEAST,
                                    split=split, group_rows=groups[0]))
        names.append("fwd_gluon")
    if split != 0:
        specs.append(sched.ListSpec(tiles.fwd[0], q.shape[1], side=sched.ALL if split is None else sched.KEYS_BELOW,
                                    split=split or 0, group_rows=groups[0]))
        names.append("fwd")
    return _Decision(scale, paths, tiles, split, n_out_rows, groups, tuple(specs), tuple(names))


def prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, broadcast_q,
            config: Config, check_offsets=None, lists="forward", reuse_lists=False):
    """The host side of a call: validation, paths, tiles, and the forward's tile lists built on the device
    (no wait for the GPU unless the offsets are read: ``check_offsets``, by default the Config's, or offsets
    on the CPU); ``lists="backward"`` builds the backward's instead, for a backward that runs without its
    forward's plan (the compiled one).  Returns (q, k, v, cu_q, cu_k, LaunchPlan), the offsets as the
    kernels read them (clamped, int32 where they fit).  ``reuse_lists`` (a plain call's, where
    ``Config.reuse_lists`` is on): the forward's lists are taken from, or kept for, later calls with the
    same offsets tensors (reuse.py).  Validation and the decisions that follow from layouts alone are kept by
    layout (``_decisions``) where no offsets are read."""
    if lists not in ("forward", "backward"):
        raise ValueError(f"lists must be 'forward' or 'backward', got {lists!r}")
    if check_offsets is None:
        check_offsets = config.check_offsets or (isinstance(cu_seqlens_k, torch.Tensor)
                                                 and cu_seqlens_k.device.type == "cpu")
    key = None if check_offsets else _layout_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                 causal, softmax_scale, broadcast_q, config)
    decision = _decisions.get(key) if key is not None else None
    if decision is None:
        validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, broadcast_q, softmax_scale,
                 read_offsets=check_offsets)
    q, k, v = (kernel_layout(t) for t in (q, k, v))
    if decision is None:
        decision = _decide(q, k, v, cu_seqlens_k.shape[0] - 1, max_seqlen_k, bool(causal), softmax_scale,
                           bool(broadcast_q), config)
        if key is not None:
            if len(_decisions) >= _MAX_DECISIONS:
                _decisions.clear()
            _decisions[key] = decision
    broadcast, causal = bool(broadcast_q), bool(causal)
    plan = LaunchPlan(config, decision.paths, decision.tiles, causal, decision.scale, broadcast, decision.n_out_rows,
                      decision.split, decision.group_rows, {})
    if lists == "backward":
        plan.schedule.update(backward_lists(plan, q.shape, k.shape, q.device, offsets=(cu_seqlens_q, cu_seqlens_k)))
        order = plan.schedule["order"]
        return q, k, v, order.cu_q, order.cu_k, plan
    order, lists, entry = reuse.forward_lists(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], decision.specs,
                                              causal=causal, broadcast=broadcast,
                                              enabled=reuse_lists and config.reuse_lists,
                                              fused_items_seqs=config.builder_items_seqs)
    plan.schedule.update(dict(fwd_gluon=None, fwd=None, order=order, reuse=entry), **dict(zip(decision.names, lists)))
    return q, k, v, order.cu_q, order.cu_k, plan


def backward_lists(plan: LaunchPlan, q_shape, k_shape, device, offsets=None) -> dict:
    """The backward's tile lists: "kv_gluon" with the statistics "columns", or "kv"; "q_gluon", "q" or
    broadcast-Q's "chunks".  From the forward's order, or, given the caller's ``offsets`` (cu_q, cu_k), with
    the order built in the same pass (a backward without its forward's plan: the compiled one); then the
    result holds that "order" too."""
    order = plan.schedule["order"] if offsets is None else None
    n_seqs = order.n_seqs if order is not None else offsets[1].shape[0] - 1
    hq, hkv = q_shape[1], k_shape[1]
    s = {}
    specs, names = [], []
    if plan.paths.dkdv == "gluon":
        from .gluon import dkdv
        s["columns"] = sched.columns_for(n_seqs, plan.n_out_rows, device)
        specs.append(sched.ListSpec(dkdv.BLOCK_N.value, hkv, kv=True, group_rows=plan.group_rows[1]))
        names.append("kv_gluon")
    else:
        specs.append(sched.ListSpec(plan.tiles.kv[1], hkv, kv=True, group_rows=plan.group_rows[1]))
        names.append("kv")
    if plan.paths.dq == "gluon":  # the Gluon forward's 128-row tiles
        specs.append(sched.ListSpec(128, hq, group_rows=plan.group_rows[0]))
        names.append("q_gluon")
    elif not plan.broadcast:
        specs.append(sched.ListSpec(plan.tiles.q[0], hq, group_rows=plan.group_rows[0]))
        names.append("q")
    if order is None:
        order, lists = sched.order_and_lists(offsets[0], offsets[1], q_shape[0], k_shape[0], specs,
                                             causal=plan.causal, broadcast=plan.broadcast, columns=s.get("columns"))
        s["order"] = order
    else:
        _, lists = sched.order_and_lists(order.cu_q, order.cu_k, order.rows_q, order.rows_k, specs,
                                         causal=plan.causal, broadcast=plan.broadcast, order=order,
                                         columns=s.get("columns"))
    s.update(zip(names, lists))
    if plan.broadcast and plan.paths.dq != "gluon":
        # each dQ tile covers one q block over a contiguous chunk of batches, whose fp32 partial goes to its
        # own slot: about four programs per SM in all
        n_mblk = _cdiv(q_shape[0], plan.tiles.q[0])
        n_chunks = max(1, min(n_seqs, _cdiv(4 * num_sms(device), max(1, n_mblk * hq))))
        s["chunks"] = sched.broadcast_chunks(order.cu_k, n_seqs, n_chunks, n_mblk)
    return s


def _cdiv(a, b):
    return -(-a // b)


def default_config(config: Optional[Config]) -> Config:
    from .config import default
    if config is None:
        return default()
    if not isinstance(config, Config):
        raise ValueError(f"config must be a kernels.Config, got {type(config).__name__}")
    return config
