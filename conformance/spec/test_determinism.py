"""Determinism: a backend that declares ``deterministic=True`` must return bitwise-identical forward and
backward results when the same call is repeated.

The number of runs compared per drawn problem is ``JFA_DETERMINISM_RUNS`` (environment, default 3,
at least 2). A backend that does not declare determinism gets the same measurement reported as a skip
that names the largest difference seen; it is never failed for it.
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.harness import Run, run_backend
from conformance.problem import Problem
from conformance.strategies import problems
from conformance.tolerance import max_error

from .support import supported

pytestmark = pytest.mark.spec

RUNS_VARIABLE = "JFA_DETERMINISM_RUNS"
DEFAULT_RUNS = 3
QUANTITIES = ("out", "lse", "dq", "dk", "dv")
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def determinism_runs() -> int:
    raw = os.environ.get(RUNS_VARIABLE, str(DEFAULT_RUNS))
    try:
        runs = int(raw)
    except ValueError:
        raise ValueError(f"{RUNS_VARIABLE} must be an integer >= 2, got {raw!r}") from None
    if runs < 2:
        raise ValueError(f"{RUNS_VARIABLE} must be an integer >= 2, got {runs}")
    return runs


def differing_elements(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bit patterns differ (so -0.0 vs 0.0 and two different NaNs count)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return max(a.numel(), b.numel(), 1)
    a, b = a.detach().contiguous().cpu(), b.detach().contiguous().cpu()
    view = _INT_VIEW[a.element_size()]
    return int((a.view(view) != b.view(view)).sum())


def run_differences(runs: list[Run]) -> dict[str, tuple[int, float]]:
    """Per quantity: (elements that differ bitwise from the first run, largest absolute difference)."""
    found = {}
    for quantity in QUANTITIES:
        first = getattr(runs[0], quantity)
        if first is None:
            continue
        others = [getattr(r, quantity) for r in runs[1:]]
        found[quantity] = (
            max(differing_elements(first, t) for t in others),
            max(max_error(t, first) for t in others),
        )
    return found


def repeated_runs(backend, problem: Problem, device, runs: int) -> dict[str, tuple[int, float]]:
    """Run ``problem`` ``runs`` times (with gradients when the backend has a backward) and compare."""
    gradients = backend.capabilities.backward
    return run_differences([run_backend(backend, problem, device, gradients=gradients) for _ in range(runs)])


def describe(problem: Problem, differences: dict[str, tuple[int, float]], runs: int) -> str:
    varying = [f"{q}: {n} elements differ, max difference {d:.3e}" for q, (n, d) in differences.items() if n]
    return f"results vary over {runs} identical runs on {problem!r}\n  " + "\n  ".join(varying)


def test_determinism(backend, device, check, configs):
    runs = determinism_runs()
    declared = backend.capabilities.deterministic
    largest = {"difference": 0.0, "problem": None}  # over all examples, for the report of an undeclared backend

    # A run-dependent reduction order changes the last bits of a sum: float32 outputs keep the most of
    # them (a float16 or bfloat16 cast rounds most such differences away), so where the backend declares
    # float32, half the repeated problems are float32.
    widest = ("float32",) if "float32" in backend.capabilities.dtypes else ()

    @given(data=st.data())
    def repeat(data):
        dtype = data.draw(st.sampled_from((None, *widest)), label="float32 pinned") if widest else None
        problem = data.draw(problems(backend.capabilities, configs=configs, min_batch=1, dtype=dtype),
                            label="problem")
        with supported(check):
            differences = repeated_runs(backend, problem, device, runs)
        check.examples += 1
        check.exercised(problem, backend.capabilities.backward)
        check.last_problem = problem
        worst = max((d for _, d in differences.values()), default=0.0)
        if worst > largest["difference"]:
            largest.update(difference=worst, problem=problem)
        if declared and any(n for n, _ in differences.values()):
            raise AssertionError(f"{backend.name} declares deterministic=True but its {describe(problem, differences, runs)}")

    repeat()
    if not declared:
        where = f" (on {largest['problem']!r})" if largest["difference"] > 0 else ""
        pytest.skip(
            f"not declared deterministic: over {check.examples} problems x {runs} runs, the largest difference "
            f"was {largest['difference']:.3e}{where}"
        )
