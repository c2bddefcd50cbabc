"""The determinism check: bitwise comparison of repeated runs, the run count, and what happens to
backends that do and do not declare determinism."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conformance import mutants
from conformance.problem import Problem
from conformance.spec import test_determinism as determinism

ROOT = Path(__file__).resolve().parents[1]
MULTI_BLOCK = Problem((40, 9), (40, 17), heads_q=2, heads_kv=1, head_dim=16)


def test_run_count_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(determinism.RUNS_VARIABLE, raising=False)
    assert determinism.determinism_runs() == determinism.DEFAULT_RUNS == 3
    monkeypatch.setenv(determinism.RUNS_VARIABLE, "7")
    assert determinism.determinism_runs() == 7
    for bad in ("1", "zero", "2.5"):
        monkeypatch.setenv(determinism.RUNS_VARIABLE, bad)
        with pytest.raises(ValueError, match=determinism.RUNS_VARIABLE):
            determinism.determinism_runs()


def test_comparison_is_bitwise():
    zeros = torch.zeros(4)
    assert determinism.differing_elements(zeros, -zeros) == 4  # equal as numbers, not as bits
    nan = torch.full((3,), float("nan"))
    assert determinism.differing_elements(nan, nan.clone()) == 0
    bumped = torch.ones(5, dtype=torch.float16)
    bumped.view(torch.int16)[2] += 1  # the next float16 after 1.0
    assert determinism.differing_elements(torch.ones(5, dtype=torch.float16), bumped) == 1


def test_nondeterministic_dq_is_seen_and_only_in_dq():
    differences = determinism.repeated_runs(mutants.NondeterministicDq(), MULTI_BLOCK, "cpu", runs=4)
    assert differences["dq"][0] > 0 and 0 < differences["dq"][1] < 1e-5
    assert all(differences[q][0] == 0 for q in ("out", "lse", "dk", "dv"))


def test_deterministic_backend_is_identical():
    differences = determinism.repeated_runs(mutants.Unmutated(), MULTI_BLOCK, "cpu", runs=3)
    assert set(differences) == {"out", "lse", "dq", "dk", "dv"}
    assert all(n == 0 for n, _ in differences.values())


HONEST = textwrap.dedent(
    """
    import dataclasses
    from conformance.mutants import NondeterministicDq

    class Honest(NondeterministicDq):
        name = "honest-nondeterministic"
        capabilities = dataclasses.replace(NondeterministicDq.capabilities, deterministic=False)
    """
)


def test_undeclared_nondeterminism_is_reported_not_failed(tmp_path):
    """The same nondeterministic computation: skipped with the difference when undeclared, failed when
    it declares deterministic=True."""
    (tmp_path / "honest.py").write_text(HONEST)
    command = [sys.executable, "-m", "pytest", str(ROOT / "conformance" / "spec" / "test_determinism.py"), "-rs", "-v",
               "-p", "no:cacheprovider", "-p", "conformance.plugin", "--max-examples", "4",
               # the examples of ci, without shrinking the failure (a shrink only makes it smaller)
               "-p", "conformance.selftest", "--hypothesis-profile", "ci-noshrink",
               "--backend", f"{tmp_path / 'honest.py'}:Honest", "--backend", "conformance.mutants:NondeterministicDq"]
    env = dict(os.environ, **{determinism.RUNS_VARIABLE: "2"})
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert "test_determinism[honest-nondeterministic] SKIPPED" in out, out[-3000:]
    assert re.search(r"not declared deterministic: over [1-9]\d* problems x 2 runs, the largest difference was [1-9]", out)
    assert "test_determinism[mutant-nondeterministic-dq] FAILED" in out
    assert "declares deterministic=True but its results vary over 2 identical runs" in out
