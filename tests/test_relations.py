"""The metamorphic relations' calibration: a correct backend passes where rounding the inputs a relation
makes moves the exact answer, and a backend that breaks a relation by more than that still fails."""
from __future__ import annotations

import pytest
import torch

from conformance import checks
from conformance.configs import KernelConfig
from conformance.mutants import ScaleKeyedOnShapes, Unmutated
from conformance.problem import Output, Problem, default_scale
from conformance.reference import Reference
from conformance.relations import folded_configs, relation_configs

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


@pytest.mark.parametrize("relation", ["key_shift", "value_linearity", "batch_split", "sequence_permutation",
                                      "scale_folded_into_queries"])
def test_a_backend_that_breaks_a_relation_by_more_than_rounding_fails(relation):
    problem = Problem(seqlens_q=(5, 9, 3), seqlens_k=(7, 9, 12), heads_q=2, heads_kv=2, head_dim=16,
                      dtype="bfloat16")
    assert all(v.ok for v in checks.relation(Reference(), problem, "cpu", relation))
    verdicts = checks.relation(Noisy(0.5), problem, "cpu", relation)
    assert not verdicts[0].ok, verdicts[0]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_the_folded_scale_catches_a_kernel_cached_by_shapes_alone(dtype):
    # the second call of the relation has the first one's shapes and half its scale: a kernel that kept the
    # first scale answers with scores twice too large; a correct one gives the same scores (exactly)
    problem = Problem(seqlens_q=(5, 9, 3), seqlens_k=(7, 9, 12), heads_q=4, heads_kv=2, head_dim=16, dtype=dtype,
                      causal="bottom_right")
    assert all(v.ok for v in checks.relation(Unmutated(), problem, "cpu", "scale_folded_into_queries"))
    verdicts = checks.relation(ScaleKeyedOnShapes(), problem, "cpu", "scale_folded_into_queries")
    assert [v.quantity for v in verdicts] == ["out", "lse"] and not any(v.ok for v in verdicts), verdicts
    # and the same mutant passes a check whose calls all have one scale (the bug needs the second scale)
    assert all(v.ok for v in checks.relation(ScaleKeyedOnShapes(), problem, "cpu", "batch_split"))


def test_the_folded_relation_draws_on_the_first_configuration_which_the_warm_up_also_folds():
    configs = (KernelConfig("bfloat16", 64, None, 2, 1, "none", False, None),
               KernelConfig("float16", 32, None, 1, 1, "bottom_right", False, 0.3))
    assert relation_configs("scale_folded_into_queries", configs) == configs[:1]
    assert relation_configs("key_shift", configs) == configs
    assert relation_configs("scale_folded_into_queries", None) is None  # free drawing: every check draws freely
    (folded,) = folded_configs(configs)
    assert folded.scale == default_scale(64) / 2 and folded.key == configs[0].key + f" s{default_scale(64) / 2:g}"
    assert folded_configs(configs[1:])[0].scale == 0.15 and folded_configs(()) == ()


def test_the_warm_up_calls_the_configurations_the_checks_call_and_the_folded_one():
    from conformance import registry
    from conformance.plugin import configs_for
    from conformance.warmup import warm_configs
    backend = registry.resolve("sdpa")
    run = configs_for(backend, 0)
    warm = warm_configs(backend, 0)
    assert warm == run + folded_configs(run)
    in_float16 = warm_configs(backend, 0, dtypes=("float16",))
    assert {c.dtype for c in in_float16} == {"float16"}
    assert in_float16[-1] == folded_configs(in_float16[:-1])[0]
