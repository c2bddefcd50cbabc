"""Each spec check on one problem, as a function returning verdicts (raising ``Unsupported`` when the
backend cannot run it). The spec tests draw problems and call these; ``replay`` calls the same ones."""
from __future__ import annotations

import dataclasses

import torch

from .backend import Backend
from .harness import (
    Run,
    Unsupported,
    call_backend,
    compare_runs,
    ensure_supported,
    judge_forward,
    judge_gradients,
    oracle_call,
    run_backend,
)
from .problem import Problem, make_grad_out, make_inputs, problem_of_args
from .relations import RELATIONS, check_relation
from .tolerance import Verdict


def require_lse(backend: Backend, run: Run) -> None:
    """LSE checks need an LSE: declared-absent is unsupported; promised-but-missing is a contract failure."""
    if run.lse is None:
        if getattr(backend, "infers_capabilities", False) or not backend.capabilities.lse:
            raise Unsupported(f"{backend.name} returns no LSE")
        raise AssertionError(f"{backend.name} declares LSE support but returned none")


def forward(backend: Backend, problem: Problem, device) -> list[Verdict]:
    return judge_forward(problem, run_backend(backend, problem, device))[:1]


def lse(backend: Backend, problem: Problem, device) -> list[Verdict]:
    if not backend.capabilities.lse:
        raise Unsupported(f"{backend.name} declares no LSE")
    run = run_backend(backend, problem, device)
    require_lse(backend, run)
    return judge_forward(problem, run)[1:]


def gradients(backend: Backend, problem: Problem, device) -> list[Verdict]:
    return judge_gradients(problem, run_backend(backend, problem, device, gradients=True))


def everything(backend: Backend, problem: Problem, device) -> list[Verdict]:
    """Forward, LSE (when returned) and gradients (when declared) of one run: the edge-case check."""
    ensure_supported(backend, problem)
    with_gradients = backend.capabilities.backward
    run = run_backend(backend, problem, device, gradients=with_gradients)
    verdicts = judge_forward(problem, run)
    return verdicts + (judge_gradients(problem, run) if with_gradients else [])


def _rotated(lengths: tuple) -> tuple:
    """The sequences one place on (the last first): the same batch and totals in another order."""
    return lengths[-1:] + lengths[:-1]


def offsets_rewritten(backend: Backend, problem: Problem, device) -> list[Verdict]:
    """Three forward calls whose offsets are the same tensor objects: ``problem``'s; then the offsets of its
    sequences one place on (the same shapes and totals), written into those tensors in place (``copy_``, which
    advances their version counters); then the first offsets again, the tensors rebound to new storage
    (``.data =``, which leaves the version counters as they were). Each call is judged against the oracle:
    a plan or kernel kept by the offsets tensors' identity (or identity and version) answers a later call
    with an earlier call's sequences."""
    ensure_supported(backend, problem)
    other = problem.replace(seqlens_q=_rotated(problem.seqlens_q), seqlens_k=_rotated(problem.seqlens_k))
    ensure_supported(backend, other)
    args = make_inputs(problem, device)
    cu_q, cu_k = args.cu_seqlens_q, args.cu_seqlens_k
    verdicts = judge_forward(problem, call_backend(backend, args))
    moved = make_inputs(other, device)
    with torch.no_grad():
        cu_q.copy_(moved.cu_seqlens_q)
        cu_k.copy_(moved.cu_seqlens_k)
    run = call_backend(backend, moved.replace(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k))
    verdicts += _labelled(judge_forward(other, run), "offsets written in place")
    again = make_inputs(problem, device)
    cu_q.data, cu_k.data = again.cu_seqlens_q, again.cu_seqlens_k
    run = call_backend(backend, again.replace(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k))
    return verdicts + _labelled(judge_forward(problem, run), "offsets rebound")


def _labelled(verdicts: list[Verdict], stage: str) -> list[Verdict]:
    return [dataclasses.replace(v, quantity=f"{v.quantity} ({stage})") for v in verdicts]


def _on(device, run: Run) -> Run:
    return Run(*(None if t is None else t.to(device) for t in (run.out, run.lse, run.dq, run.dk, run.dv)))


def _call_if_supported(backend: Backend, args) -> Run:
    """A relation's derived call (e.g. one half of a split batch) may leave what the backend declares:
    then the relation does not apply to this draw, which is reported as unsupported, not as a failure."""
    ensure_supported(backend, problem_of_args(args))
    return call_backend(backend, args)


def relation(backend: Backend, problem: Problem, device, name: str) -> list[Verdict]:
    """Metamorphic relation ``name`` on the backend, calibrated by the low-precision reference."""
    if name not in RELATIONS:
        raise ValueError(f"unknown relation {name!r}; known: {', '.join(RELATIONS)}")
    ensure_supported(backend, problem)
    return check_relation(
        RELATIONS[name],
        lambda args: _call_if_supported(backend, args),
        lambda args: _on(device, oracle_call(args, problem.torch_dtype)),
        lambda args: _on(device, oracle_call(args, torch.float64)),
        make_inputs(problem, device),
        problem.seed,
    )


def broadcast_native(backend: Backend, problem: Problem, device) -> list[Verdict]:
    """A native broadcast-Q path must equal the same call with q replicated per sequence, dQ summed."""
    if backend.capabilities.broadcast_q != "native":
        raise Unsupported(f"{backend.name} has no native broadcast-Q path")
    ensure_supported(backend, problem)
    args = make_inputs(problem, device)
    grad_out = make_grad_out(problem, device) if backend.capabilities.backward else None
    native = call_backend(backend, args, grad_out)
    replicated = call_backend(backend, args.with_broadcast_q_expanded(), grad_out)
    verdicts = [compare_runs(problem, "out", native.out, replicated.out)]
    if native.lse is not None:
        verdicts.append(compare_runs(problem, "lse", native.lse, replicated.lse))
    if grad_out is not None:
        summed_dq = replicated.dq.float().view(problem.batch, *native.dq.shape).sum(0)
        verdicts.append(compare_runs(problem, "dq", native.dq, summed_dq))
        verdicts += [compare_runs(problem, n, getattr(native, n), getattr(replicated, n)) for n in ("dk", "dv")]
    return verdicts
