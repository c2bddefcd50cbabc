"""Properties that need no oracle: the backend against itself under transformations of the batch."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.harness import Run, call_backend, compare_runs, ensure_supported, oracle_call
from conformance.problem import make_grad_out, make_inputs
from conformance.relations import RELATIONS, check_relation
from conformance.strategies import problems

from .support import require, supported

pytestmark = pytest.mark.spec


def _on(device, run: Run) -> Run:
    return Run(*(None if t is None else t.to(device) for t in (run.out, run.lse, run.dq, run.dk, run.dv)))


@pytest.mark.parametrize("relation", list(RELATIONS))
@given(data=st.data())
def test_metamorphic(backend, device, check, relation, data):
    problem = data.draw(problems(backend.capabilities, min_batch=1), label="problem")
    with supported(check):
        ensure_supported(backend, problem)
        verdicts = check_relation(
            RELATIONS[relation],
            lambda args: call_backend(backend, args),
            lambda args: _on(device, oracle_call(args, problem.torch_dtype)),
            make_inputs(problem, device),
            problem.seed,
        )
    check.verify(problem, verdicts)


@given(data=st.data())
def test_broadcast_q_native_matches_replicated(backend, device, check, data):
    """A native broadcast-Q path must equal the same call with q replicated per sequence, dQ summed."""
    require(backend.capabilities.broadcast_q == "native", f"{backend.name} has no native broadcast-Q path")
    problem = data.draw(problems(backend.capabilities, broadcast_q=True, min_batch=1), label="problem")
    args = make_inputs(problem, device)
    grad_out = make_grad_out(problem, device) if backend.capabilities.backward else None
    with supported(check):
        ensure_supported(backend, problem)
        native = call_backend(backend, args, grad_out)
        replicated = call_backend(backend, args.with_broadcast_q_expanded(), grad_out)
    verdicts = [compare_runs(problem, "out", native.out, replicated.out)]
    if native.lse is not None:
        verdicts.append(compare_runs(problem, "lse", native.lse, replicated.lse))
    if grad_out is not None:
        summed_dq = replicated.dq.float().view(problem.batch, *native.dq.shape).sum(0)
        verdicts.append(compare_runs(problem, "dq", native.dq, summed_dq))
        verdicts += [compare_runs(problem, n, getattr(native, n), getattr(replicated, n)) for n in ("dk", "dv")]
    check.verify(problem, verdicts)
