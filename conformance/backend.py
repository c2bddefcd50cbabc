"""The adapter contract: what a backend declares and what it must compute.

A backend is an object with a ``name``, :class:`Capabilities` declared as data, ``unavailable_reason``
(why it cannot run on this machine at all), ``not_supported_reasons(problem)`` (why it cannot run one
problem; readable sentences, empty when supported) and ``forward(args) -> Output``. Subclass
:class:`Backend` and usually only ``forward`` and the capabilities need writing.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, fields
from typing import Literal

import torch

from .problem import AttentionArgs, Output, Problem

BroadcastQ = Literal["native", "emulated", "none"]
ALL_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Capabilities:
    """What a backend supports, as data. The spec draws only problems inside these bounds."""

    devices: tuple[str, ...] = ("cpu",)
    dtypes: tuple[str, ...] = ALL_DTYPES
    head_dims: tuple[int, ...] | None = None  # None: any head dim
    max_head_dim: int | None = None
    value_dim_differs: bool = True  # may Dv differ from D?
    causal_modes: tuple[str, ...] = ("none", "bottom_right")
    gqa: bool = True
    cross_attention: bool = True  # may Lq differ from Lk within a sequence?
    zero_length: bool = True  # sequences of length 0
    broadcast_q: BroadcastQ = "emulated"
    backward: bool = True
    lse: bool = True
    deterministic: bool = False
    min_compute_capability: tuple[int, int] | None = None
    # The most sequences one call may hold (a per-sequence loop's cost, a kernel's documented limit); None: any.
    max_batch: int | None = None
    # A cost hint, not a limit: hypothesis draws problems of at most this many query + key rows and at
    # most 4 query heads (for slow paths such as Triton's interpreter). Named edge cases still run in full.
    max_drawn_rows: int | None = None
    # A cost hint: typical seconds the first call spends compiling one kernel configuration (JIT backends).
    # On a cold cache the warm-up has measured nothing yet and orders the backends by it (warmup.order).
    # 0 declares that the backend compiles nothing a cache could keep: the warm-up skips it. None: unknown.
    compile_s: float | None = None
    # Problem sizes at which the backend's compiled kernels change (a persistent grid once the work outnumbers
    # the SMs, a kernel for long sequences): (query lengths, key lengths) pairs the warm-up runs for every
    # configuration besides its own small problems, so that checks meeting those sizes find the variants
    # compiled. Under broadcast-Q the query lengths become one short dense block per sequence.
    warmup_lengths: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()
    # Whether a build runs many compiler processes at once (FlashInfer's JIT: nvcc through ninja, one process
    # per core). The warm-up runs such a backend's jobs at a lower CPU priority, so that its builds take the
    # cores other backends' single-threaded compiles and the checks leave idle instead of starving them
    # (the H200 run of 2026-12-06: FA4's 24 configurations took 1,157 compile-seconds and triton-jfa's 30
    # 1,339 beside FlashInfer's six builds, against 498 and 556 in an H100 run that began those builds late).
    parallel_build: bool = False
    # What runs the backend in place of its kernels here (e.g. "Triton's interpreter"); "" for the kernels
    # themselves. Its times would measure that, not a kernel: the benchmarks time it only when it is named
    # with --backend, and reports mark its timings.
    interpreted_by: str = ""
    notes: str = ""

    def __post_init__(self):
        for i, pair in enumerate(self.warmup_lengths):
            ok = (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(x, tuple) for x in pair)
                  and len(pair[0]) == len(pair[1]) and len(pair[1]) > 0
                  and all(isinstance(n, int) and n >= 0 for x in pair for n in x))
            if not ok:
                raise ValueError(f"Capabilities.warmup_lengths[{i}] must be a pair of equally long, non-empty "
                                 f"tuples of lengths >= 0 (query lengths, key lengths), got {pair!r}")

    def as_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        # (a report names the warm-up's sizes, not hundreds of lengths)
        data["warmup_lengths"] = [{"sequences": len(k), "query_rows": sum(q), "key_rows": sum(k),
                                   "longest_keys": max(k)} for q, k in self.warmup_lengths]
        return data

    def supports_head_dim(self, d: int) -> bool:
        if self.head_dims is not None and d not in self.head_dims:
            return False
        return self.max_head_dim is None or d <= self.max_head_dim


class Backend:
    """Base class for adapters. Override ``forward``; extend the two reason methods when needed."""

    name: str = "unnamed"
    capabilities: Capabilities = Capabilities()
    requires: tuple[str, ...] = ()  # importable modules the adapter needs

    def unavailable_reason(self, device: str) -> str | None:
        """Why this backend cannot run on ``device`` here (missing package, no GPU, wrong arch), or None."""
        for module in self.requires:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                return f"the Python module '{module}' is not installed"
        kind = torch.device(device).type
        if kind not in self.capabilities.devices:
            return f"runs on {', '.join(self.capabilities.devices)}, not on {kind}"
        if kind == "cuda":
            if not torch.cuda.is_available():
                return "no CUDA GPU is visible"
            need = self.capabilities.min_compute_capability
            have = torch.cuda.get_device_capability(device)
            if need is not None and have < need:
                return f"needs compute capability >= {need[0]}.{need[1]}, this GPU has {have[0]}.{have[1]}"
        return None

    def build_key(self, config, device: str) -> str | None:
        """What the first call on kernel configuration ``config`` (configs.KernelConfig) compiles on
        ``device``, as a key equal for every configuration, of this backend or another, that uses the same
        compiled code; None (the default) when each configuration compiles its own. The warm-up makes each
        build once before the jobs that share it (warmup.py); a wrong key costs time, never a result."""
        return None

    def not_supported_reasons(self, problem: Problem) -> list[str]:
        caps, reasons = self.capabilities, []
        if problem.dtype not in caps.dtypes:
            reasons.append(f"dtype {problem.dtype} is not supported (supports {', '.join(caps.dtypes)})")
        for label, d in (("head_dim", problem.head_dim), ("head_dim_v", problem.value_dim)):
            if not caps.supports_head_dim(d):
                allowed = caps.head_dims if caps.head_dims is not None else f"<= {caps.max_head_dim}"
                reasons.append(f"{label} {d} is not supported (supports {allowed})")
        if problem.value_dim != problem.head_dim and not caps.value_dim_differs:
            reasons.append("a value head dim different from the query/key head dim is not supported")
        if problem.causal not in caps.causal_modes:
            reasons.append(f"causal mode '{problem.causal}' is not supported (supports {', '.join(caps.causal_modes)})")
        if problem.heads_q != problem.heads_kv and not caps.gqa:
            reasons.append("grouped-query attention (Hq != Hkv) is not supported")
        if problem.broadcast_q and caps.broadcast_q == "none":
            reasons.append("broadcast-Q is not supported")
        if not problem.broadcast_q and not caps.cross_attention and problem.seqlens_q != problem.seqlens_k:
            reasons.append("query and key lengths must be equal per sequence (no cross-attention)")
        if not caps.zero_length and 0 in problem.seqlens_q + problem.seqlens_k:
            reasons.append("zero-length sequences are not supported")
        if caps.max_batch is not None and problem.batch > caps.max_batch:
            reasons.append(f"batch {problem.batch} is more sequences than supported (max_batch {caps.max_batch})")
        return reasons

    def forward(self, args: AttentionArgs) -> Output:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


@dataclass
class BackendInfo:
    """A row of ``jfa-conformance list``."""

    name: str
    source: str
    available: bool
    reason: str | None
    capabilities: dict = field(default_factory=dict)

