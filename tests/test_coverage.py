"""The ci profile exercises every value the spec declares on every axis, and every report says so."""
from __future__ import annotations

import json

from conformance.reference import Reference
from conformance import cli
from conformance.configs import axis_values, tensor_axis_values
from conformance.strategies import LENGTH_LAWS


def test_the_ci_profile_exercises_every_declared_value(tmp_path):
    argv = ["run", "--report-dir", str(tmp_path), "--name", "coverage", "-q", "-n", "2", "--backend", "reference"]
    assert cli.main(argv) == 0
    report = json.loads((tmp_path / "coverage" / "report.json").read_text())
    seen = report["coverage"]["reference"]
    declared = axis_values(Reference.capabilities)
    as_text = {
        "dtype": declared["dtype"], "head_dim": [str(d) for d in declared["head_dim"]],
        "head_dim_v": declared["head_dim_v"], "heads": [f"{q}:{k}" for q, k in declared["heads"]],
        "causal": declared["causal"], "broadcast_q": ["false", "true"],
        "scale": ["default" if s is None else f"{s:g}" for s in declared["scale"]],
        "length_law": list(LENGTH_LAWS), "zero_length": ["false", "true"], "cross_attention": ["false", "true"],
        "batch": ["0", "1", "2-4", "5-8"], "offsets_dtype": declared["offsets_dtype"],
        **tensor_axis_values(Reference.capabilities),
    }
    assert set(as_text["values"]) == {"normal", "outliers", "scores_low", "scores_high"}
    missing = {axis: sorted(set(values) - set(seen.get(axis, {}))) for axis, values in as_text.items()}
    assert not {a: m for a, m in missing.items() if m}, missing
    # the kernel configurations checked are the warm-up's list, not one per example
    assert report["backends"]["reference"]["time"]["kernel_configs_checked"] <= 40
