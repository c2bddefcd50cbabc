"""Host side of the Triton jagged flash attention: validation, tile schedules,
launches and the autograd Function.

    out, lse = jagged_flash_attention(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                      max_seqlen_q, max_seqlen_k, causal=False,
                                      softmax_scale=None, broadcast_q=False,
                                      deterministic=False)

See the spec conventions in README / kernels/PERF.md.  By default dQ is
computed without atomics (one writer per element; broadcast-Q sums fp32
per-chunk partials in a fixed order), so every gradient is bitwise reproducible
for a given input whether or not ``deterministic`` is set.  The opt-in
BWD_DQ_MODE = "atomic" adds dQ with fp32 atomics (not reproducible) and applies
only when ``deterministic`` is False.
"""
from __future__ import annotations

import math
import os
from collections import OrderedDict
from typing import NamedTuple, Optional

import numpy as np
import torch

from . import schedule as sched
from . import triton_kernels as tk

# Head dims whose kernels were compiled and checked on the H200 (64, 128 in every
# GPU run; 16 and 32 in the first GPU test run) and under the interpreter.
# 256 is not declared: it was never compiled for the GPU.
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
DQ_DETERMINISTIC = True  # the default dQ uses no atomics (the opt-in atomic mode yields to deterministic=True)

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# ---------------------------------------------------------------------------
# launch configurations
# ---------------------------------------------------------------------------
# (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel; D=128 entries chosen by
# the H200 sweeps in kernels/PERF.md (v2); the other head dims reuse the v1/v2
# small-tile choices and were checked for correctness on the H200, not tuned.  The interpreter uses small blocks (still BLOCK_M !=
# BLOCK_N so that the peeled causal loops are exercised).
_GPU_CFG = {
    # head_dim: fwd, bwd_kv, bwd_q
    16: dict(fwd=(64, 64, 4, 3), kv=(32, 64, 4, 3), kvf=(64, 128, 8, 2), q=(128, 64, 8, 3), qds=(128, 64, 8, 3)),
    32: dict(fwd=(64, 64, 4, 3), kv=(32, 64, 4, 3), kvf=(64, 128, 8, 2), q=(128, 64, 8, 3), qds=(128, 64, 8, 3)),
    64: dict(fwd=(64, 64, 4, 3), kv=(32, 64, 4, 3), kvf=(64, 128, 8, 2), q=(128, 64, 8, 3), qds=(128, 64, 8, 3)),
    128: dict(fwd=(128, 32, 4, 4), kv=(32, 64, 4, 3), kvf=(64, 128, 8, 3), q=(128, 64, 8, 3),
              qds=(128, 64, 8, 3)),
}
_GPU_CFG_FP32 = dict(fwd=(128, 32, 8, 2), kv=(32, 128, 8, 2), kvf=(32, 128, 8, 2), q=(128, 32, 8, 2),
                     qds=(64, 64, 4, 2))
_CPU_CFG = dict(fwd=(32, 16, 4, 1), kv=(16, 32, 4, 1), kvf=(16, 32, 4, 1), q=(32, 16, 4, 1), qds=(32, 16, 4, 1))

# Tests / benchmarks may override: {"fwd": (...), "kv": (...), "kvf": (...), "q": (...), "qds": (...)}
CONFIG_OVERRIDE: dict = {}

# dQ strategy when deterministic=False and not broadcast-Q:
#   "separate": own dQ kernel (recomputes QK^T and dP; no atomics; deterministic)
#   "atomic":   dQ fused into the dK/dV kernel with fp32 atomics (fewer matmuls,
#               summation order not fixed); with BWD_KV_KERNEL = "gluon" where it runs, the Gluon
#               dK/dV kernel does it (dQ^T blocks added by TMA into a transposed fp32 buffer; the
#               plain block order only); under "auto" the tl dK/dV kernel does
#   "ds":       the tl dK/dV kernel also stores dS (q's dtype, the value its dK matmul uses) in a workspace
#               of Hq x sum(lq * lk) elements, and dQ = dS @ K reads it back (_bwd_q_from_ds_kernel): five
#               matmuls in all instead of seven, for the workspace's write and read.  No atomics: as
#               reproducible as "separate", so it also serves deterministic=True and broadcast-Q.  Runs
#               with the tl dK/dV kernel only (BWD_KV_KERNEL "triton", or "auto", which picks it for this
#               mode) and while the workspace fits DS_WORKSPACE_MAX_BYTES;
#               otherwise the "separate" path runs and LAST_BWD_DQ_PATH says why.
# "atomic" yields to deterministic=True and broadcast-Q ("separate" runs).  Environment: JFA_BWD_DQ_MODE.
BWD_DQ_MODES = ("separate", "atomic", "ds")
BWD_DQ_MODE = os.environ.get("JFA_BWD_DQ_MODE", "separate")
DS_WORKSPACE_MAX_BYTES = 8 << 30
# How the "atomic" mode adds a dQ block (runtime switch, for benchmarks):
#   "tma": one bulk reduce-add of the block through a TMA descriptor of the fp32 accumulator, where the
#     GPU has TMA (sm_90 or newer); elsewhere, and under the interpreter (no TMA reduce there), "element".
#   "element": one relaxed fp32 atomic per element.
# LAST_BWD_DQ_PATH names what the latest backward did: "separate" (tl dQ kernel), "gluon" (Gluon dQ kernel),
# "atomic-tma" / "atomic-element" (fused into the tl dK/dV kernel) or "atomic-gluon-keys" / "atomic-gluon-dim"
# (fused into the Gluon one, GLUON_FUSED_DQ_SPLIT).
# How the Gluon dK/dV kernel splits the fused dQ between its two consumer groups (runtime switch):
#   "keys": each group adds the whole head dim over its own 64 keys (8 bytes of reduce traffic per
#     query/key pair);
#   "dim": each group adds one 64-row half of the head dim over all 128 keys, dS^T of both groups meeting
#     in shared memory (4 bytes per pair, as FA3; head dim 128 only, 64 runs "keys").
# Exact on the H200 (its GPU tests), and slower than the default backward on every bench shape
# ("keys": 0.69-0.86x, PERF.md v14), so opt-in.
GLUON_FUSED_DQ_SPLITS = ("keys", "dim")
GLUON_FUSED_DQ_SPLIT = os.environ.get("JFA_GLUON_FUSED_DQ_SPLIT", "keys")
# Shared-memory buffers each consumer group stages its dQ^T parts in (runtime switch, 1 or 2): with one,
# a part waits until the TMA unit has read the previous one (with "keys" at head dim 128: the block's
# first half, every block); with two, the previous add stays in flight.  Two are compiled for sm_90 (no
# spills in the per-block loop with "keys") but not yet run on a GPU.  Environment: JFA_GLUON_FUSED_DQ_BUFFERS.
GLUON_FUSED_DQ_BUFFERS = int(os.environ.get("JFA_GLUON_FUSED_DQ_BUFFERS", "1"))
BWD_DQ_REDUCES = ("tma", "element")
BWD_DQ_REDUCE = "tma"
LAST_BWD_DQ_PATH = ""

# Forward K/V loads (runtime switches, for benchmarks; defaults = shipped path):
#   FWD_TMA: load K/V tiles through TMA tensor descriptors (Hopper or newer, and
#     the interpreter).  Used only where the tensors meet TMA's rules (see
#     _fwd_descs); otherwise the pointer path runs, so the switch never changes
#     an answer, only the instructions.
#   FWD_PTR_ADVANCE: pointer path only; advance the K/V address tiles by a
#     scalar step instead of rebuilding them each iteration.
#   FWD_WARP_SPECIALIZE: the forward's unmasked key loop asks Triton for
#     automatic warp specialization (tl.range(warp_specialize=True)); GPU only.
# LAST_FWD_PATH names the path the latest forward call took ("gluon", "ptr",
# "ptr-adv" or "tma"; "gluon+ptr" etc. when FWD_KERNEL = "split" used both) and,
# for "ptr" under FWD_TMA, why TMA was not used.
FWD_TMA = False
FWD_PTR_ADVANCE = False
FWD_WARP_SPECIALIZE = False
LAST_FWD_PATH = ""

# Grids (runtime switches, for benchmarks; defaults = shipped path):
#   "sorted": one program per (tile, head), launched in ITEM_ORDER (below); the
#     hardware block scheduler hands them out as SMs free up (dynamic balancing).
#   "persistent": PERSISTENT_CTAS_PER_SM x SMs programs, each looping over a
#     static list: the forward deals its (tile, q head) items in zigzag order
#     (schedule.persistent_zigzag); the dK/dV pass deals its (tile, kv head)
#     items block-innermost round-robin (schedule.block_innermost_round_robin).
# The dQ pass always uses the sorted grid, and FWD_WARP_SPECIALIZE applies to
# the sorted forward only.  Either grid computes the same tiles with the same code, so the switch
# never changes an answer.
GRIDS = ("sorted", "persistent")
FWD_GRID = "sorted"
BWD_KV_GRID = "sorted"
PERSISTENT_CTAS_PER_SM = 2
# The Gluon kernels' grid (forward and dK/dV; its own switch: one Gluon CTA fills an SM, so it weighs
# differently):
#   "sorted": one program per item, in ITEM_ORDER; the hardware hands them out.
#   "persistent": one program per SM, items dealt round-robin from the ITEM_ORDER list; the loader
#     fetches the next item's Q and K/V while the consumers finish the current one.
#   "dynamic": one program per SM, each taking the next unclaimed item of the ITEM_ORDER list from an
#     atomic counter when its loader is ready for it (persistent overlap, the hardware's balance).
# Which program runs which item changes nothing in an item's arithmetic: same answers bit for bit.
# "dynamic" is the default (environment: JFA_GLUON_GRID): through plans in one H200 call it was the
# fastest forward on five of the six bench shapes and level on the sixth (PERF.md v10: S1c +11%, S4a +21%
# over "sorted"; "persistent" gained on S4a and S2 only).
GLUON_GRIDS = ("sorted", "persistent", "dynamic")
GLUON_GRID = os.environ.get("JFA_GLUON_GRID", "dynamic")

# Launch order of the sorted grids' (tile, head) items (runtime switch; never changes an answer):
#   "work": tile-major, heaviest tile first across the batch, heads innermost.  The programs in
#     flight then hold the same q block of many (sequence, head) pairs, each streaming its own K/V
#     (or Q/dO for dK/dV) from memory: nothing is reused from L2.
#   "sequence": schedule.sequence_major_items: sequences heaviest first, then head, then tile, so
#     the programs in flight share a few pairs' K/V.
#   "section": schedule.sectioned_items: the sequence order's pairs cut into sections of about
#     SECTION_BYTES of K/V (Q/dO for dK/dV), heaviest tile first inside each section, so the last
#     pair's heavy tiles do not start last (the tail the sequence order pays on a few long causal
#     sequences).
# Applies to the forward (tl and Gluon), dK/dV and the non-broadcast dQ pass; broadcast-Q dQ keeps
# its chunk order.
ITEM_ORDERS = ("work", "sequence", "section")
ITEM_ORDER = "sequence"  # tl kernels: faster or level on every bench shape on the H200 (PERF.md v7)
SECTION_BYTES = 16 << 20  # a third of H200's 50 MB L2; the tail model is flat here on the bench shapes
# ("section" measured level with "sequence" in PERF.md v8, so "sequence" stays the default)

# Forward kernel (runtime switch; the environment variable JFA_FWD_KERNEL sets it at import, so a
# spec run in worker processes can pick it):
#   "triton": the tl kernel in triton_kernels.py (every device, dtype and declared head dim; the
#     interpreter).
#   "gluon": gluon_fwd.py, written for Hopper: sm_90 only (wgmma), bf16/fp16, head dims 64 and 128,
#     q/k/v layouts TMA can describe.  Anywhere else the tl kernel runs and LAST_FWD_PATH says why,
#     so the switch never changes which inputs are accepted.
#   "split": where Gluon can run, the sequences with at least GLUON_SPLIT_KEYS keys go to the Gluon
#     forward and the rest to the tl kernel (two launches writing disjoint rows).  The Gluon forward
#     holds one CTA per SM and streams 128-key blocks, so short or ragged key ranges waste it; the tl
#     kernel keeps two tiles per SM in flight on 32-key blocks.
#   "auto" (the default): "split" where Gluon can run, else "triton", silently (LAST_FWD_PATH names the
#     kernel that ran).  Measured through plans in PERF.md v9 (same call as FA4): split at 512 keys was
#     the fastest forward or within 3% of it on all six bench shapes (S4b +40% over tl alone, S3 +13%).
FWD_KERNELS = ("auto", "triton", "gluon", "split")
FWD_KERNEL = os.environ.get("JFA_FWD_KERNEL", "auto")
# dK/dV kernel of the backward (runtime switch, environment JFA_BWD_KV_KERNEL):
#   "triton": the tl kernel in triton_kernels.py.
#   "gluon": gluon_bwd.py, written for Hopper like the Gluon forward (same conditions; dO must also be a
#     layout TMA can describe, checked at the backward).  Anywhere else the tl kernel runs and
#     LAST_BWD_KV_PATH says why.  dQ stays with a dQ kernel, so the backward stays deterministic, unless
#     BWD_DQ_MODE = "atomic" fuses it in (see there).  Exact on the H200.  Slower than the tl kernel on
#     most bench shapes until its LSE / delta came by TMA with each block (PERF.md v17); since then faster
#     on all six (plain order, three stages: +3% to +14%).
#   "auto" (the default since PERF.md v17): "gluon" where it can run, at the head dims in
#     GLUON_BWD_AUTO_HEAD_DIMS, and with dQ in its own kernel (BWD_DQ_MODE "separate"), else "triton",
#     silently (LAST_BWD_KV_PATH names the kernel that ran).
#   "split": the key blocks of sequences with at least GLUON_BWD_SPLIT_KEYS keys go to the Gluon kernel,
#     the rest to the tl kernel: two launches writing disjoint dK / dV rows (as the forward's "split").
#     Not with the fused atomic dQ (the tl kernel then does all).  Exact on the H200 (22 GPU tests, PERF.md
#     v16); timed then against the tl dK/dV kernel, before the Gluon one became the default.
BWD_KV_KERNELS = ("auto", "triton", "gluon", "split")
# "split": fewest keys a sequence needs for its dK / dV to go to the Gluon kernel (v15: it beats the tl
# kernel on S4b's 4,096-key sequences only)
GLUON_BWD_SPLIT_KEYS = 2048
BWD_KV_KERNEL = os.environ.get("JFA_BWD_KV_KERNEL", "auto")
# "auto" takes the Gluon dK/dV kernel only where it was timed (every bench shape has D = Dv = 128)
GLUON_BWD_AUTO_HEAD_DIMS = (128,)
# Q/dO blocks in flight (GLUON_BWD_BLOCK_M rows each), 1..4: at 32 rows two were 20-25% faster than one
# (PERF.md v11); with the statistics by TMA three are level to 4% faster than two but on S3 (v17); with K
# in registers 2, 3 and 4 are within 2% on four bench shapes, 4 is 4% faster on S2, 2 and 4 slower on S3 (v19)
GLUON_BWD_STAGES = 3
# Query rows per streamed block, 32 or 64 (64: S^T / dP^T as 64 x 64 MMAs, half the waits per row; exact,
# 3-8% slower on the H200 in v15 and level in v17; the fused dQ adds 32-row parts, so it needs 32)
GLUON_BWD_BLOCK_MS = (32, 64)
GLUON_BWD_BLOCK_M = 32
# Order of the blocks inside each consumer group (runtime switch):
#   "plain": per block S^T and dP^T, wait, P and dS, dV and dK, wait (gluon_bwd._block).
#   "overlap": the forward's order: block t's S^T / dP^T go ahead of block t-1's dV / dK, and block t's
#     P / dS are computed while those run (gluon_bwd._overlapped_item); needs two stages or more.
#     Level with "plain" in v17 (+3-6% on S4b / S1, -6% on S3, one round), so "plain" stays.
#     Level again in v18 (three rounds), and ahead of a "paired" order (two blocks per iteration), which
#     was also wrong on two causal test cases and was removed (PERF.md v18).
GLUON_BWD_ORDERS = ("plain", "overlap")
GLUON_BWD_ORDER = "plain"
# dQ kernel of the backward (runtime switch, environment JFA_BWD_Q_KERNEL):
#   "triton": the tl dQ kernel in triton_kernels.py.
#   "gluon": gluon_dq.py, written for Hopper like the Gluon forward (same conditions; dO must be a layout
#     TMA can describe, checked at the backward; not for broadcast-Q, whose dQ sums over the batch, nor
#     with the fused atomic dQ mode).  Anywhere else the tl dQ kernel runs and LAST_BWD_DQ_PATH says why.
#     One writer per dQ element, so deterministic like the tl kernel.
#   "auto" (the default since PERF.md v13): "gluon" where it can run and the head dims are in
#     GLUON_DQ_AUTO_HEAD_DIMS, else "triton", silently (LAST_BWD_DQ_PATH names the kernel that ran).  On
#     the H200 the backward with it is level on S4b and 2-7% faster on S1 / S1c / S4a / S3 (v12 three
#     rounds, v13), and the GPU spec passes with it (v13).
BWD_Q_KERNELS = ("auto", "triton", "gluon")
BWD_Q_KERNEL = os.environ.get("JFA_BWD_Q_KERNEL", "auto")
# "auto" takes the Gluon dQ kernel only where it was timed (every bench shape has D = Dv = 128); at 64 it
# is tested on the H200 but not timed, so the tl kernel keeps those calls
GLUON_DQ_AUTO_HEAD_DIMS = (128,)
GLUON_DQ_STAGES = 2  # K/V blocks in flight (64 keys each); two fill sm_90's shared memory at head dim 128
GLUON_DQ_BOX_ROWS = (64, 64)  # TMA box rows of its Q / dO halves and of its K / V blocks (gluon_dq.py)
GLUON_BWD_KV_ROWS = 64  # TMA box rows of the Gluon dK/dV kernel's K / V halves (its Q / dO: GLUON_BWD_BLOCK_M)
# The Gluon kernels write an output tile of 64 rows that lies wholly inside its sequence by one TMA store
# from a shared buffer the tile's MMAs no longer read: dK / dV from the item's K / V halves, dQ and the
# forward's O from its Q halves; ragged tiles by masked stores (a TMA store would write the next
# sequence's rows).  GLUON_TMA_STORE_KERNELS names the kernels that do: any of "forward" and "backward"
# (both Gluon backward kernels); () is masked stores throughout, as before v18.  Masked stores still: the
# forward where Dv != D (O does not fit a Q buffer) and the dK/dV kernel with dQ fused by "dim" (both
# groups read both K halves there).  On the H200 the backward gained 4-16% (PERF.md v18), the forward
# 2-27% (v18, v19); both passed every Gluon GPU test and the spec with them (v18, v19), and the outputs are
# identical to the bit with masked stores.  Environment: JFA_GLUON_TMA_STORE_KERNELS, the names joined by
# commas ("" for none).
GLUON_TMA_STORE_KERNELS_ALL = ("forward", "backward")
# The Gluon backward kernels' S^T / S MMAs with their fixed A operand in registers, loaded once per item: K in
# the dK/dV kernel (S^T = K Q^T), Q in the dQ kernel (S = Q K^T).  Those MMAs then read only their B operand
# from shared memory, whose bandwidth limits them at these tile shapes (an m64n32k16 wgmma with both
# operands in shared memory reads 3 KB in the 16 cycles it takes at the peak rate: about 1.5x what shared
# memory gives).  Compiled for sm_90 without spills in the loop or serialized wgmma (dO / V stay in shared
# memory: with them in registers too, ptxas serializes the dQ kernel's wgmma).  The dK/dV kernel does it in
# the plain order at 32-row query blocks without fused dQ only (the overlapped order with it has every
# wgmma serialized by Triton 3.6's ptxas, 64-row blocks too and about 100 spills, the fused dQ about 50
# spills); elsewhere it keeps K in shared memory.  On the H200 (PERF.md v19): gradients identical to the
# bit to those with K / Q in shared memory, the spec conformant, and the backward 2-7% faster on all six
# bench shapes (four rounds).  Environment: JFA_GLUON_BWD_REG_OPERAND=0 / 1.
_reg_operand_env = os.environ.get("JFA_GLUON_BWD_REG_OPERAND", "1")
GLUON_BWD_REG_OPERAND = {"0": False, "1": True}.get(_reg_operand_env, _reg_operand_env)  # else refused at the call
GLUON_TMA_STORE_KERNELS = tuple(
    n for n in os.environ.get("JFA_GLUON_TMA_STORE_KERNELS", "forward,backward").split(",") if n)
# Where the Gluon dQ kernel runs, it also computes delta = rowsum(dO * O) for its rows (O read once per item,
# overlapped with its first MMAs) and writes delta and the Gluon dK/dV kernel's statistics, so the backward
# skips the separate preprocess pass (one read of O and dO: 0.27 ms of S1's ~6 ms backward on the H200,
# PERF.md v18) and launches the dQ kernel before the dK/dV kernels.  Elsewhere (tl dQ, broadcast-Q, the
# fused dQ modes) the preprocess pass runs.  LAST_BWD_DELTA_PATH names which did.  On the H200 (PERF.md v20)
# the GPU tests and the spec pass with it; timed, it is level with the separate pass within the noise of the
# medians (its fastest rounds were 1-5% faster in 9 of 10 pairs).  Environment: JFA_GLUON_DQ_DELTA=0 / 1.
_dq_delta_env = os.environ.get("JFA_GLUON_DQ_DELTA", "1")
GLUON_DQ_DELTA = {"0": False, "1": True}.get(_dq_delta_env, _dq_delta_env)  # else refused at the call
LAST_BWD_DELTA_PATH = ""
LAST_BWD_KV_PATH = ""


def last_backward_paths() -> str:
    """What the latest backward ran, in one line (benchmarks and profiles record it beside their times)."""
    return f"dK/dV {LAST_BWD_KV_PATH or '-'}; dQ {LAST_BWD_DQ_PATH or '-'}; delta {LAST_BWD_DELTA_PATH or '-'}"


# (BLOCK_M, BLOCK_N, warps per consumer warp group, K/V stages, schedule); schedules (gluon_fwd.py):
# "overlap" softmax(j) while PV(j-1) runs; "pingpong" overlap, and the two consumer groups take turns
# to issue their MMAs.  (A third form, PV reading P from shared memory, was no faster: PERF.md v9.)
GLUON_SCHEDULES = ("overlap", "pingpong")
GLUON_FWD_CFG = (128, 128, 4, 2, "overlap")  # the fastest Gluon choice on the H200 overall (PERF.md v6)
GLUON_HEAD_DIMS = (64, 128)
# 512: of 512 / 1024 / 2048, the best or level on every bench shape (PERF.md v9); environment: as JFA_FWD_KERNEL
GLUON_SPLIT_KEYS = int(os.environ.get("JFA_GLUON_SPLIT_KEYS", "512"))


def _cfg(kind: str, head_dim: int, dtype: torch.dtype, on_cpu: bool):
    if kind in CONFIG_OVERRIDE:
        return CONFIG_OVERRIDE[kind]
    if on_cpu:
        return _CPU_CFG[kind]
    if dtype == torch.float32:  # the slower fp32 path (ieee dots): the tiles of the first GPU run
        return _GPU_CFG_FP32[kind]
    return _GPU_CFG[head_dim][kind]


def _num_sms(device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


# ---------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------
def _external_validate(q, k, v, cu_q, cu_k, max_q, max_k, broadcast_q, softmax_scale):
    try:
        from conformance.validation import validate_packed_inputs  # type: ignore
    except Exception:  # not written yet / not installed: our own checks below still run
        return
    validate_packed_inputs(q, k, v, cu_q, cu_k, max_q, max_k,
                           broadcast_q=broadcast_q, softmax_scale=softmax_scale)


def _check_cu(name, cu_h, rows):
    if cu_h.ndim != 1 or cu_h.shape[0] < 1:
        raise ValueError(f"{name} must be a 1-D tensor of length B+1 >= 1")
    if cu_h[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {cu_h[0]}")
    if cu_h.shape[0] > 1 and np.any(np.diff(cu_h) < 0):
        raise ValueError(f"{name} must be non-decreasing")
    if cu_h[-1] != rows:
        raise ValueError(f"{name}[-1] must equal the number of packed rows ({rows}), got {cu_h[-1]}")


# Signatures of calls the shared validator already accepted.  The validator is
# a pure function of (shapes, dtypes, devices, offset values, bounds, flags),
# and everything it reads is in the key, so a hit skips only a repeat of the
# same verdict (it walks the offsets in Python: ~0.2 ms at B=1024).
_VALID_MEMO: "OrderedDict[tuple, bool]" = OrderedDict()


def _validate(q, k, v, cu_q, cu_k, max_q, max_k, broadcast_q, softmax_scale):
    memo_key = None
    if all(isinstance(t, torch.Tensor) for t in (q, k, v, cu_q, cu_k)) and cu_q.dim() == 1 and cu_k.dim() == 1:
        cq = cu_q.detach().to("cpu")
        ck = cu_k.detach().to("cpu")
        memo_key = (tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype, k.dtype, v.dtype,
                    str(q.device), str(k.device), str(v.device), str(cu_q.device), str(cu_k.device),
                    cu_q.dtype, cu_k.dtype, cq.numpy().tobytes(), ck.numpy().tobytes(),
                    repr(max_q), repr(max_k), bool(broadcast_q), repr(softmax_scale))
    if memo_key is None or memo_key not in _VALID_MEMO:
        _external_validate(q, k, v, cu_q, cu_k, max_q, max_k, broadcast_q, softmax_scale)
        if memo_key is not None:
            _VALID_MEMO[memo_key] = True
            if len(_VALID_MEMO) > 64:
                _VALID_MEMO.popitem(last=False)
    else:
        _VALID_MEMO.move_to_end(memo_key)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor")
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D [tokens, heads, head_dim], got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name}.dtype {t.dtype} not supported (supported: {SUPPORTED_DTYPES})")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k, v must be on one device")
    for name, t in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be an int32 or int64 tensor")
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D")
    if k.shape[0] != v.shape[0] or k.shape[1] != v.shape[1]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree in tokens and heads")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q head_dim {q.shape[2]} != k head_dim {k.shape[2]}")
    hq, hkv = q.shape[1], k.shape[1]
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"num heads of q ({hq}) must be a multiple of k/v heads ({hkv})")
    if q.shape[2] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim {q.shape[2]} not supported (supported: {SUPPORTED_HEAD_DIMS})")
    if v.shape[2] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"v head_dim {v.shape[2]} not supported (supported: {SUPPORTED_HEAD_DIMS})")
    if softmax_scale is not None:
        s = float(softmax_scale)
        if not math.isfinite(s):
            raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    if q.device.type == "cpu":
        if not tk.INTERPRET:
            raise NotImplementedError(
                "CPU tensors need TRITON_INTERPRET=1 set before triton is imported; "
                "otherwise use CUDA tensors")
    elif q.device.type != "cuda":
        raise NotImplementedError(f"device {q.device} not supported")
    cu_q_h = (cq if memo_key is not None else cu_q.detach().to("cpu")).to(torch.int64).numpy()
    cu_k_h = (ck if memo_key is not None else cu_k.detach().to("cpu")).to(torch.int64).numpy()
    _check_cu("cu_seqlens_q", cu_q_h, q.shape[0])
    _check_cu("cu_seqlens_k", cu_k_h, k.shape[0])
    B = cu_k_h.shape[0] - 1
    lens_k = np.diff(cu_k_h)
    if broadcast_q:
        if cu_q_h.shape[0] != 2:
            raise ValueError("broadcast_q=True needs cu_seqlens_q == [0, Lq]")
        lens_q = np.full(B, cu_q_h[1], dtype=np.int64)
    else:
        if cu_q_h.shape[0] != cu_k_h.shape[0]:
            raise ValueError(f"cu_seqlens_q (len {cu_q_h.shape[0]}) and cu_seqlens_k "
                             f"(len {cu_k_h.shape[0]}) must describe the same batch")
        lens_q = np.diff(cu_q_h)
    true_max_q = int(lens_q.max()) if lens_q.size else 0
    true_max_k = int(lens_k.max()) if lens_k.size else 0
    if max_q is not None and int(max_seqlen_q_or(max_q)) < true_max_q:
        raise ValueError(f"max_seqlen_q={max_q} is below the longest query sequence ({true_max_q})")
    if max_k is not None and int(max_seqlen_q_or(max_k)) < true_max_k:
        raise ValueError(f"max_seqlen_k={max_k} is below the longest key sequence ({true_max_k})")
    return cu_q_h, cu_k_h, lens_q, lens_k


def max_seqlen_q_or(x):
    if isinstance(x, torch.Tensor):
        x = int(x.item())
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise ValueError(f"max_seqlen must be an int, got {x!r}")
    if x < 0:
        raise ValueError(f"max_seqlen must be >= 0, got {x}")
    return x


# ---------------------------------------------------------------------------
# schedules (cached per offsets)
# ---------------------------------------------------------------------------
_SCHED_CACHE: "OrderedDict[tuple, dict]" = OrderedDict()
_SCHED_CACHE_SIZE = 32


def _grids():
    for name, value, allowed in (("FWD_GRID", FWD_GRID, GRIDS), ("BWD_KV_GRID", BWD_KV_GRID, GRIDS),
                                 ("GLUON_GRID", GLUON_GRID, GLUON_GRIDS)):
        if value not in allowed:
            raise ValueError(f"jfa.{name} must be one of {allowed}, got {value!r}")
    if not (isinstance(PERSISTENT_CTAS_PER_SM, int) and PERSISTENT_CTAS_PER_SM >= 1):
        raise ValueError(f"jfa.PERSISTENT_CTAS_PER_SM must be a positive int, got {PERSISTENT_CTAS_PER_SM!r}")
    if ITEM_ORDER not in ITEM_ORDERS:
        raise ValueError(f"jfa.ITEM_ORDER must be one of {ITEM_ORDERS}, got {ITEM_ORDER!r}")
    if not (isinstance(SECTION_BYTES, int) and SECTION_BYTES >= 1):
        raise ValueError(f"jfa.SECTION_BYTES must be a positive int, got {SECTION_BYTES!r}")
    # GLUON_GRID is checked here with the others but left out: it only picks the launch, not the schedule
    # this tuple keys
    return FWD_GRID, BWD_KV_GRID, PERSISTENT_CTAS_PER_SM, ITEM_ORDER, SECTION_BYTES


def _gluon_grid(n_items, device, grid):
    """(programs, dynamic) for a Gluon kernel's n_items under ``grid`` (a GLUON_GRID value): "sorted" runs
    one program per item; "persistent" and "dynamic" one per SM (one such CTA fills it), and "dynamic"
    deals by counter only when some program gets more than one item."""
    n_programs = n_items if grid == "sorted" else min(n_items, _num_sms(device))
    return n_programs, grid == "dynamic" and n_programs < n_items


def _gluon_bwd_smem_bytes(head_d, head_dv, stages, fused_split, dq_buffers, block_m=32):
    """Shared memory the Gluon dK/dV kernel allocates (bf16/fp16; gluon_bwd.dkdv_kernel's buffers, without
    its barriers and alignment, which tests/test_gluon_compile.py bounds by 1 KB); fused_split "" when dQ
    is not fused."""
    size = 2 * (stages * block_m * (head_d + head_dv) + 4 * 64 * (head_d + head_dv)) + 2 * 32 * 4  # rings, K/V, pos
    size += stages * 2 * block_m * 4  # each stage's LSE and delta
    if fused_split:  # dS^T (one or both groups' rows, two buffers) and the fp32 dQ^T staging buffers
        size += 2 * (128 if fused_split == "dim" else 64) * 32 * 2 + 2 * dq_buffers * 64 * 32 * 4
    else:
        size += 2 * 2 * 4  # one-element stand-ins
    return size


def _gluon_bwd_stages():
    if not (isinstance(GLUON_BWD_STAGES, int) and 1 <= GLUON_BWD_STAGES <= 4):
        raise ValueError(f"jfa.GLUON_BWD_STAGES must be an int in 1..4, got {GLUON_BWD_STAGES!r}")
    if GLUON_BWD_ORDER not in GLUON_BWD_ORDERS:
        raise ValueError(f"jfa.GLUON_BWD_ORDER must be one of {GLUON_BWD_ORDERS}, got {GLUON_BWD_ORDER!r}")
    if GLUON_BWD_ORDER != "plain" and GLUON_BWD_STAGES < 2:
        # a group holds two Q/dO buffers at once (block t-1's until block t's MMAs are issued, or a pair):
        # one buffer would deadlock
        raise ValueError(f"jfa.GLUON_BWD_ORDER {GLUON_BWD_ORDER!r} needs jfa.GLUON_BWD_STAGES >= 2")
    if GLUON_BWD_BLOCK_M not in GLUON_BWD_BLOCK_MS:
        raise ValueError(f"jfa.GLUON_BWD_BLOCK_M must be one of {GLUON_BWD_BLOCK_MS}, got {GLUON_BWD_BLOCK_M!r}")
    return GLUON_BWD_STAGES


class BackwardSwitches(NamedTuple):
    """The module switches a backward acts on, read (and checked) when its forward is prepared, so that a
    backward runs what its forward planned even if the switches change in between (a benchmark that sets
    them around the forward call only, a plan made under other switches)."""
    gluon_grid: str  # GLUON_GRID for the Gluon dK/dV and dQ kernels
    gluon_bwd_stages: int  # GLUON_BWD_STAGES
    gluon_bwd_order: int  # GLUON_BWD_ORDER's index in GLUON_BWD_ORDERS (gluon_bwd.py's ORDER)
    gluon_bwd_block_m: int  # GLUON_BWD_BLOCK_M
    gluon_bwd_split_keys: int  # GLUON_BWD_SPLIT_KEYS where BWD_KV_KERNEL is "split", else 0
    fused_dq_split: str  # the GLUON_FUSED_DQ_SPLIT that runs at this head dim ("keys" where "dim" cannot)
    fused_dq_buffers: int  # GLUON_FUSED_DQ_BUFFERS
    dq_reduce_tma: bool  # the fused atomic dQ adds blocks by TMA (BWD_DQ_REDUCE "tma" where TMA exists)
    gluon_dq_stages: int  # GLUON_DQ_STAGES
    tma_store: bool = False  # "backward" in GLUON_TMA_STORE_KERNELS (the forward reads it when it launches)
    reg_operand: bool = False  # GLUON_BWD_REG_OPERAND
    dq_delta: bool = False  # GLUON_DQ_DELTA


class LaunchConfig(NamedTuple):
    """What one call launches (hashable: part of the schedule cache key)."""
    fwd: tuple  # tl forward (BLOCK_M, BLOCK_N, warps, stages)
    bwd_kv: tuple  # dK/dV kernel (or the fused dK/dV/dQ kernel when fuse_dq)
    bwd_q: tuple  # dQ kernel
    fuse_dq: bool  # BWD_DQ_MODE "atomic" applies to this call
    fwd_kernel: str  # "triton", "gluon" or "split" after the Gluon checks
    why_not_gluon: str  # why the Gluon forward was asked for and cannot run ("" otherwise)
    gluon: Optional[tuple]  # (Gluon config, fewest keys a sequence needs to go to it), or None
    bwd_kv_kernel: str = "triton"  # "gluon" / "split" where BWD_KV_KERNEL asks for it and q/k/v allow it
    why_not_gluon_bwd: str = ""  # why it was asked for and cannot run
    bwd_q_kernel: str = "triton"  # "gluon" where BWD_Q_KERNEL asks for it (or "auto") and the call allows it
    why_not_gluon_dq: str = ""  # why it was asked for explicitly and cannot run
    gluon_dq_silent: bool = False  # "auto": a refusal found at the backward (dO) is not reported either
    bwd: Optional[BackwardSwitches] = None  # the switches the backward acts on
    ds_dq: bool = False  # BWD_DQ_MODE "ds" runs: dK/dV stores dS, dQ reads it back
    why_not_ds: str = ""  # why BWD_DQ_MODE "ds" was asked for and cannot run
    gluon_bwd_silent: bool = False  # BWD_KV_KERNEL "auto": as gluon_dq_silent, for the Gluon dK/dV kernel


def _build_schedule(cu_q_h, cu_k_h, lens_q, lens_k, broadcast, causal, cfgs, hq, hkv, device, row_bytes):
    """Tile lists and launch orders for one call (cached per offsets and switches).  ``row_bytes``:
    bytes one streamed row pair occupies per head (K+V, or Q+dO), which sizes the "section" order."""
    grids = _grids()
    key = (cu_q_h.tobytes(), cu_k_h.tobytes(), broadcast, causal, cfgs, hq, hkv, grids, str(device), row_bytes)
    hit = _SCHED_CACHE.get(key)
    if hit is not None:
        _SCHED_CACHE.move_to_end(key)
        return hit
    bm_f = cfgs.fwd[0]
    bn_kv = cfgs.bwd_kv[1]
    bm_q = cfgs.bwd_q[0]

    def dev(a):
        return torch.as_tensor(np.ascontiguousarray(a, dtype=np.int32)).to(device, non_blocking=True)

    fwd_grid, kv_grid, ctas_per_sm, item_order, section_bytes = grids
    n_slots = ctas_per_sm * _num_sms(device)

    def launch_order(seq, work, n_heads, rows_streamed):
        # the sorted grids' item order; None = program p runs item p
        if item_order == "sequence":
            return dev(sched.sequence_major_items(seq, work, n_heads))
        if item_order == "section":
            return dev(sched.sectioned_items(seq, work, n_heads, rows_streamed, max(1, section_bytes // row_bytes)))
        return None

    s = {}
    # forward rows: the sequences the Gluon forward takes, and the rest
    gluon = cfgs.gluon
    on_gluon = np.zeros(lens_k.shape[0], dtype=bool) if gluon is None else lens_k >= gluon[1]
    s["fwd_gluon"] = None
    if on_gluon.any():
        seq, blk, work = sched.forward_tiles(np.where(on_gluon, lens_q, 0), lens_k, gluon[0][0], causal)
        seq, blk, work = sched.sort_by_work(seq, blk, work=work)
        s["fwd_gluon"] = (dev(seq), dev(blk), int(seq.shape[0]), launch_order(seq, work, hq, lens_k))
    seq, blk, work = sched.forward_tiles(np.where(on_gluon, 0, lens_q), lens_k, bm_f, causal)
    seq, blk, work = sched.sort_by_work(seq, blk, work=work)
    s["fwd"] = (dev(seq), dev(blk), int(seq.shape[0]))
    s["fwd_items"] = launch_order(seq, work, hq, lens_k)
    s["fwd_persistent"] = None
    if fwd_grid == "persistent" and seq.shape[0] * hq > 0:
        # item i = (tile i // hq, head i % hq); every head of a tile costs the same
        n_programs = min(seq.shape[0] * hq, n_slots)
        ptr, items, _ = sched.persistent_zigzag(np.repeat(work, hq), n_programs)
        s["fwd_persistent"] = (dev(ptr), dev(items), n_programs)
    seq, blk, work = sched.kv_tiles(lens_q, lens_k, bn_kv, causal)
    seq, blk, work = sched.sort_by_work(seq, blk, work=work)
    s["kv"] = (dev(seq), dev(blk), int(seq.shape[0]))
    s["kv_items"] = launch_order(seq, work, hkv, lens_q)
    s["kv_persistent"] = None
    if kv_grid == "persistent" and seq.shape[0] * hkv > 0:
        # item = tile * hkv + kv head; ordered by (sequence, kv head, block), block innermost
        tile = np.repeat(np.arange(seq.shape[0]), hkv)
        head = np.tile(np.arange(hkv), seq.shape[0])
        n_programs = min(tile.shape[0], n_slots)
        order, _, _ = sched.block_innermost_round_robin(seq[tile] * hkv + head, blk[tile], work[tile], n_programs)
        s["kv_persistent"] = (dev((tile * hkv + head)[order]), int(tile.shape[0]), n_programs)
    s["kv_needs_zero"] = bool(np.any((lens_q == 0) & (lens_k > 0)))
    # "split": the long sequences' key blocks go to the Gluon kernel (below), the rest to the tl kernel
    # ("kv" keeps every tile for a backward whose dO the Gluon kernel refuses)
    on_gluon_bwd = (lens_k >= cfgs.bwd.gluon_bwd_split_keys if cfgs.bwd_kv_kernel == "split"
                    else np.full(lens_k.shape[0], cfgs.bwd_kv_kernel == "gluon"))
    s["kv_short"] = None  # (on the sorted grid, whatever BWD_KV_GRID says)
    if cfgs.bwd_kv_kernel == "split":
        seq, blk, work = sched.kv_tiles(np.where(on_gluon_bwd, 0, lens_q), lens_k, bn_kv, causal)
        seq, blk, work = sched.sort_by_work(seq, blk, work=work)
        s["kv_short"] = (dev(seq), dev(blk), int(seq.shape[0]), launch_order(seq, work, hkv, lens_q))
    s["kv_gluon"] = s["columns"] = None
    if cfgs.bwd_kv_kernel == "gluon" or (on_gluon_bwd & (lens_q > 0)).any():  # ("split": a launch with work)
        from .gluon_bwd import BLOCK_N as GLUON_BWD_BLOCK_N
        seq, blk, work = sched.kv_tiles(np.where(on_gluon_bwd, lens_q, 0), lens_k, GLUON_BWD_BLOCK_N.value, causal)
        seq, blk, work = sched.sort_by_work(seq, blk, work=work)
        s["kv_gluon"] = (dev(seq), dev(blk), int(seq.shape[0]), launch_order(seq, work, hkv, lens_q))
        # where its statistics (and a fused dQ^T) lie: output rows, each sequence 16-byte aligned
        s["columns"] = _aligned_columns(np.full(lens_k.shape[0], int(cu_q_h[1])) if broadcast else lens_q, dev)
    s["q_gluon"] = None
    if cfgs.bwd_q_kernel == "gluon":  # the forward's 128-row tiles
        seq, blk, work = sched.forward_tiles(lens_q, lens_k, 128, causal)
        seq, blk, work = sched.sort_by_work(seq, blk, work=work)
        s["q_gluon"] = (dev(seq), dev(blk), int(seq.shape[0]), launch_order(seq, work, hq, lens_k))
    s["ds_off"], s["ds_total"] = None, 0
    if cfgs.ds_dq:  # where each sequence's dS^T [lk, lq] starts in a head's part of the workspace
        sizes = lens_q.astype(np.int64) * lens_k.astype(np.int64)
        s["ds_off"] = torch.as_tensor(np.cumsum(sizes) - sizes).to(device, non_blocking=True)
        s["ds_total"] = int(sizes.sum())
    if not broadcast:
        seq, blk, work = sched.forward_tiles(lens_q, lens_k, bm_q, causal)
        seq, blk, work = sched.sort_by_work(seq, blk, work=work)
        s["q"] = (dev(seq), dev(seq + 1), dev(blk), dev(np.zeros_like(seq)), int(seq.shape[0]), 1)
        s["q_items"] = launch_order(seq, work, hq, lens_k)
    else:
        B = lens_k.shape[0]
        lq = int(cu_q_h[1])
        n_mblk = (lq + bm_q - 1) // bm_q
        target = 4 * _num_sms(device)
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


def _dot_prec(dtype):
    return "ieee" if dtype == torch.float32 else "tf32"


# ---------------------------------------------------------------------------
# forward / backward drivers
# ---------------------------------------------------------------------------
def _tma_refusal(t, block_rows):
    """Why TMA cannot load tiles of t [rows, heads, dim] as [block_rows, dim]
    blocks of its 2-D [rows, heads * dim] view ("" if it can)."""
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


def _fwd_descs(k, v, block_n):
    """(k_desc, v_desc, "") for the TMA forward, or (None, None, reason)."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None, None, "triton without host tensor descriptors"
    if k.device.type == "cuda":
        if torch.cuda.get_device_capability(k.device) < (9, 0):
            return None, None, "TMA needs sm_90 or newer"
    elif not tk.INTERPRET:
        return None, None, f"no TMA on {k.device.type}"
    for name, t in (("k", k), ("v", v)):
        why = _tma_refusal(t, block_n)
        if why:
            return None, None, f"{name}: {why}"
    d, dv = k.shape[2], v.shape[2]
    kd = TensorDescriptor.from_tensor(k.view(k.shape[0], -1), [block_n, d])
    vd = TensorDescriptor.from_tensor(v.view(v.shape[0], -1), [block_n, dv])
    return kd, vd, ""


def _gluon_refusal(q, k, v, scale=1.0, block_rows=None) -> str:
    """Why the Gluon kernels cannot run these tensors ("" if they can); ``block_rows``: the (q, k/v)
    TMA box rows, by default the forward's."""
    if not scale > 0:  # the spec's validator rejects these; this module also runs without it
        return "the Gluon forward folds a positive softmax scale into its row maximum"
    if _INTERPRET:
        return "the Triton interpreter does not run Gluon"
    if q.device.type != "cuda":
        return f"no Gluon forward on {q.device.type}"
    if torch.cuda.get_device_capability(q.device) != (9, 0):
        return "the Gluon forward uses wgmma, which only sm_90 has"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"the Gluon forward is bf16/fp16 only, got {q.dtype}"
    if q.shape[2] not in GLUON_HEAD_DIMS or v.shape[2] not in GLUON_HEAD_DIMS:
        return f"the Gluon forward covers head dims {GLUON_HEAD_DIMS}, got {q.shape[2]}/{v.shape[2]}"
    try:
        from . import gluon_fwd  # noqa: F401
    except Exception as exc:  # an older Triton without Gluon's Hopper API
        return f"this Triton has no Gluon Hopper API ({type(exc).__name__}: {exc})"
    q_rows, kv_rows = block_rows or (64, _gluon_cfg()[1])
    for name, t, rows in (("q", q, q_rows), ("k", k, kv_rows), ("v", v, kv_rows)):
        why = _tma_refusal(t, rows)
        if why:
            return f"{name}: {why}"
    return ""


GLUON_SMEM_BYTES = 232448  # sm_90's shared memory per block


def _gluon_cfg():
    cfg = CONFIG_OVERRIDE.get("gluon_fwd", GLUON_FWD_CFG)
    if len(cfg) != 5 or cfg[4] not in GLUON_SCHEDULES:
        raise ValueError(f"the Gluon forward config is (BLOCK_M, BLOCK_N, warps, stages, schedule) with "
                         f"schedule one of {GLUON_SCHEDULES}, got {cfg!r}")
    # two Q buffers of 128 rows and the K/V ring, bf16/fp16, at the largest head dim it serves
    d = max(GLUON_HEAD_DIMS)
    smem = 2 * (2 * 128 * d + cfg[3] * cfg[1] * 2 * d)
    if smem > GLUON_SMEM_BYTES - 1024:
        raise ValueError(f"the Gluon forward config {cfg!r} needs {smem} bytes of shared memory; "
                         f"sm_90 has {GLUON_SMEM_BYTES}")
    return cfg


def _pick_fwd_kernel(q, k, v, scale=1.0):
    """(kernel, "") with kernel "gluon" or "split" where FWD_KERNEL asks for Gluon and it can run;
    ("triton", why not) where it was asked for and cannot run; ("triton", "") otherwise."""
    if FWD_KERNEL not in FWD_KERNELS:
        raise ValueError(f"jfa.FWD_KERNEL must be one of {FWD_KERNELS}, got {FWD_KERNEL!r}")
    if FWD_KERNEL == "triton":
        return "triton", ""
    _gluon_cfg()
    if not (isinstance(GLUON_SPLIT_KEYS, int) and GLUON_SPLIT_KEYS >= 0):
        raise ValueError(f"jfa.GLUON_SPLIT_KEYS must be an int >= 0, got {GLUON_SPLIT_KEYS!r}")
    why = _gluon_refusal(q, k, v, scale)
    if FWD_KERNEL == "auto":
        return ("triton", "") if why else ("split", "")
    return ("triton", why) if why else (FWD_KERNEL, "")


def _forward_gluon(q, k, v, cu_q, cu_k, s, cfgs, causal, scale, broadcast, out, lse):
    from . import gluon_fwd as gf
    seq_t, blk_t, n_tiles, items = s["fwd_gluon"]
    hq, d = q.shape[1], q.shape[2]
    hkv, dv = k.shape[1], v.shape[2]
    bm, bn, w, st, schedule = cfgs.gluon[0]
    assert bm == gf.BLOCK_M and w == 4, "the Gluon forward is written for 128-row tiles and 4-warp groups"
    qd = gf.descriptor(q.view(q.shape[0], -1), [gf.HALF_M, d])
    kd = gf.descriptor(k.view(k.shape[0], -1), [bn, d])
    vd = gf.descriptor(v.view(v.shape[0], -1), [bn, dv])
    n_items = n_tiles * hq
    _grids()  # a bad GLUON_GRID is a clear error
    n_programs, dynamic = _gluon_grid(n_items, q.device, GLUON_GRID)
    # the dynamic deal's counter of items claimed beyond the first n_programs
    counter = torch.zeros(1, device=q.device, dtype=torch.int32) if dynamic else seq_t
    tma_store = "forward" in GLUON_TMA_STORE_KERNELS and d == dv
    # (without TMA stores the kernel never touches o_desc: Q's descriptor stands in, no host work per call)
    od = _store_descriptors((out,), gf.HALF_M)[0] if tma_store else qd
    gf.fwd_kernel[(n_programs,)](
        qd, kd, vd, out, lse, cu_q, cu_k, seq_t, blk_t, seq_t if items is None else items, counter,
        out.stride(0), out.stride(1), lse.stride(0), scale * tk.LOG2E, hq, hq // hkv, n_items, od,
        BROADCAST=broadcast, CAUSAL=causal, BLOCK_N=bn, HEAD_D=d, HEAD_DV=dv,
        STAGES=st, SCHEDULE=schedule, GROUPED=items is not None, DYNAMIC=dynamic,
        TMA_STORE=tma_store, num_warps=w)
    return out, lse


def _forward(q, k, v, cu_q, cu_k, s, cfgs, causal, scale, broadcast, n_out_rows):
    hq, d = q.shape[1], q.shape[2]
    hkv, dv = k.shape[1], v.shape[2]
    out = torch.empty((n_out_rows, hq, dv), device=q.device, dtype=q.dtype)
    lse = torch.empty((hq, n_out_rows), device=q.device, dtype=torch.float32)
    seq_t, blk_t, n_tiles = s["fwd"]
    if hq == 0 or (n_tiles == 0 and s["fwd_gluon"] is None):
        return out, lse
    global LAST_FWD_PATH
    if s["fwd_gluon"] is not None:  # heavy sequences first; the tl launch below takes the rest
        _forward_gluon(q, k, v, cu_q, cu_k, s, cfgs, causal, scale, broadcast, out, lse)
        LAST_FWD_PATH = "gluon"
        if n_tiles == 0:
            return out, lse
    bm, bn, w, st = cfgs.fwd
    k_arg, v_arg, use_tma, why = k, v, False, ""
    if FWD_TMA:
        kd, vd, why = _fwd_descs(k, v, bn)
        if kd is not None:
            k_arg, v_arg, use_tma = kd, vd, True
    ptr_adv = FWD_PTR_ADVANCE and not use_tma
    path = "tma" if use_tma else ("ptr-adv" if ptr_adv else "ptr") + (f" ({why})" if why else "")
    if cfgs.why_not_gluon:
        path += f" (gluon: {cfgs.why_not_gluon})"
    LAST_FWD_PATH = "gluon+" + path if s["fwd_gluon"] is not None else path
    persistent = s["fwd_persistent"]
    grouped = persistent is None and s["fwd_items"] is not None
    if persistent is not None:
        prog_ptr, items, n_programs = persistent
        grid = (n_programs,)
    else:
        prog_ptr, grid = seq_t, (n_tiles * hq,)  # unused pointer
        items = s["fwd_items"] if grouped else seq_t
    tk._fwd_kernel[grid](
        q, k_arg, v_arg, out, lse, cu_q, cu_k, seq_t, blk_t, prog_ptr, items,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), lse.stride(0),
        scale * tk.LOG2E,
        H=hq, GROUP=hq // hkv, BROADCAST=broadcast, CAUSAL=causal,
        BLOCK_M=bm, BLOCK_N=bn, HEAD_D=d, HEAD_DV=dv, DOT_PREC=_dot_prec(q.dtype),
        USE_TMA=use_tma, PTR_ADV=ptr_adv, WARP_SPEC=FWD_WARP_SPECIALIZE and not _INTERPRET,
        PERSISTENT=persistent is not None, GROUPED=grouped, num_warps=w, num_stages=st)
    return out, lse


def _backward(do, q, k, v, out, lse, cu_q, cu_k, s, cfgs, causal, scale, broadcast):
    hq, d = q.shape[1], q.shape[2]
    hkv, dvd = k.shape[1], v.shape[2]
    n_out = out.shape[0]
    if do.stride(-1) != 1:
        do = do.contiguous()
    prec = _dot_prec(q.dtype)
    # dK, dV (and dQ when fused)
    fuse = cfgs.fuse_dq
    sw = cfgs.bwd
    seq_t, blk_t, n_kv = s["kv"]
    alloc = torch.zeros if s["kv_needs_zero"] else torch.empty
    dk = alloc(k.shape, device=k.device, dtype=k.dtype)
    dv = alloc(v.shape, device=v.device, dtype=v.dtype)
    # which dK/dV kernels run (dO is known only now)
    global LAST_BWD_KV_PATH
    why = cfgs.why_not_gluon_bwd
    if cfgs.bwd_kv_kernel != "triton":
        why = _tma_refusal(do, sw.gluon_bwd_block_m)
        why = f"dO: {why}" if why else ""
    run_gluon = cfgs.bwd_kv_kernel != "triton" and not why and s["kv_gluon"] is not None
    # "split": the tl kernel takes the short sequences' tiles, or all of them where Gluon cannot run
    tl_tiles = (s["kv_short"] + (None,) if run_gluon and cfgs.bwd_kv_kernel == "split"
                else None if run_gluon else (seq_t, blk_t, n_kv, s["kv_items"], s["kv_persistent"]))
    LAST_BWD_KV_PATH = ("gluon+triton" if run_gluon and tl_tiles is not None and tl_tiles[2] > 0
                        else "gluon" if run_gluon else f"triton (gluon: {why})" if why and not cfgs.gluon_bwd_silent
                        else "triton")
    delta = torch.empty_like(lse)  # (the tl kernels read LSE and delta with one row stride)
    # the Gluon dK/dV kernel's statistics, [2 * Hq, columns] fp32: LSE * log2(e), then delta
    columns = s["columns"] if run_gluon else None
    stats = (torch.empty((2 * hq, columns.n_cols), device=q.device, dtype=torch.float32) if run_gluon
             else delta)
    dq_tma = False
    dq_acc_t = None
    if fuse and run_gluon:  # (only BWD_KV_KERNEL "gluon" fuses dQ in)
        dq_acc_t = _fused_dq_buffer(q, columns)
        dq_acc = dq_arg = dk  # unused pointer
    elif fuse:
        dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        dq_tma = sw.dq_reduce_tma
        dq_arg = (_descriptor(dq_acc.view(dq_acc.shape[0], -1), [cfgs.bwd_kv[0], d]) if dq_tma and n_kv > 0
                  else dq_acc)
    else:
        dq_acc = dq_arg = dk  # unused pointer
    global LAST_BWD_DQ_PATH
    why_not_gluon_dq = cfgs.why_not_gluon_dq
    gluon_dq = cfgs.bwd_q_kernel == "gluon"
    if gluon_dq:  # dO is known only now
        why_do = _tma_refusal(do, GLUON_DQ_BOX_ROWS[0])
        gluon_dq = not why_do
        if why_do and not cfgs.gluon_dq_silent:
            why_not_gluon_dq = f"dO: {why_do}"
    if fuse:
        LAST_BWD_DQ_PATH = (f"atomic-gluon-{sw.fused_dq_split}" if dq_acc_t is not None
                            else "atomic-tma" if dq_tma else "atomic-element")
    elif cfgs.ds_dq:
        LAST_BWD_DQ_PATH = "ds"
    elif why_not_gluon_dq:
        LAST_BWD_DQ_PATH = f"separate (gluon: {why_not_gluon_dq})"
    else:
        LAST_BWD_DQ_PATH = "gluon" if gluon_dq else "separate"
    if cfgs.why_not_ds:
        LAST_BWD_DQ_PATH += f" (ds: {cfgs.why_not_ds})"
    # delta (and the statistics) from the Gluon dQ kernel, run first, or from the preprocess pass
    global LAST_BWD_DELTA_PATH
    dq_first = LAST_BWD_DQ_PATH == "gluon" and sw.dq_delta
    LAST_BWD_DELTA_PATH = "dq kernel" if dq_first else "preprocess"
    if dq_first:
        dq_gluon = _backward_q_gluon(q, k, v, do, lse, delta, cu_q, cu_k, s, sw, causal, scale,
                                     own_delta=(out, stats, columns))
    elif n_out > 0 and hq > 0:
        blk = 64 if dvd <= 128 else 32
        tk._bwd_preprocess[(triton_cdiv(n_out, blk), hq)](
            out, do, delta, lse, stats, cu_q if columns is None else columns.cols, n_out, out.stride(0),
            out.stride(1), do.stride(0), do.stride(1), delta.stride(0), stats.stride(0),
            BLOCK=blk, HEAD_DV=dvd, WRITE_STATS=run_gluon, num_warps=4)
    # BWD_DQ_MODE "ds": the workspace the dK/dV kernel writes dS^T into (rows: query heads)
    ds_ws = (torch.empty((hq, max(1, s["ds_total"])), device=q.device, dtype=q.dtype) if cfgs.ds_dq
             else None)
    if run_gluon:
        _backward_kv_gluon(q, k, v, do, stats, columns.cu, dk, dv, cu_q, cu_k, s, sw, causal, scale, broadcast,
                           dq_acc_t)
    if tl_tiles is not None and tl_tiles[2] > 0 and hkv > 0:
        seq_t, blk_t, n_kv, kv_items, persistent = tl_tiles
        bm, bn, w, st = cfgs.bwd_kv
        grouped = persistent is None and kv_items is not None
        if persistent is not None:
            items, n_items, n_programs = persistent
            grid = (n_programs,)
        else:
            n_items, n_programs, grid = 0, 1, (n_kv * hkv,)  # unused
            items = kv_items if grouped else seq_t
        tk._bwd_kv_kernel[grid](
            q, k, v, do, lse, delta, dk, dv, dq_arg, dk if ds_ws is None else ds_ws,
            seq_t if ds_ws is None else s["ds_off"], cu_q, cu_k, seq_t, blk_t, items, n_items, n_programs,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            do.stride(0), do.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
            dq_acc.stride(0), dq_acc.stride(1),
            lse.stride(0), 0 if ds_ws is None else ds_ws.stride(0), scale, scale * tk.LOG2E,
            HKV=hkv, GROUP=hq // hkv, BROADCAST=broadcast, CAUSAL=causal, FUSE_DQ=fuse,
            BLOCK_M=bm, BLOCK_N=bn, HEAD_D=d, HEAD_DV=dvd, DOT_PREC=prec,
            PERSISTENT=persistent is not None, GROUPED=grouped, DQ_TMA=dq_tma, STORE_DS=ds_ws is not None,
            num_warps=w, num_stages=st)
    if dq_acc_t is not None:
        return _fused_dq_result(dq_acc_t, columns.cols, q, scale), dk, dv
    if fuse:
        return dq_acc.to(q.dtype), dk, dv
    # dQ
    if dq_first:
        return dq_gluon, dk, dv
    if LAST_BWD_DQ_PATH == "gluon":
        return _backward_q_gluon(q, k, v, do, lse, delta, cu_q, cu_k, s, sw, causal, scale), dk, dv
    blo_t, bhi_t, mblk_t, slot_t, n_q, n_slots = s["q"]
    if broadcast and n_slots > 1:
        dq_buf = torch.empty((n_slots,) + tuple(q.shape), device=q.device, dtype=torch.float32)
    else:
        dq_buf = torch.empty(q.shape, device=q.device, dtype=torch.float32 if broadcast else q.dtype)
        if broadcast:
            dq_buf = dq_buf.unsqueeze(0)
    if n_q > 0 and hq > 0 and ds_ws is not None:
        bm, bn, w, st = cfgs.bwd_q
        dq3 = dq_buf if dq_buf.dim() == 4 else dq_buf.unsqueeze(0)
        tk._bwd_q_from_ds_kernel[(n_q * hq,)](
            ds_ws, s["ds_off"], k, dq3, cu_q, cu_k, blo_t, bhi_t, mblk_t, slot_t,
            blo_t if s["q_items"] is None else s["q_items"],
            ds_ws.stride(0), k.stride(0), k.stride(1), dq3.stride(0), dq3.stride(1), dq3.stride(2),
            scale, H=hq, GROUP=hq // hkv, BROADCAST=broadcast, CAUSAL=causal,
            BLOCK_M=bm, BLOCK_N=bn, HEAD_D=d, DOT_PREC=prec,
            GROUPED=s["q_items"] is not None, num_warps=w, num_stages=st)
    elif n_q > 0 and hq > 0:
        bm, bn, w, st = cfgs.bwd_q
        dq3 = dq_buf if dq_buf.dim() == 4 else dq_buf.unsqueeze(0)
        tk._bwd_q_kernel[(n_q * hq,)](
            q, k, v, do, lse, delta, dq3, cu_q, cu_k, blo_t, bhi_t, mblk_t, slot_t,
            blo_t if s["q_items"] is None else s["q_items"],
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            do.stride(0), do.stride(1), dq3.stride(0), dq3.stride(1), dq3.stride(2),
            lse.stride(0), scale, scale * tk.LOG2E,
            H=hq, GROUP=hq // hkv, BROADCAST=broadcast, CAUSAL=causal,
            BLOCK_M=bm, BLOCK_N=bn, HEAD_D=d, HEAD_DV=dvd, DOT_PREC=prec,
            GROUPED=s["q_items"] is not None, num_warps=w, num_stages=st)
    elif dq_buf.numel() > 0:
        dq_buf.zero_()
    if broadcast:
        # fixed-order fp32 reduction over chunk partials: deterministic
        dq = dq_buf.sum(0) if dq_buf.shape[0] > 1 else dq_buf[0]
        dq = dq.to(q.dtype)
    else:
        dq = dq_buf
    return dq, dk, dv


def _backward_kv_gluon(q, k, v, do, stats, cu_cols, dk, dv, cu_q, cu_k, s, sw, causal, scale, broadcast,
                       dq_acc_t=None):
    """The Gluon dK/dV kernel.  ``stats`` [2 * Hq, columns] holds LSE * log2(e) and delta (written by the Gluon
    dQ kernel or by _bwd_preprocess), each sequence from column ``cu_cols`` (AlignedColumns.cu) on.  With
    ``dq_acc_t`` from _fused_dq_buffer (same columns) it also adds the unscaled dQ^T into that buffer (the
    fused atomic mode)."""
    from . import gluon_bwd as gb
    assert gb.HALF_N.value == GLUON_BWD_KV_ROWS
    block_m = sw.gluon_bwd_block_m
    seq_t, blk_t, n_tiles, items = s["kv_gluon"]
    hq, d = q.shape[1], q.shape[2]
    hkv, dvd = k.shape[1], v.shape[2]
    n_items = n_tiles * hkv
    if n_items == 0:
        return
    (qd, kd, vd, dod), n_programs, dynamic, counter = _gluon_backward_launch(
        q, k, v, do, (block_m, GLUON_BWD_KV_ROWS), n_items, seq_t, sw.gluon_grid)
    fuse_dq = dq_acc_t is not None
    # without fused dQ, a descriptor of the right type all the same (the kernel never uses it), made once per
    # device: an allocation, a fill and a descriptor less on every call
    dqd = _fused_dq_descriptor(dq_acc_t) if fuse_dq else _unused_dq_descriptor(q.device)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    statsd = TensorDescriptor.from_tensor(stats, [1, block_m], gb.STATS_LAYOUT)
    fuse_split = (2 if sw.fused_dq_split == "dim" else 1) if fuse_dq else 0
    tma_store = sw.tma_store and fuse_split != 2
    dk_desc, dv_desc = _store_descriptors((dk, dv), GLUON_BWD_KV_ROWS) if tma_store else (kd, vd)
    gb.dkdv_kernel[(n_programs,)](
        qd, kd, vd, dod, statsd, dk, dv, cu_q, cu_k, seq_t, blk_t, seq_t if items is None else items, counter,
        dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), scale, scale * tk.LOG2E,
        hkv, hq // hkv, n_items, dqd, cu_cols, dk_desc, dv_desc,
        BROADCAST=broadcast, CAUSAL=causal, HEAD_D=d, HEAD_DV=dvd, STAGES=sw.gluon_bwd_stages,
        GROUPED=items is not None, DYNAMIC=dynamic, ORDER=sw.gluon_bwd_order, FUSE_DQ=fuse_split,
        DQ_BUFS=sw.fused_dq_buffers if fuse_dq else 1, BLOCK_M=block_m, TMA_STORE=tma_store,
        REG_OPERAND=_dkdv_reg_operand(sw, fuse_dq), num_warps=4)


def _dkdv_reg_operand(sw, fuse_dq):
    """Whether the dK/dV kernel holds K in registers: asked for (GLUON_BWD_REG_OPERAND) and in the one form
    Triton 3.6 compiles well with it (plain order, 32-row blocks, dQ not fused; see GLUON_BWD_REG_OPERAND)."""
    return sw.reg_operand and sw.gluon_bwd_order == 0 and sw.gluon_bwd_block_m == 32 and not fuse_dq


def _fused_dq_split(head_dim):
    if GLUON_FUSED_DQ_SPLIT not in GLUON_FUSED_DQ_SPLITS:
        raise ValueError(f"jfa.GLUON_FUSED_DQ_SPLIT must be one of {GLUON_FUSED_DQ_SPLITS}, "
                         f"got {GLUON_FUSED_DQ_SPLIT!r}")
    return "dim" if GLUON_FUSED_DQ_SPLIT == "dim" and head_dim == 128 else "keys"


class AlignedColumns(NamedTuple):
    """Where each output row lies in the Gluon dK/dV kernel's fp32 side buffers (laid out [..., columns]).

    The kernel moves 32 rows at a time between such a buffer and shared memory by TMA: the backward
    statistics in, the fused dQ^T out.  A TMA copy whose innermost coordinate is not 16 bytes aligned stops
    the kernel with an illegal instruction (measured on the H200, for a reduce-add and for a load), so
    every sequence starts at a column that is a multiple of 4."""
    cu: torch.Tensor  # int32 [B + 1]: first column of each sequence
    cols: torch.Tensor  # int32 [rows]: column of each output row
    n_cols: int  # a multiple of 4 (the buffers' row stride): rows + 3 B rounded up, at least 4


def _aligned_columns(lens_out, to_device=torch.as_tensor):
    """AlignedColumns of the output rows, sequence b owning lens_out[b] consecutive rows (its queries, or
    under broadcast-Q its Lq output rows); made on the host once per jagged layout (the tile schedule
    keeps it), ``to_device`` moves an int32 array to the GPU."""
    lens = np.asarray(lens_out, dtype=np.int64)
    cu = np.zeros(lens.shape[0] + 1, dtype=np.int64)
    np.cumsum((lens + 3) // 4 * 4, out=cu[1:])
    starts = np.cumsum(lens) - lens
    cols = np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(cu[:-1] - starts, lens)
    # (the column count is the bound the GPU runs of v17 used, a little past the last sequence's end)
    n_cols = max(4, -(-(int(lens.sum()) + 3 * lens.shape[0]) // 4) * 4)
    return AlignedColumns(to_device(cu.astype(np.int32)), to_device(cols.astype(np.int32)), n_cols)


def _fused_dq_buffer(q, columns):
    """The fused Gluon dQ's accumulator: [Hq * D, columns] fp32, so that a [64 head-dim rows, 32 query rows]
    tile of a partial is one TMA box as it is; query row t in column columns.cols[t]."""
    return torch.zeros((q.shape[1] * q.shape[2], columns.n_cols), device=q.device, dtype=torch.float32)


def _fused_dq_descriptor(dq_acc_t):
    """TMA descriptor of the kernel's reduce-adds (boxes of 64 head-dim rows x 32 columns)."""
    from . import gluon_bwd as gb
    from .gluon_fwd import descriptor
    return descriptor(dq_acc_t, [gb.DQ_ROWS.value, gb.DQ_COLS.value])


_UNUSED_DQ_DESCRIPTORS = {}


def _unused_dq_descriptor(device):
    """A fused-dQ descriptor over a small buffer of its own, for launches that do not fuse dQ."""
    if device not in _UNUSED_DQ_DESCRIPTORS:
        from . import gluon_bwd as gb
        buf = torch.zeros((gb.DQ_ROWS.value, gb.DQ_COLS.value), device=device, dtype=torch.float32)
        _UNUSED_DQ_DESCRIPTORS[device] = _fused_dq_descriptor(buf)  # (the descriptor holds the buffer)
    return _UNUSED_DQ_DESCRIPTORS[device]


def _fused_dq_result(dq_acc_t, cols, q, scale):
    """dQ [rows, Hq, D] in q's dtype from the accumulator: gathered, transposed back and scaled in one pass."""
    n_rows, hq, d = q.shape
    dq = torch.empty_like(q)
    if n_rows and hq:
        tk._fused_dq_readback[(triton_cdiv(n_rows, 64), hq)](
            dq_acc_t, dq, cols, n_rows, dq_acc_t.stride(0), dq.stride(0), dq.stride(1), scale,
            BLOCK=64, HEAD_D=d, num_warps=4)
    return dq


def _gluon_backward_launch(q, k, v, do, box_rows, n_items, unused_ptr, grid):
    """What both Gluon backward kernels launch with: TMA descriptors of q, k, v, dO (q / dO boxes of
    box_rows[0] rows, k / v boxes of box_rows[1]), the grid, and the dynamic grid's item counter."""
    from .gluon_fwd import descriptor
    rows_q, rows_kv = box_rows
    descs = tuple(descriptor(t.view(t.shape[0], -1), [rows, t.shape[2]])
                  for t, rows in ((q, rows_q), (k, rows_kv), (v, rows_kv), (do, rows_q)))
    n_programs, dynamic = _gluon_grid(n_items, q.device, grid)
    counter = torch.zeros(1, device=q.device, dtype=torch.int32) if dynamic else unused_ptr
    return descs, n_programs, dynamic, counter


def _store_descriptors(outputs, rows):
    """TMA descriptors of freshly allocated (contiguous) outputs [rows, heads, dim], boxes of ``rows`` x
    dim, laid out as the kernels' Q / K / V buffers that the stores go out from."""
    from .gluon_fwd import descriptor
    return tuple(descriptor(t.view(t.shape[0], -1), [rows, t.shape[2]]) for t in outputs)


def _backward_q_gluon(q, k, v, do, lse, delta, cu_q, cu_k, s, sw, causal, scale, own_delta=None):
    """The Gluon dQ kernel.  With ``own_delta`` = (out, stats, columns) it also computes delta from dO and out
    and writes it into ``delta`` and, where ``columns`` is not None, into the dK/dV kernel's ``stats``, as
    the preprocess pass does; otherwise it reads ``delta``."""
    from . import gluon_dq as gd
    assert (gd.HALF_M.value, gd.BLOCK_N.value) == GLUON_DQ_BOX_ROWS
    seq_t, blk_t, n_tiles, items = s["q_gluon"]
    hq, d = q.shape[1], q.shape[2]
    hkv, dvd = k.shape[1], v.shape[2]
    dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)  # every row with queries is in exactly one tile
    n_items = n_tiles * hq
    if n_items == 0:
        return dq
    (qd, kd, vd, dod), n_programs, dynamic, counter = _gluon_backward_launch(q, k, v, do, GLUON_DQ_BOX_ROWS,
                                                                             n_items, seq_t, sw.gluon_grid)
    dqd = _store_descriptors((dq,), GLUON_DQ_BOX_ROWS[0])[0] if sw.tma_store else qd
    out, stats, columns = own_delta if own_delta is not None else (dq, delta, None)  # (else unused pointers)
    gd.dq_kernel[(n_programs,)](
        qd, kd, vd, dod, dq, lse, delta, cu_q, cu_k, seq_t, blk_t, seq_t if items is None else items, counter,
        dq.stride(0), dq.stride(1), lse.stride(0), scale, scale * tk.LOG2E, hq, hq // hkv, n_items, dqd,
        out, stats, cu_q if columns is None else columns.cols, out.stride(0), out.stride(1), stats.stride(0),
        CAUSAL=causal, HEAD_D=d, HEAD_DV=dvd, STAGES=sw.gluon_dq_stages, GROUPED=items is not None,
        DYNAMIC=dynamic, TMA_STORE=sw.tma_store, REG_OPERAND=sw.reg_operand, OWN_DELTA=own_delta is not None,
        WRITE_STATS=columns is not None, num_warps=4)
    return dq


def _dq_reduce_by_tma(q):
    if BWD_DQ_REDUCE not in BWD_DQ_REDUCES:
        raise ValueError(f"jfa.BWD_DQ_REDUCE must be one of {BWD_DQ_REDUCES}, got {BWD_DQ_REDUCE!r}")
    return (BWD_DQ_REDUCE == "tma" and not _INTERPRET and q.device.type == "cuda"
            and torch.cuda.get_device_capability(q.device) >= (9, 0))


def _descriptor(t2d, block):
    from triton.tools.tensor_descriptor import TensorDescriptor
    return TensorDescriptor.from_tensor(t2d, block)


def triton_cdiv(a, b):
    return (a + b - 1) // b


class _JaggedFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, s, cfgs, causal, scale, broadcast, n_out_rows):
        out, lse = _forward(q, k, v, cu_q, cu_k, s, cfgs, causal, scale, broadcast, n_out_rows)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.s, ctx.cfgs, ctx.causal, ctx.scale, ctx.broadcast = s, cfgs, causal, scale, broadcast
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = _backward(do, q, k, v, out, lse, cu_q, cu_k, ctx.s, ctx.cfgs,
                               ctx.causal, ctx.scale, ctx.broadcast)
        return dq, dk, dv, None, None, None, None, None, None, None, None


def _compiled_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                   broadcast_q, deterministic):
    """A call inside torch.compile: the host side (validation, offsets read on the host, the cached schedule,
    the switches) is Python dynamo should not trace, so the graph gets one opaque custom operator that runs
    it when the graph runs (kernels/torch_ops.py)."""
    def as_int(x):
        return None if x is None else max_seqlen_q_or(x)
    scale = None if softmax_scale is None else float(softmax_scale)
    return torch.ops.jfa_conformance.jagged_attention_forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, as_int(max_seqlen_q), as_int(max_seqlen_k), bool(causal), scale,
        bool(broadcast_q), bool(deterministic))


def jagged_flash_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                           causal=False, softmax_scale=None, broadcast_q=False,
                           deterministic=False):
    """Jagged (packed varlen) flash attention.  Returns ``(out, lse)``.

    out: [total_q, Hq, Dv] (broadcast-Q: [B*Lq, Hq, Dv], batch-major);
    lse: float32 [Hq, total_q] (broadcast-Q: [Hq, B*Lq]), natural log,
    -inf for rows with no visible key.  With the default switches every gradient
    is computed without atomics and is bitwise reproducible whether or not
    ``deterministic`` is set; ``deterministic=True`` also keeps the opt-in
    atomic dQ mode (jfa.BWD_DQ_MODE) off.  The module switches are read when
    the call is made: its backward acts on those, whatever they are by then.
    Inside torch.compile the call is one custom operator (kernels/torch_ops.py,
    which says how that differs).
    """
    if torch.compiler.is_compiling():
        return _compiled_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                              softmax_scale, broadcast_q, deterministic)
    return _JaggedFlashAttention.apply(*_prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                 causal, softmax_scale, broadcast_q, deterministic))


class JaggedPlan:
    """One jagged layout, planned once and run many times (for example by every attention layer of a step).

    ``jagged_flash_attention`` reads the offsets on the host at every call, to validate them and to look
    up its tile schedule; with offsets on the GPU that copy waits for all work queued before it.  A plan
    does that once: it keeps its own copy of the offsets (so later writes to the caller's offset tensors
    cannot reach a planned launch), the validation and the schedule.  Calling it launches the kernels
    without waiting for the GPU::

        plan = JaggedPlan(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=True)
        out, lse = plan(q, k, v)        # same answers, bit for bit, as jagged_flash_attention(...)

    A call takes q, k, v of the planned shapes, dtypes, devices and strides (any values); anything else is a
    ValueError naming the field.  The forward kernel, the launch configs, the tile schedule and the switches
    the backward acts on (BackwardSwitches) are fixed when the plan is made; the forward's other switches
    are read at each call, as in a plain call.  Inside torch.compile a call is a plain call with the plan's
    own offsets (kernels/torch_ops.py).
    """

    def __init__(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                 causal=False, softmax_scale=None, broadcast_q=False, deterministic=False):
        own = [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in (cu_seqlens_q, cu_seqlens_k)]
        self._args = _prepare(q, k, v, own[0], own[1], max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                              broadcast_q, deterministic)
        self._deterministic = deterministic
        self._layout = tuple(self._layout_of(name, t) for name, t in zip("qkv", (q, k, v)))

    @staticmethod
    def _layout_of(name, t):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor")
        return (("shape", tuple(t.shape)), ("dtype", t.dtype), ("device", t.device), ("stride", t.stride()),
                ("data_ptr % 16", t.data_ptr() % 16))

    def __call__(self, q, k, v):
        if torch.compiler.is_compiling():  # a plain call with the plan's own offsets (kernels/torch_ops.py)
            cu_q, cu_k, _, _, causal, scale, broadcast = self._args[3:10]
            return _compiled_call(q, k, v, cu_q, cu_k, None, None, causal, scale, broadcast, self._deterministic)
        for name, t, planned in zip("qkv", (q, k, v), self._layout):
            for (field, want), (_, got) in zip(planned, self._layout_of(name, t)):
                if got != want:
                    raise ValueError(f"{name}.{field} is {got}, but the plan was made for {want}")
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))  # as _prepare did
        return _JaggedFlashAttention.apply(q, k, v, *self._args[3:])


def _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
             broadcast_q, deterministic):
    """The host side of a call: validation (reads the offsets on the host), launch configs and the
    cached schedule.  Returns the arguments of _JaggedFlashAttention.apply."""
    cu_q_h, cu_k_h, lens_q, lens_k = _validate(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                               max_seqlen_q, max_seqlen_k, broadcast_q,
                                               softmax_scale)
    d = q.shape[2]
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(d)
    on_cpu = q.device.type == "cpu"
    dkey = max(d, v.shape[2])
    if BWD_DQ_MODE not in BWD_DQ_MODES:
        raise ValueError(f"jfa.BWD_DQ_MODE must be one of {BWD_DQ_MODES}, got {BWD_DQ_MODE!r}")
    fuse = (BWD_DQ_MODE == "atomic") and not broadcast_q and not deterministic
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    fwd_kernel, why_not_gluon = _pick_fwd_kernel(q, k, v, scale)
    gluon = None if fwd_kernel == "triton" else (_gluon_cfg(), GLUON_SPLIT_KEYS if fwd_kernel == "split" else 0)
    if BWD_KV_KERNEL not in BWD_KV_KERNELS:
        raise ValueError(f"jfa.BWD_KV_KERNEL must be one of {BWD_KV_KERNELS}, got {BWD_KV_KERNEL!r}")
    why_not_gluon_bwd = ""
    fused_split = ""
    kv_kernel = BWD_KV_KERNEL
    if kv_kernel == "auto":
        # (the fused atomic dQ and the stored dS run in the tl kernel then)
        kv_kernel = ("triton" if fuse or BWD_DQ_MODE == "ds"
                     or not {q.shape[2], v.shape[2]} <= set(GLUON_BWD_AUTO_HEAD_DIMS) else "gluon")
    if kv_kernel != "triton":
        _gluon_bwd_stages()  # a bad value is a clear error before the forward runs
        if kv_kernel == "split" and not (isinstance(GLUON_BWD_SPLIT_KEYS, int) and GLUON_BWD_SPLIT_KEYS >= 1):
            raise ValueError(f"jfa.GLUON_BWD_SPLIT_KEYS must be an int >= 1, got {GLUON_BWD_SPLIT_KEYS!r}")
        if fuse and kv_kernel == "gluon":
            fused_split = _fused_dq_split(q.shape[2])
            if GLUON_FUSED_DQ_BUFFERS not in (1, 2):
                raise ValueError(f"jfa.GLUON_FUSED_DQ_BUFFERS must be 1 or 2, got {GLUON_FUSED_DQ_BUFFERS!r}")
        smem = _gluon_bwd_smem_bytes(q.shape[2], v.shape[2], GLUON_BWD_STAGES, fused_split, GLUON_FUSED_DQ_BUFFERS,
                                     GLUON_BWD_BLOCK_M)
        # (at head dims the kernel does not serve it is refused below, with its reason)
        if {q.shape[2], v.shape[2]} <= set(GLUON_HEAD_DIMS) and smem > GLUON_SMEM_BYTES - 1024:
            raise ValueError(f"the Gluon dK/dV kernel with jfa.GLUON_BWD_STAGES={GLUON_BWD_STAGES}, "
                             f"GLUON_BWD_BLOCK_M={GLUON_BWD_BLOCK_M}"
                             + (f", GLUON_FUSED_DQ_SPLIT={fused_split!r}, GLUON_FUSED_DQ_BUFFERS="
                                f"{GLUON_FUSED_DQ_BUFFERS}" if fused_split else "")
                             + f" at head dims {q.shape[2]} / {v.shape[2]} needs about {smem} bytes of shared "
                             f"memory; sm_90 has {GLUON_SMEM_BYTES}")
        why_not_gluon_bwd = (_gluon_refusal(q, k, v, scale, block_rows=(GLUON_BWD_BLOCK_M, GLUON_BWD_KV_ROWS))
                             or ("the split dK/dV runs with the separate dQ kernels only"
                                 if fuse and kv_kernel == "split" else "")
                             or ("the Gluon dK/dV kernel fuses dQ in its plain order only"
                                 if fuse and GLUON_BWD_ORDER != "plain" else "")
                             or ("the Gluon dK/dV kernel fuses dQ with 32-row query blocks only"
                                 if fuse and GLUON_BWD_BLOCK_M != 32 else ""))
    silent_kv = BWD_KV_KERNEL == "auto"
    if why_not_gluon_bwd and silent_kv:
        kv_kernel, why_not_gluon_bwd = "triton", ""
    if BWD_Q_KERNEL not in BWD_Q_KERNELS:
        raise ValueError(f"jfa.BWD_Q_KERNEL must be one of {BWD_Q_KERNELS}, got {BWD_Q_KERNEL!r}")
    if not (isinstance(GLUON_TMA_STORE_KERNELS, (tuple, list, frozenset, set))
            and set(GLUON_TMA_STORE_KERNELS) <= set(GLUON_TMA_STORE_KERNELS_ALL)):
        raise ValueError(f"jfa.GLUON_TMA_STORE_KERNELS (environment JFA_GLUON_TMA_STORE_KERNELS, names joined by "
                         f"commas) must be a tuple of names from {GLUON_TMA_STORE_KERNELS_ALL}, "
                         f"got {GLUON_TMA_STORE_KERNELS!r}")
    for name, value in (("GLUON_BWD_REG_OPERAND", GLUON_BWD_REG_OPERAND), ("GLUON_DQ_DELTA", GLUON_DQ_DELTA)):
        if not isinstance(value, bool):
            raise ValueError(f"jfa.{name} (environment JFA_{name}: 0 or 1) must be True or False, got {value!r}")
    why_not_gluon_dq = ""
    if BWD_Q_KERNEL != "triton":
        if not (isinstance(GLUON_DQ_STAGES, int) and 1 <= GLUON_DQ_STAGES <= 2):
            raise ValueError(f"jfa.GLUON_DQ_STAGES must be 1 or 2, got {GLUON_DQ_STAGES!r}")
        why_not_gluon_dq = ("broadcast-Q sums dQ over the batch (the tl chunked dQ kernel does)" if broadcast_q
                            else "the fused atomic dQ mode computes dQ in its dK/dV kernel" if fuse
                            else _gluon_refusal(q, k, v, scale, block_rows=GLUON_DQ_BOX_ROWS))
        if BWD_Q_KERNEL == "auto" and not {q.shape[2], v.shape[2]} <= set(GLUON_DQ_AUTO_HEAD_DIMS):
            why_not_gluon_dq = "not timed at these head dims"  # silent under "auto"
    why_not_ds = ""
    if BWD_DQ_MODE == "ds":
        if not (isinstance(DS_WORKSPACE_MAX_BYTES, int) and DS_WORKSPACE_MAX_BYTES >= 0):
            raise ValueError(f"jfa.DS_WORKSPACE_MAX_BYTES must be an int >= 0, got {DS_WORKSPACE_MAX_BYTES!r}")
        ds_bytes = q.shape[1] * int(np.dot(lens_q.astype(np.int64), lens_k.astype(np.int64))) * q.element_size()
        if kv_kernel != "triton" and not why_not_gluon_bwd:
            why_not_ds = f"dS is stored by the tl dK/dV kernel only (jfa.BWD_KV_KERNEL is {BWD_KV_KERNEL!r})"
        elif ds_bytes > DS_WORKSPACE_MAX_BYTES:
            why_not_ds = (f"its dS workspace would take {ds_bytes} bytes, over jfa.DS_WORKSPACE_MAX_BYTES "
                          f"({DS_WORKSPACE_MAX_BYTES})")
    ds_dq = BWD_DQ_MODE == "ds" and not why_not_ds
    if ds_dq and BWD_Q_KERNEL == "gluon":
        why_not_gluon_dq = "BWD_DQ_MODE 'ds' reads dQ's dS back in its own kernel"
    bwd_q_kernel = "gluon" if BWD_Q_KERNEL != "triton" and not why_not_gluon_dq and not ds_dq else "triton"
    silent_dq = BWD_Q_KERNEL == "auto"
    # (GLUON_BWD_ORDER is checked where the Gluon dK/dV kernel may run)
    order = GLUON_BWD_ORDERS.index(GLUON_BWD_ORDER) if GLUON_BWD_ORDER in GLUON_BWD_ORDERS else 0
    bwd = BackwardSwitches(GLUON_GRID, GLUON_BWD_STAGES, order, GLUON_BWD_BLOCK_M,
                           GLUON_BWD_SPLIT_KEYS if kv_kernel == "split" else 0, fused_split or "keys",
                           GLUON_FUSED_DQ_BUFFERS, fuse and _dq_reduce_by_tma(q), GLUON_DQ_STAGES,
                           "backward" in GLUON_TMA_STORE_KERNELS, GLUON_BWD_REG_OPERAND, GLUON_DQ_DELTA)
    cfgs = LaunchConfig(_cfg("fwd", dkey, q.dtype, on_cpu), _cfg("kvf" if fuse else "kv", dkey, q.dtype, on_cpu),
                        _cfg("qds" if ds_dq else "q", dkey, q.dtype, on_cpu), fuse, fwd_kernel, why_not_gluon, gluon,
                        kv_kernel if kv_kernel != "triton" and not why_not_gluon_bwd else "triton",
                        why_not_gluon_bwd, bwd_q_kernel, "" if silent_dq else why_not_gluon_dq, silent_dq, bwd,
                        ds_dq, why_not_ds, silent_kv)
    if cu_seqlens_q.device != q.device:
        cu_seqlens_q = cu_seqlens_q.to(q.device)
    if cu_seqlens_k.device != q.device:
        cu_seqlens_k = cu_seqlens_k.to(q.device)
    s = _build_schedule(cu_q_h, cu_k_h, lens_q, lens_k, bool(broadcast_q), bool(causal), cfgs,
                        q.shape[1], k.shape[1], q.device, row_bytes=2 * dkey * q.element_size())
    n_out_rows = int(lens_q.sum())
    return (q, k, v, cu_seqlens_q, cu_seqlens_k, s, cfgs, bool(causal), scale, bool(broadcast_q), n_out_rows)
