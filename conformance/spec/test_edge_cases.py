"""Every named edge case, in every dtype: forward, LSE and gradients against the oracle."""
from __future__ import annotations

import pytest

from conformance import checks
from conformance.harness import Unsupported
from conformance.problem import DTYPES

from .edge_cases import EDGE_CASES

pytestmark = pytest.mark.spec


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_edge_case(backend, device, check, case, dtype):
    problem = EDGE_CASES[case].replace(dtype=dtype)
    try:
        verdicts = checks.everything(backend, problem, device)
    except Unsupported as exc:
        pytest.skip(f"unsupported: {exc}")
    check.verify(problem, verdicts)
