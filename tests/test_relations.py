"""The metamorphic relations' calibration: a correct backend passes where rounding the inputs a relation
makes moves the exact answer, and a backend that breaks a relation by more than that still fails."""
from __future__ import annotations

import pytest
import torch

from conformance import checks
from conformance.problem import Output, Problem
from conformance.reference import Reference

# Found by the dev profile on an H100 against triton-jfa: k + shift rounded to bfloat16 moves this output by
# 0.157 in exact arithmetic, while the low-precision reference happens to break the relation by 0.0078 only.
SHIFT_MOVES_THE_ANSWER = Problem(
    seqlens_q=(0, 0, 1, 1, 1, 1, 0), seqlens_k=(0, 0, 0, 93, 192, 100, 192), heads_q=2, heads_kv=2,
    head_dim=16, dtype="bfloat16", causal="bottom_right", scale=1.0, length_law="decode",
    offsets_dtype="int64", values="outliers",
)


class Noisy(Reference):
    """The oracle's answer plus noise of a fixed size, different on every call: breaks every relation."""
    name = "noisy"

    def __init__(self, size: float):
        self.size, self.calls = size, 0

    def forward(self, args):
        output = super().forward(args)
        self.calls += 1
        gen = torch.Generator().manual_seed(self.calls)
        noise = self.size * torch.rand(output.out.shape, generator=gen).to(output.out.device)
        return Output((output.out.float() + noise).to(output.out.dtype), output.lse)


def test_a_correct_backend_passes_where_the_shifted_keys_rounding_moves_the_answer():
    (verdict,) = checks.relation(Reference(), SHIFT_MOVES_THE_ANSWER, "cpu", "key_shift")
    assert verdict.observed > 0.1  # the exact function moved, far beyond the low-precision reference's 0.0078
    assert verdict.ok, verdict
    # without the exact violation in the allowance the rule alone would have failed the oracle itself
    assert verdict.observed > verdict.allowed - verdict.observed


@pytest.mark.parametrize("relation", ["key_shift", "value_linearity", "batch_split", "sequence_permutation"])
def test_a_backend_that_breaks_a_relation_by_more_than_rounding_fails(relation):
    problem = Problem(seqlens_q=(5, 9, 3), seqlens_k=(7, 9, 12), heads_q=2, heads_kv=2, head_dim=16,
                      dtype="bfloat16")
    assert all(v.ok for v in checks.relation(Reference(), problem, "cpu", relation))
    verdicts = checks.relation(Noisy(0.5), problem, "cpu", relation)
    assert not verdicts[0].ok, verdicts[0]
