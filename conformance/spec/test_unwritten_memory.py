"""Memory a backend must not read or write: q, k and v are handed over as slices of larger buffers whose
rows before and after are NaN (see :func:`conformance.poison.guarded`).

A kernel that reads past either end of an input (one key past the last sequence, say) gets NaN, which
then escapes into the output and fails the comparison with the oracle; a kernel that writes into its
inputs or past them changes the buffers, which must come back bit for bit as they went in. On CUDA the
allocator's free memory is poisoned too (here and in every other check, through the harness), so an
output row the kernel never writes is NaN as well.
"""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.harness import Run, checked_forward, ensure_supported, judge_forward
from conformance.poison import bitwise_equal, guarded, poison_free_memory
from conformance.problem import Problem, make_inputs
from conformance.strategies import problems
from conformance.tolerance import Verdict
from conformance.validation import validate_packed_inputs

from .support import supported

pytestmark = pytest.mark.spec


class StrayWrite(AssertionError):
    """The backend changed its inputs or the memory around them."""


def guarded_forward_verdicts(backend, problem: Problem, device) -> list[Verdict]:
    """Forward verdicts of ``backend`` on ``problem`` with NaN-guarded inputs; raises :class:`StrayWrite`
    when an input buffer comes back changed."""
    ensure_supported(backend, problem)
    args = make_inputs(problem, device)
    if args.broadcast_q and backend.capabilities.broadcast_q == "emulated":
        args = args.with_broadcast_q_expanded()
    validate_packed_inputs(
        args.q, args.k, args.v, args.cu_seqlens_q, args.cu_seqlens_k, args.max_seqlen_q, args.max_seqlen_k,
        broadcast_q=args.broadcast_q, softmax_scale=args.softmax_scale,
    )
    buffers, views = zip(*(guarded(t) for t in (args.q, args.k, args.v)))
    before = [b.clone() for b in buffers]
    poison_free_memory(device)
    output = checked_forward(backend, args.replace(q=views[0], k=views[1], v=views[2]))
    changed = [name for name, b, original in zip("qkv", buffers, before) if not bitwise_equal(b, original)]
    if changed:
        raise StrayWrite(
            f"{backend.name} wrote into {', '.join(changed)} or the memory around it (guard rows) on {problem!r}"
        )
    run = Run(output.out.detach(), None if output.lse is None else output.lse.detach())
    return judge_forward(problem, run)


@given(data=st.data())
def test_guarded_inputs(backend, device, check, configs, data):
    problem = data.draw(problems(backend.capabilities, configs=configs, min_batch=1), label="problem")
    with supported(check):
        verdicts = guarded_forward_verdicts(backend, problem, device)
    check.verify(problem, verdicts)
