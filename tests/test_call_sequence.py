"""The check whose calls share offsets tensors (checks.offsets_rewritten): a correct backend passes each
stage, and a backend that keeps what it read from the offsets under their identity fails at the stage its
key misses."""
from __future__ import annotations

import pytest

from conformance import checks, registry
from conformance.mutants import OffsetsPlanKeyedOnIdentity, Unmutated
from conformance.problem import Problem

PROBLEMS = [
    Problem((5, 9, 3), (7, 9, 12), heads_q=2, heads_kv=1, head_dim=16, dtype="float32", causal="bottom_right"),
    Problem((4, 0, 6), (4, 3, 6), head_dim=16, dtype="float16", offsets_dtype="int64", offsets_layout="strided"),
    Problem((5, 5, 5), (3, 8, 1), head_dim=16, dtype="float32", broadcast_q=True),
]
STAGES = ("", " (offsets written in place)", " (offsets rebound)")


class IdentityOnly(OffsetsPlanKeyedOnIdentity):
    """Offsets read once and kept under the tensors' identity alone (no version counter)."""
    name = "mutant-identity-only"

    def plan_key(self, cu_q, cu_k) -> tuple:
        return (id(cu_q), id(cu_k))


def _failed(verdicts) -> set[str]:
    return {v.quantity for v in verdicts if not v.ok}


@pytest.mark.parametrize("problem", PROBLEMS, ids=["causal-gqa", "int64-strided", "broadcast-q"])
def test_a_correct_backend_passes_every_stage(problem):
    verdicts = checks.offsets_rewritten(Unmutated(), problem, "cpu")
    assert [v.quantity for v in verdicts] == [q + s for s in STAGES for q in ("out", "lse")]
    assert not _failed(verdicts), verdicts


@pytest.mark.parametrize("problem", PROBLEMS[:2], ids=["causal-gqa", "int64-strided"])
def test_each_cache_key_fails_at_the_stage_it_misses(problem):
    # identity alone misses the in-place write (and, keyed on the first call, the rebind stage happens to
    # read the right offsets again); identity and version miss only the rebind
    assert _failed(checks.offsets_rewritten(IdentityOnly(), problem, "cpu")) == {"out (offsets written in place)",
                                                                                  "lse (offsets written in place)"}
    assert _failed(checks.offsets_rewritten(OffsetsPlanKeyedOnIdentity(), problem, "cpu")) == {
        "out (offsets rebound)", "lse (offsets rebound)"}


def test_the_project_kernel_reads_offsets_rewritten_between_plain_calls():
    # triton-jfa keeps a plain call's tile lists under its offsets tensors (kernels/reuse.py): identity,
    # storage address and version, so both later stages rebuild them
    backend = registry.resolve("triton-jfa")
    problem = PROBLEMS[0].replace(dtype="float16")
    assert not backend.not_supported_reasons(problem)
    verdicts = checks.offsets_rewritten(backend, problem, "cpu")
    assert len(verdicts) == 6 and not _failed(verdicts), verdicts
