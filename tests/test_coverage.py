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


def test_every_kernel_configuration_gets_a_verdict_of_its_own(tmp_path):
    """A backend wrong at one head dim that no edge case uses (96) fails the per-configuration check, whatever
    the drawn checks happened to meet."""
    module = tmp_path / "one_config.py"
    module.write_text(
        "from conformance.mutants import Unmutated\n\n\n"
        "class WrongAtHeadDim96(Unmutated):\n"
        "    name = 'wrong-at-head-dim-96'\n\n"
        "    def scale(self, args):\n"
        "        return args.softmax_scale * (2.0 if args.q.shape[2] == 96 else 1.0)\n")
    argv = ["run", "--report-dir", str(tmp_path), "--name", "one", "-q", "-n", "1", "-k", "test_kernel_configs",
            "--backend", f"{module}:WrongAtHeadDim96", "--backend", "reference"]
    assert cli.main(argv) == 1
    records = {r["backend"]: r for r in json.loads((tmp_path / "one" / "report.json").read_text())["records"]}
    assert records["reference"]["outcome"] == "pass" and records["reference"]["examples"] >= 4
    failed = records["wrong-at-head-dim-96"]
    assert failed["outcome"] == "fail" and failed["problem"]["head_dim"] == 96
