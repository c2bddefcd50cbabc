"""Calls that share their offsets tensors: a backend that keeps what it read from the offsets must notice
when they change."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance import checks
from conformance.strategies import problems

from .support import supported

pytestmark = pytest.mark.spec


@given(data=st.data())
def test_offsets_rewritten_between_calls(backend, device, check, configs, data):
    """The same offsets tensors across calls, rewritten in place, then rebound to new storage: each call
    must answer for the offsets it is given (checks.offsets_rewritten)."""
    problem = data.draw(problems(backend.capabilities, configs=configs, min_batch=2), label="problem")
    with supported(check):
        verdicts = checks.offsets_rewritten(backend, problem, device)
    check.verify(problem, verdicts)
