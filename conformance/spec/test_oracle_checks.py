"""Forward output, LSE and gradients of each backend against the float64 oracle on drawn problems."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.harness import assert_verdicts, judge_forward, judge_gradients, run_backend
from conformance.strategies import problems

from .support import require, require_lse, supported

pytestmark = pytest.mark.spec


@given(data=st.data())
def test_forward(backend, device, unsupported, data):
    problem = data.draw(problems(backend.capabilities), label="problem")
    with supported(unsupported):
        run = run_backend(backend, problem, device)
    assert_verdicts(problem, judge_forward(problem, run)[:1], backend)


@given(data=st.data())
def test_lse(backend, device, unsupported, data):
    require(backend.capabilities.lse, f"{backend.name} declares no LSE")
    problem = data.draw(problems(backend.capabilities), label="problem")
    with supported(unsupported):
        run = run_backend(backend, problem, device)
        require_lse(backend, run)
    assert_verdicts(problem, judge_forward(problem, run)[1:], backend)


@given(data=st.data())
def test_gradients(backend, device, unsupported, data):
    require(backend.capabilities.backward, f"{backend.name} declares no backward")
    problem = data.draw(problems(backend.capabilities), label="problem")
    with supported(unsupported):
        run = run_backend(backend, problem, device, gradients=True)
    assert_verdicts(problem, judge_gradients(problem, run), backend)
