"""Checks that call a backend on inputs of their own making (a relation's split batch, guarded buffers)
hold those calls to what the backend declares: a declared refusal is unsupported, never a failure."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings

from conformance.reference import Reference
from conformance import checks
from conformance.harness import Unsupported
from conformance.problem import Problem
from conformance.relations import RELATIONS, not_applicable
from conformance.strategies import problems
from conformance.spec.test_unwritten_memory import guarded_forward_verdicts


class NoEmptyBatch(Reference):
    """Declares, like varlen_attn, that a batch of zero sequences is not supported, and fails on one."""
    name = "no-empty-batch"

    def not_supported_reasons(self, problem):
        return super().not_supported_reasons(problem) + (["an empty batch is not supported"] if problem.batch == 0 else [])

    def forward(self, args):
        if len(args.seqlens_q) == 0:
            raise RuntimeError("batch size must be positive")
        return super().forward(args)


class RefusesBroadcast(Reference):
    """Refuses at call time (as SDPA's kernel dispatcher does), with NotImplementedError."""
    name = "refuses-broadcast"

    def forward(self, args):
        if args.broadcast_q:
            raise NotImplementedError("this kernel refused the call")
        return super().forward(args)


def test_a_relation_whose_derived_call_is_declared_unsupported_is_unsupported():
    # one sequence: splitting it in two always leaves one half with no sequence at all
    problem = Problem((5,), (7,), dtype="float16")
    with pytest.raises(Unsupported, match="empty batch"):
        checks.relation(NoEmptyBatch(), problem, "cpu", "batch_split")
    assert all(v.ok for v in checks.relation(Reference(), problem, "cpu", "batch_split"))


def test_a_call_time_refusal_in_the_guarded_check_is_unsupported():
    problem = Problem((4,), (1,), dtype="float16", broadcast_q=True)
    with pytest.raises(Unsupported, match="refused"):
        guarded_forward_verdicts(RefusesBroadcast(), problem, "cpu")
    assert all(v.ok for v in guarded_forward_verdicts(RefusesBroadcast(), Problem((4,), (1,), dtype="float16"), "cpu"))


class NoZeroLength(Reference):
    """Declares, like the nested-tensor SDPA, that it takes no sequence of length 0."""
    name = "no-zero-length"
    capabilities = dataclasses.replace(Reference.capabilities, zero_length=False)


@settings(max_examples=15, deadline=None)
@given(problem=problems(NoZeroLength.capabilities, min_batch=1, dtype="float32"))
def test_a_relation_no_drawn_problem_can_run_is_skipped_before_drawing(problem):
    # the relation inserts empty sequences: every example would be refused after a wasted call, so the
    # spec skips the check up front; the declaration must be exactly that
    reason = not_applicable("empty_sequences_inserted", NoZeroLength.capabilities)
    assert reason and "zero-length" in reason
    with pytest.raises(Unsupported, match="zero-length"):
        checks.relation(NoZeroLength(), problem, "cpu", "empty_sequences_inserted")
    assert all(not_applicable(name, Reference.capabilities) is None for name in RELATIONS)
    assert all(not_applicable(name, NoZeroLength.capabilities) is None for name in RELATIONS
               if name != "empty_sequences_inserted")


class RunsOutOfMemory(Reference):
    """Runs out of memory on its first ``failures`` calls, the way a kernel does on a GPU a neighbour fills."""
    name = "runs-out-of-memory"

    def __init__(self, failures):
        self.failures, self.calls = failures, 0

    def forward(self, args):
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("Triton Error [CUDA]: out of memory")
        return super().forward(args)


def test_a_call_that_runs_out_of_memory_is_tried_again_then_reported_as_such(monkeypatch):
    from conformance import harness
    monkeypatch.setattr(harness, "OOM_PAUSES_S", (0.0, 0.0))
    problem = Problem((5, 3), (7, 4), dtype="float32")
    transient = RunsOutOfMemory(failures=2)
    run = harness.run_backend(transient, problem, "cpu", gradients=True)
    assert transient.calls == 3 and run.dq is not None  # the third attempt ran, and is what is judged
    assert all(v.ok for v in harness.judge_forward(problem, run) + harness.judge_gradients(problem, run))
    lasting = RunsOutOfMemory(failures=99)
    with pytest.raises(harness.OutOfMemory, match=r"RuntimeError: Triton Error \[CUDA\]: out of memory "
                                                   r"\[out of memory in each of 3 attempts"):
        harness.run_backend(lasting, problem, "cpu")
    assert lasting.calls == 3
    other = RunsOutOfMemory(failures=0)
    other.forward = lambda args: (_ for _ in ()).throw(ValueError("bad head dim"))
    with pytest.raises(ValueError, match="bad head dim"):  # anything else is not retried
        harness.run_backend(other, problem, "cpu")
