"""The public entry points: ``jagged_flash_attention`` and ``JaggedPlan``, their autograd Function, and the
switch to the custom operators inside torch.compile (torch_ops.py)."""
from __future__ import annotations

from typing import Optional

import torch

from . import launch
from .config import Config
from .plan import backward_lists, default_config, kernel_layout, prepare
from .schedule import TileList
from .validation import max_seqlen


class _JaggedFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, plan):
        out, lse = launch.forward(q, k, v, cu_q, cu_k, plan)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.plan = plan  # the backward runs what the forward planned
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = launch.backward(do, q, k, v, out, lse, cu_q, cu_k, ctx.plan)
        return dq, dk, dv, None, None, None


def _compiled_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                   broadcast_q, config: Optional[Config]):
    """A call inside torch.compile: the host side (validation, paths, launching the schedule's builders) is
    Python dynamo should not trace, so the graph gets one opaque custom operator that runs it when the
    graph runs (torch_ops.py), with the Config as a string; no Config is "" (the environment's, read when
    the operator runs: dynamo cannot trace reading it)."""
    scale = None if softmax_scale is None else float(softmax_scale)
    text = "" if config is None else str(default_config(config))
    return torch.ops.jfa_conformance.jagged_attention_forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen("max_seqlen_q", max_seqlen_q),
        max_seqlen("max_seqlen_k", max_seqlen_k), bool(causal), scale, bool(broadcast_q), text)


def jagged_flash_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                           softmax_scale=None, broadcast_q=False, deterministic=False, config=None):
    """Jagged (packed varlen) flash attention.  Returns ``(out, lse)``; differentiable in q, k, v.

    q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv] (Hq a multiple of Hkv: GQA), offsets
    ``cu_seqlens_*`` int32 / int64 [B + 1] on q's device.  ``causal``: bottom-right aligned.  ``broadcast_q``:
    q is one dense [Lq, Hq, D] block shared by all B K/V sequences (``cu_seqlens_q == [0, Lq]``).
    out: [total_q, Hq, Dv] (broadcast-Q: [B*Lq, Hq, Dv], batch-major); lse: float32 [Hq, rows], natural log,
    -inf for rows with no visible key.  Every gradient is bitwise reproducible, so ``deterministic`` has
    nothing to switch.  ``config``: a kernels.Config, by default the environment's (config.py).

    The call does not wait for the GPU: the tile lists are built on the device from the offsets where they
    are (schedule.py).  So the offsets' values are not checked unless they are on the CPU or
    ``Config.check_offsets`` is on; a JaggedPlan checks them once.  A later call with the same offsets
    tensors, unwritten since by PyTorch (their version counters), on the same stream, reuses the lists
    (reuse.py); offsets written in place by other means (a custom kernel) need ``Config(reuse_lists=False)``.
    """
    if torch.compiler.is_compiling():
        return _compiled_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                              broadcast_q, config)
    return _JaggedFlashAttention.apply(*prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                                softmax_scale, broadcast_q, default_config(config), reuse_lists=True))


class JaggedPlan:
    """One jagged layout, planned once and run many times (for example by every attention layer of a step).

    A plain ``jagged_flash_attention`` call builds its tile lists on the device at every call (a few small
    launches) and does not check the offsets' values.  A plan checks them on the host once, keeps its own
    copy of them (so later writes to the caller's offset tensors cannot reach a planned launch) and of the
    forward and backward tile lists, with launches sized exactly to the work.  Calling it launches only the
    attention kernels::

        plan = JaggedPlan(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=True)
        out, lse = plan(q, k, v)        # same answers, bit for bit, as jagged_flash_attention(...)
        plan.paths                      # which kernels run (plan.Paths)

    A call takes q, k, v of the planned shapes, dtypes, devices and strides (any values); anything else is a
    ValueError naming the field.  Inside torch.compile a call is a plain call with the plan's own offsets
    and Config (torch_ops.py).
    """

    def __init__(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                 softmax_scale=None, broadcast_q=False, deterministic=False, config=None):
        # checked on the host once; the offsets the kernels read are the plan's own (clamped) copies, so later
        # writes to the caller's offset tensors cannot reach a planned launch
        *_, cu_q, cu_k, plan = prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                       softmax_scale, broadcast_q, default_config(config), check_offsets=True)
        plan.schedule.update(backward_lists(plan, q.shape, k.shape, q.device))
        # the item counts read back once, so that every launch is exactly as large as its work
        for name, entry in plan.schedule.items():
            if isinstance(entry, TileList):
                plan.schedule[name] = entry.known()
        fwd_gluon, fwd_tl = (plan.schedule[name] for name in ("fwd_gluon", "fwd"))
        ran = [name for name, t in (("gluon", fwd_gluon), ("tl", fwd_tl)) if t is not None and t.n_items > 0]
        plan = plan._replace(paths=plan.paths._replace(forward="+".join(ran) or "tl"))  # (no rows: "tl")
        self._cu_q, self._cu_k, self._plan = cu_q, cu_k, plan
        self._layout = tuple(self._layout_of(name, t) for name, t in zip("qkv", (q, k, v)))

    @property
    def paths(self):
        """The kernels a call runs (plan.Paths: forward, dK/dV, dQ, where delta comes from)."""
        return self._plan.paths

    @property
    def config(self) -> Config:
        return self._plan.config

    @staticmethod
    def _layout_of(name, t):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor")
        return (("shape", tuple(t.shape)), ("dtype", t.dtype), ("device", t.device), ("stride", t.stride()),
                ("data_ptr % 16", t.data_ptr() % 16))

    def __call__(self, q, k, v):
        p = self._plan
        if torch.compiler.is_compiling():  # a plain call with the plan's own offsets (torch_ops.py)
            return _compiled_call(q, k, v, self._cu_q, self._cu_k, None, None, p.causal, p.scale, p.broadcast,
                                  p.config)
        for name, t, planned in zip("qkv", (q, k, v), self._layout):
            for (field, want), (_, got) in zip(planned, self._layout_of(name, t)):
                if got != want:
                    raise ValueError(f"{name}.{field} is {got}, but the plan was made for {want}")
        q, k, v = (kernel_layout(t) for t in (q, k, v))  # as prepare did
        return _JaggedFlashAttention.apply(q, k, v, self._cu_q, self._cu_k, p)
