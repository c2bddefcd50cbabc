"""Kernel configurations: the problem axes that select a compiled kernel, drawn from a small per-run set.

A JIT-compiled backend (FA4's CuTe DSL, Triton, flex_attention through inductor) builds one kernel per
combination of dtype, head dims, head layout, causal mode, broadcast-Q and, for graph compilers that
specialise on Python floats, the softmax scale. Drawn freely, eight examples of eleven checks meet dozens
of combinations and a GPU run spends its time compiling. So each run fixes, per backend, a short list of
:class:`KernelConfig` values that

* starts with the configurations of the named edge cases (they run in every run anyway), and
* adds configurations until every value the backend declares on every axis appears at least once,
  values paired differently from run to run (the run's seed shuffles them);

and hypothesis draws the kernel axes from that list while lengths, batch, values and seeds stay free.
The same list tells the warm-up which kernels to compile before the checks start (see warmup.py).
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from .backend import Capabilities
from .problem import GRAD_LAYOUTS, LAYOUTS, OFFSETS_DTYPES, OFFSETS_LAYOUTS, Problem, value_laws

# Every value the spec may draw on each kernel axis (a backend's capabilities narrow them).
HEAD_DIMS = (16, 32, 40, 64, 72, 96, 128, 192, 256)
# (Hq, Hkv): MHA, GQA ratios 2, 3, 7, 8, and MQA.
HEAD_LAYOUTS = ((1, 1), (2, 2), (4, 2), (3, 1), (6, 2), (7, 1), (8, 1), (8, 4), (16, 2))
SCALES = (None, 0.05, 0.3, 1.0)  # None: 1/sqrt(head_dim)
VALUE_DIMS = ("same", "smaller", "larger")  # head_dim_v relative to head_dim
# Backends that run slowly (max_drawn_rows set, e.g. an interpreter) get at most this many query heads.
SLOW_PATH_MAX_HEADS = 4


@dataclass(frozen=True, order=True)
class KernelConfig:
    """The kernel-selecting part of a :class:`Problem`."""

    dtype: str
    head_dim: int
    head_dim_v: int | None
    heads_q: int
    heads_kv: int
    causal: str
    broadcast_q: bool
    scale: float | None
    offsets_dtype: str = "int32"  # the offsets' element type is a kernel argument's type (a compile key)

    @classmethod
    def of(cls, problem: Problem) -> KernelConfig:
        return cls(problem.dtype, problem.head_dim, problem.head_dim_v, problem.heads_q, problem.heads_kv,
                   problem.causal, problem.broadcast_q, problem.scale, problem.offsets_dtype)

    def problem(self, seqlens_q, seqlens_k, **fields) -> Problem:
        """A problem of this configuration with the given lengths (``fields``: seed, length_law)."""
        return Problem(tuple(seqlens_q), tuple(seqlens_k), heads_q=self.heads_q, heads_kv=self.heads_kv,
                       head_dim=self.head_dim, head_dim_v=self.head_dim_v, dtype=self.dtype, causal=self.causal,
                       broadcast_q=self.broadcast_q, scale=self.scale, offsets_dtype=self.offsets_dtype, **fields)

    @property
    def key(self) -> str:
        """A short stable name: ``bfloat16 d64/32 h8:1 bottom_right bq s0.3``."""
        dims = f"d{self.head_dim}" + (f"/{self.head_dim_v}" if self.head_dim_v is not None else "")
        parts = [self.dtype, dims, f"h{self.heads_q}:{self.heads_kv}", self.causal]
        if self.broadcast_q:
            parts.append("bq")
        if self.scale is not None:
            parts.append(f"s{self.scale:g}")
        if self.offsets_dtype != "int32":
            parts.append("i64")
        return " ".join(parts)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class ConfigSet(tuple):
    """A run's configurations, those the named edge cases run first; ``fresh`` are the ones only drawn
    examples exercise (the strategy draws them half the time, so each meets some example)."""

    fresh: tuple[KernelConfig, ...] = ()

    def __new__(cls, configs, fresh=()):
        made = super().__new__(cls, configs)
        made.fresh = tuple(fresh)
        return made

    def __repr__(self) -> str:  # hypothesis prints fixtures in failing cases: keep it short
        return f"ConfigSet({len(self)} kernel configurations, {len(self.fresh)} beyond the edge cases)"


def axis_values(caps: Capabilities) -> dict[str, tuple]:
    """Every value the spec draws on each kernel axis for a backend with ``caps``."""
    layouts = HEAD_LAYOUTS if caps.gqa else tuple(h for h in HEAD_LAYOUTS if h[0] == h[1])
    if caps.max_drawn_rows is not None:
        layouts = tuple(h for h in layouts if h[0] <= SLOW_PATH_MAX_HEADS)
    dims = tuple(d for d in (caps.head_dims or HEAD_DIMS) if caps.supports_head_dim(d))
    value_dims = ("same",)
    if caps.value_dim_differs and len(dims) > 1:
        value_dims = VALUE_DIMS
    return {
        "dtype": tuple(caps.dtypes),
        "head_dim": dims,
        "head_dim_v": value_dims,
        "heads": layouts,
        "causal": tuple(caps.causal_modes),
        "broadcast_q": (False, True) if caps.broadcast_q != "none" else (False,),
        "scale": SCALES,
        "offsets_dtype": tuple(OFFSETS_DTYPES),
    }


def _value_dim(choice: str, head_dim: int, dims: tuple[int, ...]) -> int | None:
    """``head_dim_v`` for a relative choice; ``smaller`` / ``larger`` fall back to the other side when
    ``head_dim`` is the smallest / largest declared dim."""
    below, above = [d for d in dims if d < head_dim], [d for d in dims if d > head_dim]
    if choice == "smaller" and not below:
        choice = "larger"
    elif choice == "larger" and not above:
        choice = "smaller"
    if choice == "smaller" and below:
        return below[-1]
    if choice == "larger" and above:
        return above[0]
    return None


def _relative_dim(config: KernelConfig) -> str:
    if config.head_dim_v is None or config.head_dim_v == config.head_dim:
        return "same"
    return "smaller" if config.head_dim_v < config.head_dim else "larger"


def covered(configs, caps: Capabilities) -> dict[str, set]:
    """Which declared values of each axis ``configs`` contain."""
    seen: dict[str, set] = {axis: set() for axis in axis_values(caps)}
    for c in configs:
        seen["dtype"].add(c.dtype)
        seen["head_dim"].add(c.head_dim)
        seen["head_dim_v"].add(_relative_dim(c))
        seen["heads"].add((c.heads_q, c.heads_kv))
        seen["causal"].add(c.causal)
        seen["broadcast_q"].add(c.broadcast_q)
        seen["scale"].add(c.scale)
        seen["offsets_dtype"].add(c.offsets_dtype)
    return seen


def kernel_configs(caps: Capabilities, seed: int, *, seeds=(), extra: int = 0, supported=None) -> ConfigSet:
    """The run's configurations for a backend with ``caps``.

    ``seeds``: configurations that run anyway (the named edge cases), kept first when the backend can run
    them. Then configurations are added until every value of :func:`axis_values` is covered — each axis's
    missing values are shuffled with ``seed`` and dealt out together, so the pairing changes from run to
    run — and ``extra`` more random ones. ``supported(config) -> bool`` drops what the backend refuses; a
    refused configuration is retried with its value-dim choice set to ``same`` before it is dropped.
    """
    values = axis_values(caps)
    rng = random.Random(seed)
    accept = supported or (lambda config: True)
    chosen: list[KernelConfig] = []

    def add(config: KernelConfig) -> bool:
        for candidate in (config, dataclasses.replace(config, head_dim_v=None)):
            if candidate not in chosen and accept(candidate):
                chosen.append(candidate)
                return True
        return False

    for config in seeds:
        if config.dtype in values["dtype"] and caps.supports_head_dim(config.head_dim) and \
                caps.supports_head_dim(config.head_dim_v or config.head_dim):
            add(config)

    def deal(pools: dict[str, list]) -> list[KernelConfig]:
        width = max(len(p) for p in pools.values())
        columns = {axis: (pool * width)[:width] for axis, pool in pools.items()}
        made = []
        for i in range(width):
            (heads_q, heads_kv), head_dim = columns["heads"][i], columns["head_dim"][i]
            made.append(KernelConfig(
                dtype=columns["dtype"][i], head_dim=head_dim,
                head_dim_v=_value_dim(columns["head_dim_v"][i], head_dim, values["head_dim"]),
                heads_q=heads_q, heads_kv=heads_kv, causal=columns["causal"][i],
                broadcast_q=columns["broadcast_q"][i], scale=columns["scale"][i],
                offsets_dtype=columns["offsets_dtype"][i]))
        return made

    def missing() -> dict[str, list]:
        seen = covered(chosen, caps)
        return {axis: [v for v in vals if v not in seen[axis]] for axis, vals in values.items()}

    # Every axis but the value dim is dealt with head_dim_v == head_dim, so that each head dim, layout,
    # mode and scale also meets the checks a backend supports only for equal dims (some backward kernels).
    for _ in range(3):  # a value whose every pairing is refused stays missing after a few deals
        gaps = missing()
        gaps["head_dim_v"] = []
        if not any(gaps.values()):
            break
        pools = {}
        for axis, vals in values.items():
            pool = list(gaps[axis]) or list(vals)
            rng.shuffle(pool)
            pools[axis] = pool
        pools["head_dim_v"] = ["same"]
        for config in deal(pools):
            add(config)
    # Then each value-dim choice still missing, on otherwise random axes.
    for _ in range(3):
        gaps = missing()["head_dim_v"]
        if not gaps:
            break
        for choice in gaps:
            pools = {axis: [rng.choice(vals)] for axis, vals in values.items()}
            pools["head_dim_v"] = [choice]
            # The widest pair: a kernel that sizes its tiles or buffers from one of the two dims (FA4's
            # sm_90 forward picks its tile from head_dim alone and faults at (16, 128)) breaks there first.
            # A kernel may also fail to compile the widest pair at all (FA4: ptxas runs out of registers at
            # (16, 256)), hiding what it does at narrower ones: the middle dim is paired with the end too.
            dims = values["head_dim"]
            pairs = [(dims[-1], dims[0]), (dims[len(dims) // 2], dims[0])] if choice == "smaller" else \
                [(dims[0], dims[-1]), (dims[0], dims[len(dims) // 2])]
            for head_dim, value_dim in dict.fromkeys(p for p in pairs if p[0] != p[1]):
                pools["head_dim"] = [head_dim]
                made = dataclasses.replace(deal(pools)[0], head_dim_v=value_dim)
                if made not in chosen and accept(made):
                    chosen.append(made)
    # A value whose dealt pairings were all refused: try it on its own with other random values.
    for axis, vals in missing().items():
        for value in vals:
            for _ in range(24):
                pools = {a: [rng.choice(v)] for a, v in values.items()}
                pools[axis] = [value]
                if axis != "head_dim_v":
                    pools["head_dim_v"] = ["same"]
                if add(deal(pools)[0]) and value in covered(chosen, caps)[axis]:
                    break
    for _ in range(extra):
        pools = {axis: [rng.choice(vals)] for axis, vals in values.items()}
        add(deal(pools)[0])
    return ConfigSet(chosen, fresh=[c for c in chosen if c not in set(seeds)])


def pinned(configs, **pins) -> tuple[KernelConfig, ...]:
    """The configurations whose fields equal ``pins`` (None pins nothing)."""
    return tuple(c for c in configs if all(v is None or getattr(c, k) == v for k, v in pins.items()))


def _bucket(n: int, edges: tuple[int, ...]) -> str:
    """``n`` as the bucket of ``edges`` it falls in: ``0``, ``1``, ``2-4``, ``5-8``, ``9+``."""
    low = 0
    for edge in edges:
        if n <= edge:
            return str(edge) if low == edge else f"{low}-{edge}"
        low = edge + 1
    return f"{low}+"


def problem_axes(problem: Problem, gradients: bool = False) -> dict[str, str]:
    """The value each coverage axis takes in ``problem`` (the report's coverage table counts these);
    ``grad_layout`` counts only where the check backpropagated (``gradients``)."""
    config = KernelConfig.of(problem)
    lens = problem.seqlens_q + problem.seqlens_k
    return {
        "dtype": problem.dtype,
        "head_dim": str(problem.head_dim),
        "head_dim_v": _relative_dim(config),
        "heads": f"{problem.heads_q}:{problem.heads_kv}",
        "causal": problem.causal,
        "broadcast_q": str(problem.broadcast_q).lower(),
        "scale": "default" if problem.scale is None else f"{problem.scale:g}",
        "length_law": problem.length_law,
        "batch": _bucket(problem.batch, (0, 1, 4, 8)),
        "max_length": _bucket(max(lens, default=0), (0, 1, 16, 64, 128, 256, 512)),
        "zero_length": str(0 in lens).lower(),
        "cross_attention": str(not problem.broadcast_q and problem.seqlens_q != problem.seqlens_k).lower(),
        "offsets_dtype": problem.offsets_dtype,
        "layout": problem.layout,
        "offsets_layout": problem.offsets_layout,
        "values": problem.values,
        **({"grad_layout": problem.grad_layout} if gradients else {}),
    }


def tensor_axis_values(caps: Capabilities) -> dict[str, tuple[str, ...]]:
    """Every value the spec draws on the axes that need no new kernel: how the caller lays the tensors out
    and what values they hold (``grad_layout`` only for a backend with a backward)."""
    values = tuple(v for v in value_laws("float32") if any(v in value_laws(d) for d in caps.dtypes))
    return {"layout": LAYOUTS, "offsets_layout": OFFSETS_LAYOUTS, "values": values,
            **({"grad_layout": GRAD_LAYOUTS} if caps.backward else {})}


def coverage_of(records) -> dict[str, dict[str, dict[str, int]]]:
    """Per backend, per axis, per value: examples the run exercised (from the records' ``axes``)."""
    coverage: dict[str, dict[str, dict[str, int]]] = {}
    for record in records:
        for axis, counts in (record.get("axes") or {}).items():
            tally = coverage.setdefault(record["backend"], {}).setdefault(axis, {})
            for value, n in counts.items():
                tally[value] = tally.get(value, 0) + n
    return coverage
