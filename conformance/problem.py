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

# Tensor-level axes: how the caller hands the same numbers over (SPEC.md, "What the caller may pass").
# The first value of each is the plain form, which a shrunk counterexample falls back to.
# q, k, v: contiguous, views of wider buffers, or dense views whose base is not 16-byte aligned. The last is not
# drawn (Triton keys a compiled kernel on 16-byte pointer alignment, so drawing it would compile every kernel
# configuration of a Triton-based backend twice): the misaligned_views edge case runs it in every run.
DRAWN_LAYOUTS = ("packed", "row_strided", "head_strided")
LAYOUTS = DRAWN_LAYOUTS + ("offset_view",)
OFFSETS_DTYPES = {"int32": torch.int32, "int64": torch.int64}
OFFSETS_LAYOUTS = ("contiguous", "strided")  # cu_seqlens: contiguous, or every other element of a buffer
GRAD_LAYOUTS = ("contiguous", "expanded", "transposed")  # the upstream gradient dO
# Values of q, k, v: Gaussian; a few outlier channels; or every score of a row shifted far below / above 0
# (by SCORE_SHIFT, which leaves softmax unchanged in exact arithmetic). Shifted scores need float32: float16
# cannot hold them and in bfloat16 the low-precision reference rounds them to steps of 256, which calibrates
# no tolerance.
VALUE_LAWS = ("normal", "outliers", "scores_low", "scores_high")
WIDE_RANGE_VALUES = ("scores_low", "scores_high")
SCORE_SHIFT = 6.5e4  # past the -5e4 sentinels some kernels start their running max at (BUGS.md)
OUTLIER_GAIN = 16.0  # a power of two: the scaled channels stay exact in every dtype
# Padding of the strided layouts, in elements: a multiple of 8, so every row and head still starts on a
# 16-byte boundary in every dtype (what TMA and vectorised loads ask for). It holds NaN.
LAYOUT_PAD = 16


# Past this many sequences, reports hold a problem's lengths as runs ({"runs": [[length, count], ...]}) and its
# repr as "[1] * 65537": a 65,537-sequence edge case would otherwise put half a megabyte in every record.
LENGTHS_IN_FULL = 256


def _runs(lengths) -> list[list[int]]:
    runs: list[list[int]] = []
    for n in lengths:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([int(n), 1])
    return runs


def compact_lengths(lengths) -> list[int] | dict:
    """``lengths`` as a report stores them: the list, or its runs past :data:`LENGTHS_IN_FULL` entries."""
    return list(lengths) if len(lengths) <= LENGTHS_IN_FULL else {"runs": _runs(lengths)}


def expand_lengths(value) -> tuple[int, ...]:
    """The lengths a report stored (:func:`compact_lengths`), as a tuple."""
    if isinstance(value, dict):
        return tuple(int(n) for n, count in value.get("runs", ()) for _ in range(int(count)))
    return tuple(int(n) for n in value or ())


def lengths_repr(lengths) -> str:
    """``[3, 5]``, or ``[1] * 65537 + [2] * 3`` past :data:`LENGTHS_IN_FULL` entries."""
    if len(lengths) <= LENGTHS_IN_FULL:
        return repr(list(lengths))
    return " + ".join(f"[{n}] * {count}" for n, count in _runs(lengths))


def diagonal_shift(len_q, len_k, causal: str):
    """The masking convention as data: per sequence, the ``shift`` for which query ``i`` may see key ``j``
    exactly when ``j <= i + shift`` (ints, or tensors of per-sequence lengths). Bottom-right causal aligns the
    last query with the last key (``Lk - Lq``); top-left aligns the first ones (``0``); no masking is a shift
    past every key (``Lk``). A kernel that takes the shift as data serves every mode with one compile."""
    if causal == "none":
        return len_k + 0
    if causal == "bottom_right":
        return len_k - len_q
    if causal == "top_left":
        return len_k * 0
    raise ValueError(f"causal must be one of {CAUSAL_MODES}, got {causal!r}")


def key_visible(q_pos: torch.Tensor, k_pos: torch.Tensor, len_q, len_k, causal: str) -> torch.Tensor:
    """The masking convention, elementwise and broadcastable: may query ``q_pos`` see key ``k_pos``
    (positions within one sequence)? :func:`diagonal_shift` states it; every backend and the oracle build
    their masks from one of the two."""
    return k_pos <= q_pos + diagonal_shift(len_q, len_k, causal)


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
    offsets_dtype: str = "int32"
    layout: str = "packed"
    offsets_layout: str = "contiguous"
    grad_layout: str = "contiguous"
    values: str = "normal"

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
        for name, allowed in (("offsets_dtype", tuple(OFFSETS_DTYPES)), ("layout", LAYOUTS),
                              ("offsets_layout", OFFSETS_LAYOUTS), ("grad_layout", GRAD_LAYOUTS),
                              ("values", VALUE_LAWS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.values in WIDE_RANGE_VALUES and self.dtype != "float32":
            raise ValueError(f"values {self.values!r} need dtype float32 (scores of {SCORE_SHIFT:g}), got {self.dtype}")

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
        d["seqlens_q"], d["seqlens_k"] = compact_lengths(self.seqlens_q), compact_lengths(self.seqlens_k)
        for side, lens in (("q", self.seqlens_q), ("k", self.seqlens_k)):
            d[f"L{side}_min"] = min(lens, default=0)
            d[f"L{side}_max"] = max(lens, default=0)
            d[f"L{side}_mean"] = round(sum(lens) / len(lens), 2) if lens else 0
        d["batch"] = self.batch
        d["zero_length_sequences"] = sum(1 for n in self.seqlens_k if n == 0)
        return d

    def __repr__(self) -> str:  # short enough to read in a shrunk counterexample
        fields = [f"seqlens_q={lengths_repr(self.seqlens_q)}", f"seqlens_k={lengths_repr(self.seqlens_k)}"]
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


def value_laws(dtype: str) -> tuple[str, ...]:
    """The value laws a problem of ``dtype`` may use."""
    return VALUE_LAWS if dtype == "float32" else tuple(v for v in VALUE_LAWS if v not in WIDE_RANGE_VALUES)


def offsets(lengths, dtype=torch.int32) -> torch.Tensor:
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    if lengths:
        cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    return cu.to(dtype)


def strided_offsets(cu: torch.Tensor) -> torch.Tensor:
    """``cu`` as every other element of a buffer twice as long; each filler repeats the entry before it,
    so an offsets reader that ignores the stride sees well-formed but wrong offsets (silent, not a fault)."""
    buffer = torch.empty(2 * cu.shape[0], dtype=cu.dtype, device=cu.device)
    buffer[0::2] = cu
    buffer[1::2] = cu
    return buffer[0::2]


def laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``t`` [rows, H, D] as a view with ``layout``, equal values; the padding around it holds NaN, so a
    kernel that ignores a stride or the storage offset reads NaN.

    ``row_strided``: the rows of a wider buffer, as q, k and v sliced from one fused projection (row stride
    H*D + pad, storage offset pad). ``head_strided``: heads sliced from wider heads, as k and v split out of
    one [rows, H, Dk + Dv] buffer (head stride D + pad). ``offset_view``: dense strides one element past the
    start of a buffer, so the base is not 16-byte aligned (what a kernel assuming aligned bases for TMA or
    vector loads mishandles).
    """
    if layout == "packed":
        return t
    rows, heads, dim = t.shape
    if layout == "row_strided":
        buffer = torch.full((rows, heads * dim + LAYOUT_PAD), float("nan"), dtype=t.dtype, device=t.device)
        view = buffer[:, LAYOUT_PAD:].view(rows, heads, dim)
    elif layout == "head_strided":
        buffer = torch.full((rows, heads, dim + LAYOUT_PAD), float("nan"), dtype=t.dtype, device=t.device)
        view = buffer[:, :, LAYOUT_PAD // 2 : LAYOUT_PAD // 2 + dim]
    elif layout == "offset_view":
        buffer = torch.full((1 + rows * heads * dim,), float("nan"), dtype=t.dtype, device=t.device)
        view = buffer[1:].view(rows, heads, dim)
    else:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    view.copy_(t)
    return view


def same_layout_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with the same sizes, strides and storage offset over a copy of its whole storage
    (``clone`` makes a non-dense view contiguous). The copy is a leaf: ``requires_grad_`` works on it."""
    if t.is_contiguous() and t.storage_offset() == 0:
        return t.detach().clone()
    storage = t.untyped_storage().clone()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, t.storage_offset(), t.size(), t.stride())


def _values(problem: Problem, q, k, v, gen):
    """q, k, v (float32) after ``problem.values``."""
    if problem.values == "outliers":  # two channels of q and k and one key row in sixteen of v, scaled up
        for t in (q, k):
            if t.shape[-1] and t.shape[0]:
                t[..., torch.randperm(t.shape[-1], generator=gen)[:2]] *= OUTLIER_GAIN
        if v.shape[0]:
            v[torch.randperm(v.shape[0], generator=gen)[: max(1, v.shape[0] // 16)]] *= OUTLIER_GAIN
    elif problem.values in WIDE_RANGE_VALUES:
        # Channel 0 of q is +a, of k -a (or +a): every score of a row moves by -SCORE_SHIFT (+SCORE_SHIFT)
        # after the softmax scale, a constant per row, so out is that of the other channels alone.
        a = math.sqrt(SCORE_SHIFT / problem.softmax_scale)
        q[..., 0] = a
        k[..., 0] = -a if problem.values == "scores_low" else a
    return q, k, v


def make_inputs(problem: Problem, device: str | torch.device = "cpu") -> AttentionArgs:
    """Random inputs for ``problem``, identical for a given seed on every machine (drawn on CPU), laid
    out on ``device`` as the problem's tensor-level axes say (the same numbers in every layout)."""
    gen = torch.Generator().manual_seed(problem.seed)
    dtype = problem.torch_dtype
    rows_q = problem.dense_lq if problem.broadcast_q else problem.out_rows
    rows_k = sum(problem.seqlens_k)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    q = rand(rows_q, problem.heads_q, problem.head_dim)
    k = rand(rows_k, problem.heads_kv, problem.head_dim)
    v = rand(rows_k, problem.heads_kv, problem.value_dim)
    if problem.values != "normal":
        q, k, v = _values(problem, q, k, v, gen)
    index = OFFSETS_DTYPES[problem.offsets_dtype]
    cu_q = offsets([rows_q] if problem.broadcast_q else list(problem.seqlens_q), index)
    cu_k = offsets(list(problem.seqlens_k), index)
    q, k, v, cu_q, cu_k = (t.to(device) for t in (q.to(dtype), k.to(dtype), v.to(dtype), cu_q, cu_k))
    if problem.layout != "packed":
        q, k, v = (laid_out(t, problem.layout) for t in (q, k, v))
    if problem.offsets_layout == "strided":
        cu_q, cu_k = strided_offsets(cu_q), strided_offsets(cu_k)
    return AttentionArgs(
        q=q,
        k=k,
        v=v,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        max_seqlen_q=max(problem.seqlens_q, default=0),
        max_seqlen_k=max(problem.seqlens_k, default=0),
        causal=problem.causal,
        softmax_scale=problem.softmax_scale,
        broadcast_q=problem.broadcast_q,
    )


def make_grad_out(problem: Problem, device: str | torch.device = "cpu") -> torch.Tensor:
    """The upstream gradient dO used by gradient checks (seeded apart from the inputs), in the problem's
    ``grad_layout``: contiguous; ``expanded`` (one row broadcast over all rows, stride 0, as ``out.sum()``
    and other reductions produce); ``transposed`` (a dense permuted view, same values as contiguous)."""
    gen = torch.Generator().manual_seed(problem.seed + 7919)
    rows, heads, dim = problem.out_rows, problem.heads_q, problem.value_dim
    if problem.grad_layout == "expanded":
        g = torch.randn(1, heads, dim, generator=gen).to(problem.torch_dtype).to(device)
        return g.expand(rows, heads, dim)
    g = torch.randn(rows, heads, dim, generator=gen).to(problem.torch_dtype).to(device)
    if problem.grad_layout == "transposed":
        view = torch.empty(dim, heads, rows, dtype=g.dtype, device=g.device).permute(2, 1, 0)
        view.copy_(g)
        return view
    return g


def layout_of(t: torch.Tensor) -> str:
    """The ``LAYOUTS`` value a q, k or v tensor [rows, H, D] is laid out as (``laid_out``'s inverse)."""
    rows, heads, dim = t.shape
    if t.is_contiguous():
        return "offset_view" if t.data_ptr() % 16 and rows * heads * dim else "packed"
    if heads > 1 and t.stride(1) > dim:
        return "head_strided"
    if rows > 1 and t.stride(0) != heads * dim:  # (one head: a wider head is a wider row)
        return "row_strided"
    return "packed"


def problem_of_args(args) -> Problem:
    """The problem a backend call runs, as far as its arguments tell: its shapes and options, and how q and
    the offsets are laid out (so a reproducer of a crashed call passes the same kinds of views)."""
    return Problem(
        seqlens_q=tuple(args.seqlens_q), seqlens_k=tuple(args.seqlens_k),
        heads_q=args.q.shape[1], heads_kv=args.k.shape[1], head_dim=args.q.shape[2],
        head_dim_v=args.v.shape[2] if args.v.shape[2] != args.q.shape[2] else None,
        dtype=str(args.q.dtype).removeprefix("torch."), causal=args.causal, broadcast_q=args.broadcast_q,
        # The seed is unknown (the inputs may have been transformed); 0 keeps the problem replayable.
        scale=args.softmax_scale, seed=0, length_law="observed",
        offsets_dtype=str(args.cu_seqlens_k.dtype).removeprefix("torch."),
        layout=layout_of(args.q),
        offsets_layout="contiguous" if args.cu_seqlens_k.stride(0) == 1 else "strided",
    )
