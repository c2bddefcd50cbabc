"""Hypothesis strategies that draw whole problems, bounded by a backend's declared capabilities.

Each draw is labelled (``length_law``, ``heads``, ...) so a shrunk failure reads as a sentence. Lengths
follow named laws that stress what jagged kernels get wrong: skew, empty sequences, one huge sequence
among tiny ones, lengths straddling tile sizes (16, 64, 128), and decode batches (0 or 1 query per
sequence, where fast paths for max_seqlen_q == 1 live).
"""
from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from .backend import Capabilities
from .configs import (HEAD_DIMS, HEAD_LAYOUTS, SCALES, SLOW_PATH_MAX_HEADS, KernelConfig, axis_values, pinned,
                      tensor_axis_values)
from .problem import DRAWN_LAYOUTS, GRAD_LAYOUTS, OFFSETS_DTYPES, OFFSETS_LAYOUTS, Problem, value_laws

__all__ = ["HEAD_DIMS", "HEAD_LAYOUTS", "LENGTH_LAWS", "declared_values", "lengths", "problems"]

# Lengths around tile edges: 1, 15-17, 63-65, 127-129.
TILE_EDGES = (1, 15, 16, 17, 63, 64, 65, 127, 128, 129)
MAX_BATCH = 8
MAX_LEN = 96  # typical lengths; the mega law and tile edges go past it


def _pareto(draw, label: str, n: int) -> list[int]:
    # Inverse-CDF Pareto(alpha=1.2, min 1) from uniform draws, capped: a heavy tail that shrinks well.
    u = draw(st.lists(st.floats(0.0, 0.999), min_size=n, max_size=n), label=label)
    return [min(256, int((1.0 - x) ** (-1.0 / 1.2))) for x in u]


LENGTH_LAWS = ("uniform", "pareto", "bimodal", "many_zeros", "mega_plus_tiny", "tile_edges", "equal", "decode")


# The mega sequence is sometimes long: past 512 keys, where kernels switch paths (split-KV heuristics, the
# project kernel's Gluon forward). Only where the float64 oracle stays cheap: at most LONG_MAX_WIDTH query
# heads x head dim (a 768-key sequence then costs the oracle about what a 320-key one at full width does).
LONG_LENGTHS = (513, 768)
LONG_MAX_WIDTH = 512


@st.composite
def lengths(draw, n: int, law: str, label: str, long_ok: bool = False) -> list[int]:
    """``n`` sequence lengths following ``law`` (``long_ok``: the mega law may draw a long sequence)."""
    if law == "uniform":
        return draw(st.lists(st.integers(0, MAX_LEN), min_size=n, max_size=n), label=label)
    if law == "pareto":
        return _pareto(draw, label, n)
    if law == "bimodal":
        return draw(st.lists(st.one_of(st.integers(1, 8), st.integers(80, 160)), min_size=n, max_size=n), label=label)
    if law == "many_zeros":
        return draw(st.lists(st.one_of(st.just(0), st.just(0), st.integers(1, 40)), min_size=n, max_size=n), label=label)
    if law == "mega_plus_tiny":
        tiny = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n), label=label)
        if n:
            mega = st.integers(200, 320)
            if long_ok:  # (second: hypothesis shrinks toward the first branch)
                mega = st.one_of(mega, st.integers(*LONG_LENGTHS))
            tiny[draw(st.integers(0, n - 1), label=f"{label} mega index")] = draw(mega, label=f"{label} mega length")
        return tiny
    if law == "tile_edges":
        return draw(st.lists(st.sampled_from(TILE_EDGES), min_size=n, max_size=n), label=label)
    if law == "equal":
        return [draw(st.integers(0, 130), label=label)] * n
    if law == "decode":  # key lengths of a decode batch (its queries: 0 or 1 each, see problems)
        return draw(st.lists(st.integers(0, 2 * MAX_LEN), min_size=n, max_size=n), label=label)
    raise ValueError(f"unknown length law {law!r}")


def _shrink_to(max_rows: int, seqlens_q: list[int], seqlens_k: list[int], broadcast_q: bool):
    """Scale lengths down proportionally so that query + key rows fit ``max_rows`` (zeros stay zeros)."""
    rows = (seqlens_q[0] if broadcast_q and seqlens_q else sum(seqlens_q)) + sum(seqlens_k)
    if rows <= max_rows:
        return seqlens_q, seqlens_k
    factor = max_rows / rows
    shrink = lambda lens: [max(1, int(n * factor)) if n else 0 for n in lens]  # noqa: E731
    if broadcast_q:
        return [max(1, int(seqlens_q[0] * factor))] * len(seqlens_q), shrink(seqlens_k)
    if seqlens_q == seqlens_k:
        same = shrink(seqlens_k)
        return same, list(same)
    return shrink(seqlens_q), shrink(seqlens_k)


def _free_config(draw, caps: Capabilities, broadcast_q, causal, dtype) -> KernelConfig:
    """Every kernel axis drawn independently from what ``caps`` declares (the ``thorough`` profile)."""
    if broadcast_q is None:
        broadcast_q = caps.broadcast_q != "none" and draw(st.booleans(), label="broadcast_q")
    layouts = HEAD_LAYOUTS if caps.gqa else tuple(h for h in HEAD_LAYOUTS if h[0] == h[1])
    if caps.max_drawn_rows is not None:
        layouts = tuple(h for h in layouts if h[0] <= SLOW_PATH_MAX_HEADS)
    heads_q, heads_kv = draw(st.sampled_from(layouts), label="heads (Hq, Hkv)")
    dims = tuple(d for d in (caps.head_dims or HEAD_DIMS) if caps.supports_head_dim(d))
    head_dim = draw(st.sampled_from(dims), label="head_dim")
    head_dim_v = None
    if caps.value_dim_differs and draw(st.booleans(), label="Dv != D"):
        head_dim_v = draw(st.sampled_from(dims), label="head_dim_v")
    return KernelConfig(
        dtype=dtype or draw(st.sampled_from(caps.dtypes), label="dtype"), head_dim=head_dim, head_dim_v=head_dim_v,
        heads_q=heads_q, heads_kv=heads_kv, causal=causal or draw(st.sampled_from(caps.causal_modes), label="causal"),
        broadcast_q=broadcast_q, scale=draw(st.sampled_from(SCALES), label="scale"),
        offsets_dtype=draw(st.sampled_from(tuple(OFFSETS_DTYPES)), label="offsets_dtype"))


def simplicity(config: KernelConfig) -> tuple:
    """Sort key of kernel configurations, simplest first: fewer heads, then fewer features switched on (a
    value dim of its own, a causal mask, broadcast-Q, a scale of its own, int64 offsets, a dtype other than
    float32), then smaller head dims."""
    features = (config.head_dim_v is not None, config.causal != "none", config.broadcast_q,
                config.scale is not None, config.offsets_dtype != "int32", config.dtype != "float32")
    return (config.heads_q, config.heads_q // config.heads_kv, sum(features), features, config.head_dim,
            config.head_dim_v or 0, config.causal, config.scale or 0.0, config.dtype)


@st.composite
def problems(
    draw,
    caps: Capabilities = Capabilities(),
    *,
    broadcast_q: bool | None = None,
    causal: str | None = None,
    dtype: str | None = None,
    min_batch: int = 0,
    configs: tuple[KernelConfig, ...] | None = None,
) -> Problem:
    """A problem inside ``caps``; keyword arguments pin a feature instead of drawing it.

    With ``configs`` (the run's kernel configurations, see configs.py) the kernel axes are one drawn
    configuration; without, each kernel axis is drawn on its own. Lengths, batch and seed are always
    drawn freely.
    """
    pins = {k: v for k, v in dict(broadcast_q=broadcast_q, causal=causal, dtype=dtype).items() if v is not None}
    candidates = pinned(configs or (), **pins)
    if configs and not candidates:  # no configuration has every pinned value: pin it on them
        candidates = tuple(dict.fromkeys(dataclasses.replace(c, **pins) for c in configs))
    # simplest first: hypothesis shrinks a sampled value toward the front, so a shrunk counterexample has the
    # simplest configuration that still fails
    candidates = tuple(sorted(candidates, key=simplicity))
    only_drawn = set(getattr(configs, "fresh", ()))
    fresh = tuple(c for c in candidates if c in only_drawn)
    if candidates:
        choices = st.sampled_from(candidates)
        if fresh:  # half the draws from the configurations no edge case runs, so each meets an example
            # (all of them second: one_of shrinks toward its first branch, the simplest of all comes first)
            choices = st.one_of(choices, st.sampled_from(fresh))
        config = draw(choices, label="kernel config")
    else:
        config = _free_config(draw, caps, broadcast_q, causal, dtype)
    batch = draw(st.integers(min_batch, MAX_BATCH), label="batch")
    # decode batches (one query or none per sequence, max_seqlen_q <= 1) need Lq != Lk
    laws = LENGTH_LAWS if caps.cross_attention else tuple(law for law in LENGTH_LAWS if law != "decode")
    law = draw(st.sampled_from(laws), label="length_law")
    long_ok = caps.max_drawn_rows is None and config.heads_q * max(config.head_dim, config.head_dim_v or 0) <= LONG_MAX_WIDTH
    seqlens_k = draw(lengths(batch, law, "seqlens_k", long_ok))
    if not caps.zero_length:
        seqlens_k = [max(1, n) for n in seqlens_k]

    if config.broadcast_q:
        lq = draw(st.sampled_from((1, 4, 16, 17, 33, 64)), label="dense Lq")
        seqlens_q = [lq] * batch
    elif law == "decode":
        seqlens_q = draw(st.lists(st.integers(0 if caps.zero_length else 1, 1), min_size=batch, max_size=batch),
                         label="seqlens_q (decode)")
    elif caps.cross_attention and draw(st.booleans(), label="cross-attention (Lq != Lk)"):
        seqlens_q = draw(lengths(batch, law, "seqlens_q", long_ok))
        if not caps.zero_length:
            seqlens_q = [max(1, n) for n in seqlens_q]
    else:
        seqlens_q = list(seqlens_k)

    if caps.max_drawn_rows is not None:
        seqlens_q, seqlens_k = _shrink_to(caps.max_drawn_rows, seqlens_q, seqlens_k, config.broadcast_q)
    # How the caller hands the numbers over, and what they are: cheap to vary (no new kernel), so free.
    tensors = dict(
        layout=draw(st.sampled_from(DRAWN_LAYOUTS), label="layout"),
        offsets_layout=draw(st.sampled_from(OFFSETS_LAYOUTS), label="offsets_layout"),
        grad_layout=draw(st.sampled_from(GRAD_LAYOUTS), label="grad_layout"),
        values=draw(st.sampled_from(value_laws(config.dtype)), label="values"),
    )
    return config.problem(seqlens_q, seqlens_k, seed=draw(st.integers(0, 2**16), label="seed"), length_law=law,
                          **tensors)


def declared_values(caps: Capabilities) -> dict[str, list[str]]:
    """Every value a run should exercise on each coverage axis (configs.problem_axes), as the coverage
    table writes it, for a backend with ``caps``: what ``selftest`` and the coverage meta-test compare a
    run's coverage with."""
    kernel = axis_values(caps)
    declared = {
        "dtype": list(kernel["dtype"]), "head_dim": [str(d) for d in kernel["head_dim"]],
        "head_dim_v": list(kernel["head_dim_v"]), "heads": [f"{q}:{k}" for q, k in kernel["heads"]],
        "causal": list(kernel["causal"]), "broadcast_q": [str(b).lower() for b in kernel["broadcast_q"]],
        "scale": ["default" if s is None else f"{s:g}" for s in kernel["scale"]],
        "offsets_dtype": list(kernel["offsets_dtype"]),
        "length_law": [law for law in LENGTH_LAWS if caps.cross_attention or law != "decode"], "batch": ["0", "1", "2-4", f"5-{MAX_BATCH}"],
        "zero_length": ["false", "true"] if caps.zero_length else ["false"],
        "cross_attention": ["false", "true"] if caps.cross_attention else ["false"],
    }
    return {**declared, **{axis: list(v) for axis, v in tensor_axis_values(caps).items()}}
