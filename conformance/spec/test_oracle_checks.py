"""Forward output, LSE and gradients of each backend against the float64 oracle on drawn problems."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance import checks
from conformance.strategies import problems

from .support import require, supported

pytestmark = pytest.mark.spec


@given(data=st.data())
def test_forward(backend, device, check, configs, data):
    problem = data.draw(problems(backend.capabilities, configs=configs), label="problem")
    with supported(check):
        verdicts = checks.forward(backend, problem, device)
    check.verify(problem, verdicts)


@given(data=st.data())
def test_lse(backend, device, check, configs, data):
    require(backend.capabilities.lse, f"{backend.name} declares no LSE")
    problem = data.draw(problems(backend.capabilities, configs=configs), label="problem")
    with supported(check):
        verdicts = checks.lse(backend, problem, device)
    check.verify(problem, verdicts)


@given(data=st.data())
def test_gradients(backend, device, check, configs, data):
    require(backend.capabilities.backward, f"{backend.name} declares no backward")
    problem = data.draw(problems(backend.capabilities, configs=configs), label="problem")
    with supported(check):
        verdicts = checks.gradients(backend, problem, device)
    check.verify(problem, verdicts)
