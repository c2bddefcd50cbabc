"""Every named edge case, in every dtype that can hold its values: forward, LSE and gradients against the oracle."""
from __future__ import annotations

import pytest

from conformance import checks
from conformance.harness import Unsupported

from .edge_cases import EDGE_CASES, device_reason, edge_case_params

pytestmark = pytest.mark.spec


@pytest.mark.parametrize(("case", "dtype"), edge_case_params())
def test_edge_case(backend, device, check, case, dtype):
    if (why := device_reason(case, device)) is not None:
        pytest.skip(f"unsupported: {why}")
    problem = EDGE_CASES[case].replace(dtype=dtype)
    try:
        verdicts = checks.everything(backend, problem, device)
    except Unsupported as exc:
        pytest.skip(f"unsupported: {exc}")
    check.verify(problem, verdicts)
