"""The problem model: what one conformance check computes, and the tensors it is made of.

A :class:`Problem` is a small, hashable, JSON-friendly description (lengths, heads, dims, dtype, masking,
seed). :func:`make_inputs` turns it into tensors deterministically, so a problem printed in a failure
message or stored in a report regenerates exactly the same inputs.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import torch

CausalMode = Literal["none", "bottom_right", "top_left"]
CAUSAL_MODES: tuple[str, ...] = ("none", "bottom_right", "top_left")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def key_visible(q_pos: torch.Tensor, k_pos: torch.Tensor, len_q, len_k, causal: str) -> torch.Tensor:
    """The masking convention, elementwise and broadcastable: may query ``q_pos`` see key ``k_pos``?

    Positions are within one sequence. Bottom-right causal aligns the last query with the last key
    (``j <= i + Lk - Lq``); top-left aligns the first ones (``j <= i``). Every backend and the oracle
    build their masks from this function.
    """
    if causal == "none":
        return torch.ones_like(q_pos + k_pos, dtype=torch.bool)
    if causal == "bottom_right":
        return k_pos <= q_pos + (len_k - len_q)
    if causal == "top_left":
        return k_pos <= q_pos
    raise ValueError(f"causal must be one of {CAUSAL_MODES}, got {causal!r}")


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


@dataclass(frozen=True)
class Problem:
    """One jagged attention problem. With ``broadcast_q`` every entry of ``seqlens_q`` is the dense Lq."""

    seqlens_q: tuple[int, ...]
    seqlens_k: tuple[int, ...]
    heads_q: int = 1
    heads_kv: int = 1
    head_dim: int = 64
    head_dim_v: int | None = None
    dtype: str = "float32"
    causal: str = "none"
    broadcast_q: bool = False
    scale: float | None = None
    seed: int = 0
    length_law: str = "given"

    def __post_init__(self):
        if len(self.seqlens_q) != len(self.seqlens_k):
            raise ValueError(
                f"seqlens_q has {len(self.seqlens_q)} entries but seqlens_k has {len(self.seqlens_k)}"
            )
        if any(n < 0 for n in self.seqlens_q + self.seqlens_k):
            raise ValueError("seqlens_q and seqlens_k must be non-negative")
        if self.broadcast_q and len(set(self.seqlens_q)) > 1:
            raise ValueError("seqlens_q must all equal the dense Lq when broadcast_q is set")
        if self.heads_kv <= 0 or self.heads_q % self.heads_kv:
            raise ValueError(f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.causal not in CAUSAL_MODES:
            raise ValueError(f"causal must be one of {CAUSAL_MODES}, got {self.causal!r}")
        if self.scale is not None and not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be finite and positive, got {self.scale}")

    # -- derived quantities -------------------------------------------------------------------------
    @property
    def batch(self) -> int:
        return len(self.seqlens_k)

    @property
    def dense_lq(self) -> int:
        """Lq of the shared dense q (broadcast-Q only)."""
        return self.seqlens_q[0] if self.seqlens_q else 0

    @property
    def value_dim(self) -> int:
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def softmax_scale(self) -> float:
        return default_scale(self.head_dim) if self.scale is None else self.scale

    @property
    def out_rows(self) -> int:
        return sum(self.seqlens_q)

    @property
    def gqa_ratio(self) -> int:
        return self.heads_q // self.heads_kv

    def replace(self, **changes) -> Problem:
        return dataclasses.replace(self, **changes)

    def visible_pairs(self) -> int:
        """Number of (query, key) pairs attended to: the useful work, used for FLOP counts."""
        total = 0
        for lq, lk in zip(self.seqlens_q, self.seqlens_k):
            if self.causal == "none":
                total += lq * lk
            else:
                shift = lk - lq if self.causal == "bottom_right" else 0
                total += sum(max(0, min(lk, i + shift + 1)) for i in range(lq))
        return total

    def summary(self) -> dict:
        """Flat description for reports: the fields plus length statistics."""
        d = dataclasses.asdict(self)
        for side, lens in (("q", self.seqlens_q), ("k", self.seqlens_k)):
            d[f"L{side}_min"] = min(lens, default=0)
            d[f"L{side}_max"] = max(lens, default=0)
            d[f"L{side}_mean"] = round(sum(lens) / len(lens), 2) if lens else 0
        d["batch"] = self.batch
        d["zero_length_sequences"] = sum(1 for n in self.seqlens_k if n == 0)
        return d

    def __repr__(self) -> str:  # short enough to read in a shrunk counterexample
        fields = [f"seqlens_q={list(self.seqlens_q)}", f"seqlens_k={list(self.seqlens_k)}"]
        defaults = Problem((), ())
        for f in dataclasses.fields(self)[2:]:
            value = getattr(self, f.name)
            if f.name in ("dtype", "causal") or value != getattr(defaults, f.name):
                fields.append(f"{f.name}={value!r}")
        return f"Problem({', '.join(fields)})"


@dataclass
class AttentionArgs:
    """The tensors of one call in the packed layout (see SPEC.md), plus the call's options."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    causal: str = "none"
    softmax_scale: float = 1.0
    broadcast_q: bool = False

    @property
    def seqlens_q(self) -> list[int]:
        if self.broadcast_q:
            return [self.q.shape[0]] * self.batch
        return torch.diff(self.cu_seqlens_q).tolist()

    @property
    def seqlens_k(self) -> list[int]:
        return torch.diff(self.cu_seqlens_k).tolist()

    @property
    def batch(self) -> int:
        return self.cu_seqlens_k.numel() - 1

    def replace(self, **changes) -> AttentionArgs:
        return dataclasses.replace(self, **changes)

    def to(self, device) -> AttentionArgs:
        return self.replace(
            **{f: getattr(self, f).to(device) for f in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")}
        )

    def with_broadcast_q_expanded(self) -> AttentionArgs:
        """Broadcast-Q as an ordinary jagged call: q repeated per sequence. Autograd sums dQ back."""
        if not self.broadcast_q:
            return self
        lq, batch = self.q.shape[0], self.batch
        q = self.q.unsqueeze(0).expand(batch, *self.q.shape).reshape(batch * lq, *self.q.shape[1:])
        cu_q = torch.arange(batch + 1, dtype=self.cu_seqlens_k.dtype, device=self.cu_seqlens_k.device) * lq
        return self.replace(q=q, cu_seqlens_q=cu_q, broadcast_q=False)


@dataclass
class Output:
    """What a backend returns: ``out`` in the input dtype, ``lse`` float32 ``[Hq, rows]`` or None."""

    out: torch.Tensor
    lse: torch.Tensor | None = None


def offsets(lengths, dtype=torch.int32) -> torch.Tensor:
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    if lengths:
        cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    return cu.to(dtype)


def make_inputs(problem: Problem, device: str | torch.device = "cpu") -> AttentionArgs:
    """Random inputs for ``problem``, identical for a given seed on every machine (drawn on CPU)."""
    gen = torch.Generator().manual_seed(problem.seed)
    dtype = problem.torch_dtype
    rows_q = problem.dense_lq if problem.broadcast_q else problem.out_rows
    rows_k = sum(problem.seqlens_k)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype)

    q = rand(rows_q, problem.heads_q, problem.head_dim)
    k = rand(rows_k, problem.heads_kv, problem.head_dim)
    v = rand(rows_k, problem.heads_kv, problem.value_dim)
    cu_q = offsets([rows_q] if problem.broadcast_q else list(problem.seqlens_q))
    args = AttentionArgs(
        q=q,
        k=k,
        v=v,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=offsets(list(problem.seqlens_k)),
        max_seqlen_q=max(problem.seqlens_q, default=0),
        max_seqlen_k=max(problem.seqlens_k, default=0),
        causal=problem.causal,
        softmax_scale=problem.softmax_scale,
        broadcast_q=problem.broadcast_q,
    )
    return args.to(device)


def make_grad_out(problem: Problem, device: str | torch.device = "cpu") -> torch.Tensor:
    """The upstream gradient dO used by gradient checks (seeded apart from the inputs)."""
    gen = torch.Generator().manual_seed(problem.seed + 7919)
    g = torch.randn(problem.out_rows, problem.heads_q, problem.value_dim, generator=gen)
    return g.to(problem.torch_dtype).to(device)


def problem_of_args(args) -> Problem:
    """The problem a backend call runs, as far as its arguments tell."""
    return Problem(
        seqlens_q=tuple(args.seqlens_q), seqlens_k=tuple(args.seqlens_k),
        heads_q=args.q.shape[1], heads_kv=args.k.shape[1], head_dim=args.q.shape[2],
        head_dim_v=args.v.shape[2] if args.v.shape[2] != args.q.shape[2] else None,
        dtype=str(args.q.dtype).removeprefix("torch."), causal=args.causal, broadcast_q=args.broadcast_q,
        # The seed is unknown (the inputs may have been transformed); 0 keeps the problem replayable.
        scale=args.softmax_scale, seed=0, length_law="observed",
    )
