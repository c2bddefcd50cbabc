"""Metamorphic relations: properties of attention that need no oracle.

A relation takes an attention function ``f(args) -> Run`` and inputs, and returns pairs of tensors that
must be equal: ``(quantity, lhs, rhs)``. Two things break a relation for a correct kernel, and both
calibrate the tolerance (see :func:`check_relation`): the inputs a relation makes are rounded to the test
dtype (``k + shift``, ``v1 + v2``), which changes the exact answer itself, as the float64 oracle on those
same inputs measures; and each side's own rounding, as the low-precision reference's violation measures.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from .harness import Run
from .problem import AttentionArgs, default_scale, offsets
from .tolerance import FORWARD_FACTOR, Verdict, allowed_error, magnitude, max_error

AttentionFn = Callable[[AttentionArgs], Run]
Pairs = list[tuple[str, torch.Tensor, torch.Tensor]]


def _parts(t: torch.Tensor, lengths, dim: int = 0) -> list[torch.Tensor]:
    return list(torch.split(t, list(lengths), dim=dim))


def _rebuild(args: AttentionArgs, q_parts, k_parts, v_parts) -> AttentionArgs:
    """Packed args from per-sequence parts (q_parts is ignored for broadcast-Q)."""
    device, cu_dtype = args.cu_seqlens_k.device, args.cu_seqlens_k.dtype
    lens_k = [p.shape[0] for p in k_parts]
    new = args.replace(
        k=torch.cat(k_parts) if k_parts else args.k[:0],
        v=torch.cat(v_parts) if v_parts else args.v[:0],
        cu_seqlens_k=offsets(lens_k, cu_dtype).to(device),
        max_seqlen_k=max(lens_k, default=0),
    )
    if not args.broadcast_q:
        lens_q = [p.shape[0] for p in q_parts]
        new = new.replace(
            q=torch.cat(q_parts) if q_parts else args.q[:0],
            cu_seqlens_q=offsets(lens_q, cu_dtype).to(device),
            max_seqlen_q=max(lens_q, default=0),
        )
    return new


def _sequence_parts(args: AttentionArgs):
    q_parts = [] if args.broadcast_q else _parts(args.q, args.seqlens_q)
    return q_parts, _parts(args.k, args.seqlens_k), _parts(args.v, args.seqlens_k)


def _outputs(run: Run, seqlens_q) -> tuple[list, list | None]:
    outs = _parts(run.out, seqlens_q)
    lses = None if run.lse is None else _parts(run.lse, seqlens_q, dim=1)
    return outs, lses


def _pairs(whole: Run, out_parts, lse_parts) -> Pairs:
    pairs = [("out", whole.out, torch.cat(out_parts) if out_parts else whole.out[:0])]
    if whole.lse is not None and lse_parts is not None:
        pairs.append(("lse", whole.lse, torch.cat(lse_parts, dim=1) if lse_parts else whole.lse[:, :0]))
    return pairs


def sequence_permutation(f: AttentionFn, args: AttentionArgs, gen: torch.Generator) -> Pairs:
    """Reordering the sequences reorders the outputs and changes nothing else."""
    order = torch.randperm(args.batch, generator=gen).tolist()
    q_parts, k_parts, v_parts = _sequence_parts(args)
    permuted = _rebuild(args, [q_parts[i] for i in order] if q_parts else [], [k_parts[i] for i in order], [v_parts[i] for i in order])
    outs, lses = _outputs(f(args), args.seqlens_q)
    return _pairs(f(permuted), [outs[i] for i in order], None if lses is None else [lses[i] for i in order])


def empty_sequences_inserted(f: AttentionFn, args: AttentionArgs, gen: torch.Generator) -> Pairs:
    """Zero-length sequences inserted anywhere leave the other outputs unchanged; under broadcast-Q their
    query rows see no key, so they must be exactly 0 with LSE -inf."""
    q_parts, k_parts, v_parts = _sequence_parts(args)
    slots = sorted(torch.randint(0, args.batch + 1, (3,), generator=gen).tolist(), reverse=True)
    outs, lses = _outputs(f(args), args.seqlens_q)
    lq = args.q.shape[0] if args.broadcast_q else 0
    hq, dv = args.q.shape[1], args.v.shape[2]
    for s in slots:
        if not args.broadcast_q:
            q_parts.insert(s, args.q[:0])
        k_parts.insert(s, args.k[:0])
        v_parts.insert(s, args.v[:0])
        outs.insert(s, outs[0].new_zeros(lq, hq, dv) if outs else args.q.new_zeros(lq, hq, dv))
        if lses is not None:
            lses.insert(s, torch.full((hq, lq), float("-inf"), device=args.q.device))
    return _pairs(f(_rebuild(args, q_parts, k_parts, v_parts)), outs, lses)


def batch_split(f: AttentionFn, args: AttentionArgs, gen: torch.Generator) -> Pairs:
    """Running two halves of the batch separately and concatenating equals running it whole."""
    cut = int(torch.randint(0, args.batch + 1, (1,), generator=gen))
    q_parts, k_parts, v_parts = _sequence_parts(args)
    halves = []
    for sl in (slice(0, cut), slice(cut, None)):
        half = _rebuild(args, q_parts[sl] if q_parts else [], k_parts[sl], v_parts[sl])
        halves.append(f(half))
    lse = None if halves[0].lse is None else [h.lse for h in halves]
    return _pairs(f(args), [h.out for h in halves], lse)


def key_shift(f: AttentionFn, args: AttentionArgs, gen: torch.Generator) -> Pairs:
    """Adding one vector to every key of a sequence shifts each query's scores by a constant: softmax,
    hence the output, is unchanged (the LSE is not, so only ``out`` is compared)."""
    shifts = torch.randn(args.batch, *args.k.shape[1:], generator=gen).to(args.k.device, args.k.dtype)
    index = torch.repeat_interleave(torch.arange(args.batch, device=args.k.device), torch.tensor(args.seqlens_k, dtype=torch.long, device=args.k.device))
    shifted = args.replace(k=args.k + shifts[index])
    return [("out", f(shifted).out, f(args).out)]


def value_linearity(f: AttentionFn, args: AttentionArgs, gen: torch.Generator) -> Pairs:
    """The output is linear in V: attn(V1 + V2) = attn(V1) + attn(V2)."""
    v2 = torch.randn(args.v.shape, generator=gen).to(args.v.device, args.v.dtype)
    together = f(args.replace(v=args.v + v2)).out
    apart = f(args).out.float() + f(args.replace(v=v2)).out.float()
    return [("out", together.float(), apart)]


def scale_folded_into_queries(f: AttentionFn, args: AttentionArgs, gen: torch.Generator) -> Pairs:
    """Doubling the queries and halving the softmax scale leaves every score as it was (both factors are
    powers of two, exact in every dtype), so out and the LSE must not move. The second call comes after the
    first, with the same shapes: a kernel or plan cached by shapes alone, with the first call's scale baked
    in, answers it with the first call's scale."""
    first = f(args)
    folded = f(args.replace(q=args.q * 2, softmax_scale=args.softmax_scale / 2))
    pairs = [("out", folded.out, first.out)]
    if first.lse is not None:
        pairs.append(("lse", folded.lse, first.lse))
    return pairs


def not_applicable(name: str, capabilities) -> str | None:
    """Why relation ``name`` cannot hold for a backend with ``capabilities`` whatever problem is drawn, or
    None. Decided before drawing: a relation whose every example the backend would refuse costs a whole
    check's worth of calls otherwise."""
    if name == "empty_sequences_inserted" and not capabilities.zero_length:
        return "it inserts zero-length sequences, which the backend declares it does not take"
    return None


RELATIONS = {
    "sequence_permutation": sequence_permutation,
    "empty_sequences_inserted": empty_sequences_inserted,
    "batch_split": batch_split,
    "key_shift": key_shift,
    "value_linearity": value_linearity,
    "scale_folded_into_queries": scale_folded_into_queries,
}
# Relations whose own calls leave the run's kernel configurations: the folded call has a scale of its own,
# which a backend that compiles per scale value (flex bakes it into its kernel) compiles anew. They draw on the
# run's first configuration only, whose folded form the warm-up compiles too (folded_configs): one
# configuration more per backend, where drawing on every configuration would compile one more per
# configuration inside the checks.
ONE_CONFIGURATION = frozenset({"scale_folded_into_queries"})


def relation_configs(name: str, configs):
    """The run's configurations relation ``name`` draws on (``configs`` None: drawn freely, as every check
    then is)."""
    if configs is None or name not in ONE_CONFIGURATION:
        return configs
    return tuple(configs[:1])


def folded_configs(configs) -> tuple:
    """The kernel configurations the relations' own calls add to the run's ``configs`` (KernelConfig):
    the first one's with its scale halved (scale_folded_into_queries)."""
    if not configs:
        return ()
    first = configs[0]
    scale = default_scale(first.head_dim) if first.scale is None else first.scale
    return (dataclasses.replace(first, scale=scale / 2),)


def check_relation(relation, backend_fn: AttentionFn, reference_fn: AttentionFn, exact_fn: AttentionFn,
                   args: AttentionArgs, seed: int) -> list[Verdict]:
    """Verdicts for ``relation`` on the backend. The allowance is what the exact function breaks it by on the
    inputs the relation makes (``exact_fn``, the float64 oracle: rounding ``k + shift`` to bfloat16 alone
    can move an output by 10 of its ulps where values are far from 0) plus the tolerance rule on the
    low-precision reference's own violation (``reference_fn``)."""
    observed = relation(backend_fn, args, torch.Generator().manual_seed(seed))
    reference = relation(reference_fn, args, torch.Generator().manual_seed(seed))
    exact_runs: list[Run] = []

    def exact_recorded(a: AttentionArgs) -> Run:
        exact_runs.append(exact_fn(a))
        return exact_runs[-1]

    exact = relation(exact_recorded, args, torch.Generator().manual_seed(seed))
    # out's floor grows with the size its scores are rounded at: the largest |LSE| of any call the
    # relation makes, since a shifted key moves every score (tolerance.py)
    score_scale = max((magnitude(run.lse) for run in exact_runs if run.lse is not None), default=0.0)
    verdicts = []
    for (name, lhs, rhs), (_, ref_lhs, ref_rhs), (_, exact_lhs, exact_rhs) in zip(observed, reference, exact):
        ref_error = max_error(ref_lhs, ref_rhs)
        verdicts.append(
            Verdict(
                quantity=name,
                observed=max_error(lhs, rhs),
                allowed=max_error(exact_lhs, exact_rhs)
                + allowed_error(ref_error, args.q.dtype, magnitude(ref_lhs), FORWARD_FACTOR,
                                score_scale=score_scale if name == "out" else 0.0),
                reference_error=ref_error,
            )
        )
    return verdicts
