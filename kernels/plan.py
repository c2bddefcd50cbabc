"""Planning a call on the host: which kernels run (``Paths``), their tiles, and the tile schedule, cached
per jagged layout.

    kernels ............ where ...................................................... else
    Gluon forward        sm_90, bf16/fp16, D and Dv in (64, 128), TMA layouts; the     tl forward
                         sequences with >= Config.gluon_split_keys keys
    Gluon dK/dV          the same, and D == Dv == 128                                  tl dK/dV
    Gluon dQ + delta     the same as dK/dV, and not broadcast-Q; runs first            preprocess pass, tl dQ

Every path is deterministic: each gradient element has one writer, and broadcast-Q's dQ sums fp32 partials
of batch chunks in a fixed order.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import NamedTuple, Optional

import numpy as np
import torch

from . import schedule as sched
from .config import Config
from .tl import INTERPRET
from .validation import validate

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
    schedule: dict  # device tensors of the tile lists (see _build_schedule)


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


def prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, broadcast_q,
            config: Config):
    """The host side of a call: validation (reads the offsets on the host), paths, tiles and the cached
    schedule.  Returns (q, k, v, cu_q, cu_k, LaunchPlan) with the offsets on q's device."""
    cu_q_h, cu_k_h, lens_q, lens_k = validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                              broadcast_q, softmax_scale)
    broadcast, causal = bool(broadcast_q), bool(causal)
    d = q.shape[2]
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(d)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    n_out_rows = int(lens_q.sum())
    paths = choose_paths(q, k, v, broadcast, n_out_rows, config)
    tiles = tl_tiles(max(d, v.shape[2]), q.dtype, q.device, config)
    s = _build_schedule(cu_q_h, cu_k_h, lens_q, lens_k, broadcast, causal, tiles, paths, config, q.shape[1],
                        k.shape[1], q.device)
    on_gluon, on_tl = (s[name] is not None and s[name][2] > 0 for name in ("fwd_gluon", "fwd"))
    paths = paths._replace(forward="gluon+tl" if on_gluon and on_tl else "gluon" if on_gluon else "tl")
    return (q, k, v, cu_seqlens_q, cu_seqlens_k,
            LaunchPlan(config, paths, tiles, causal, scale, broadcast, n_out_rows, s))


class AlignedColumns(NamedTuple):
    """Where each output row lies in the Gluon backward's fp32 statistics buffer (laid out [..., columns]).

    The dK/dV kernel moves 32 rows at a time from it to shared memory by TMA.  A TMA copy whose innermost
    coordinate is not 16 bytes aligned stops the kernel with an illegal instruction (measured on the H200),
    so every sequence starts at a column that is a multiple of 4."""
    cu: torch.Tensor  # int32 [B + 1]: first column of each sequence
    cols: torch.Tensor  # int32 [rows]: column of each output row
    n_cols: int  # a multiple of 4 (the buffers' row stride): rows + 3 B rounded up, at least 4


def aligned_columns(lens_out, to_device=torch.as_tensor):
    """AlignedColumns of the output rows, sequence b owning lens_out[b] consecutive rows (its queries, or
    under broadcast-Q its Lq output rows); ``to_device`` moves an int32 array to the GPU."""
    lens = np.asarray(lens_out, dtype=np.int64)
    cu = np.zeros(lens.shape[0] + 1, dtype=np.int64)
    np.cumsum((lens + 3) // 4 * 4, out=cu[1:])
    starts = np.cumsum(lens) - lens
    cols = np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(cu[:-1] - starts, lens)
    n_cols = max(4, -(-(int(lens.sum()) + 3 * lens.shape[0]) // 4) * 4)
    return AlignedColumns(to_device(cu.astype(np.int32)), to_device(cols.astype(np.int32)), n_cols)


_SCHED_CACHE: "OrderedDict[tuple, dict]" = OrderedDict()
_SCHED_CACHE_SIZE = 32


def _build_schedule(cu_q_h, cu_k_h, lens_q, lens_k, broadcast, causal, tiles, paths, config, hq, hkv, device):
    """Tile lists and launch orders for one call, on ``device``, cached per jagged layout and plan:
    fwd / fwd_gluon, kv / kv_gluon, q / q_gluon: (seq, blk, n_tiles, items) for the kernels that run (None for
    the others; the tl dQ's entry differs, see below); columns: AlignedColumns where the Gluon dK/dV runs;
    kv_needs_zero: some sequence has keys but no queries (its dK / dV rows are zeros no kernel writes)."""
    split = config.gluon_split_keys if paths.forward != "tl" else None
    key = (cu_q_h.tobytes(), cu_k_h.tobytes(), broadcast, causal, tiles, paths, split, hq, hkv, str(device))
    hit = _SCHED_CACHE.get(key)
    if hit is not None:
        _SCHED_CACHE.move_to_end(key)
        return hit

    def dev(a):
        return torch.as_tensor(np.ascontiguousarray(a, dtype=np.int32)).to(device, non_blocking=True)

    def tile_list(tiles_of, lq, lk, block, n_heads):
        seq, blk, work = tiles_of(lq, lk, block, causal)
        seq, blk, work = sched.sort_by_work(seq, blk, work=work)
        return dev(seq), dev(blk), int(seq.shape[0]), dev(sched.sequence_major_items(seq, work, n_heads))

    s = dict(fwd=None, fwd_gluon=None, kv=None, kv_gluon=None, columns=None, q=None, q_gluon=None)
    # forward rows: the sequences the Gluon forward takes, and the rest
    on_gluon = lens_k >= split if split is not None else np.zeros(lens_k.shape[0], dtype=bool)
    if on_gluon.any():
        from .gluon import fwd
        s["fwd_gluon"] = tile_list(sched.forward_tiles, np.where(on_gluon, lens_q, 0), lens_k, fwd.BLOCK_M, hq)
    s["fwd"] = tile_list(sched.forward_tiles, np.where(on_gluon, 0, lens_q), lens_k, tiles.fwd[0], hq)
    s["kv_needs_zero"] = bool(np.any((lens_q == 0) & (lens_k > 0)))
    if paths.dkdv == "gluon":
        from .gluon import dkdv
        s["kv_gluon"] = tile_list(sched.kv_tiles, lens_q, lens_k, dkdv.BLOCK_N.value, hkv)
        s["columns"] = aligned_columns(np.full(lens_k.shape[0], int(cu_q_h[1])) if broadcast else lens_q, dev)
    else:
        s["kv"] = tile_list(sched.kv_tiles, lens_q, lens_k, tiles.kv[1], hkv)
    if paths.dq == "gluon":  # the Gluon forward's 128-row tiles
        s["q_gluon"] = tile_list(sched.forward_tiles, lens_q, lens_k, 128, hq)
    elif not broadcast:
        # tl dQ: (first batch, end batch, q block, partial slot, n_tiles, n_slots) and the launch order
        seq, blk, work = sched.forward_tiles(lens_q, lens_k, tiles.q[0], causal)
        seq, blk, work = sched.sort_by_work(seq, blk, work=work)
        s["q"] = (dev(seq), dev(seq + 1), dev(blk), dev(np.zeros_like(seq)), int(seq.shape[0]), 1)
        s["q_items"] = dev(sched.sequence_major_items(seq, work, hq))
    else:
        # broadcast-Q: each dQ tile covers one q block over a contiguous chunk of batches, whose fp32 partial
        # goes to its own slot; the chunks are cut by work, about four programs per SM in all, heaviest first
        bm_q = tiles.q[0]
        B = lens_k.shape[0]
        n_mblk = (int(cu_q_h[1]) + bm_q - 1) // bm_q
        target = 4 * num_sms(device)
        n_chunks = max(1, min(B, -(-target // max(1, n_mblk * hq))))
        bounds = sched.split_batches_by_work(lens_k + 16, n_chunks)
        n_chunks = bounds.shape[0] - 1
        c = np.repeat(np.arange(n_chunks), n_mblk)
        m = np.tile(np.arange(n_mblk), n_chunks)
        cw = np.add.reduceat(lens_k + 16, bounds[:-1]) if B > 0 else np.zeros(n_chunks)
        order = np.argsort(-cw[c], kind="stable")
        c, m = c[order], m[order]
        s["q"] = (dev(bounds[:-1][c]), dev(bounds[1:][c]), dev(m), dev(c), int(c.shape[0]), n_chunks)
        s["q_items"] = None
    _SCHED_CACHE[key] = s
    if len(_SCHED_CACHE) > _SCHED_CACHE_SIZE:
        _SCHED_CACHE.popitem(last=False)
    return s


def default_config(config: Optional[Config]) -> Config:
    from .config import default
    if config is None:
        return default()
    if not isinstance(config, Config):
        raise ValueError(f"config must be a kernels.Config, got {type(config).__name__}")
    return config
