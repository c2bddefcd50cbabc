"""The ci profile exercises every value the spec declares on every axis, and every report says so."""
from __future__ import annotations

import json

from conformance.reference import Reference
from conformance import cli
from conformance.strategies import declared_values


def test_the_ci_profile_exercises_every_declared_value(tmp_path):
    argv = ["run", "--report-dir", str(tmp_path), "--name", "coverage", "-q", "-n", "2", "--backend", "reference"]
    assert cli.main(argv) == 0
    report = json.loads((tmp_path / "coverage" / "report.json").read_text())
    seen = report["coverage"]["reference"]
    as_text = declared_values(Reference.capabilities)
    assert set(as_text["values"]) == {"normal", "outliers", "scores_low", "scores_high"}
    assert as_text["offsets_dtype"] == ["int32", "int64"] and len(as_text["grad_layout"]) == 3
    missing = {axis: sorted(set(values) - set(seen.get(axis, {}))) for axis, values in as_text.items()}
    assert not {a: m for a, m in missing.items() if m}, missing
    # the kernel configurations checked are the warm-up's list, not one per example
    assert report["backends"]["reference"]["time"]["kernel_configs_checked"] <= 40
