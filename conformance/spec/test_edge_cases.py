"""Every named edge case, in every dtype: forward, LSE and gradients against the oracle."""
from __future__ import annotations

import pytest

from conformance.harness import Unsupported, ensure_supported, judge_forward, judge_gradients, run_backend
from conformance.problem import DTYPES

from .edge_cases import EDGE_CASES

pytestmark = pytest.mark.spec


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_edge_case(backend, device, check, case, dtype):
    problem = EDGE_CASES[case].replace(dtype=dtype)
    try:
        ensure_supported(backend, problem)
        gradients = backend.capabilities.backward
        run = run_backend(backend, problem, device, gradients=gradients)
    except Unsupported as exc:
        pytest.skip(f"unsupported: {exc}")
    verdicts = judge_forward(problem, run)
    if gradients:
        verdicts += judge_gradients(problem, run)
    check.verify(problem, verdicts)
