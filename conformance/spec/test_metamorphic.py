"""Properties that need no oracle: the backend against itself under transformations of the batch."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance import checks
from conformance.relations import RELATIONS, not_applicable, relation_configs
from conformance.strategies import problems

from .support import require, supported

pytestmark = pytest.mark.spec


@pytest.mark.parametrize("relation", list(RELATIONS))
@given(data=st.data())
def test_metamorphic(backend, device, check, configs, relation, data):
    reason = not_applicable(relation, backend.capabilities)
    require(reason is None, f"{relation}: {reason}")
    problem = data.draw(problems(backend.capabilities, configs=relation_configs(relation, configs), min_batch=1),
                        label="problem")
    with supported(check):
        verdicts = checks.relation(backend, problem, device, relation)
    check.verify(problem, verdicts)


@given(data=st.data())
def test_broadcast_q_native_matches_replicated(backend, device, check, configs, data):
    """A native broadcast-Q path must equal the same call with q replicated per sequence, dQ summed."""
    require(backend.capabilities.broadcast_q == "native", f"{backend.name} has no native broadcast-Q path")
    problem = data.draw(problems(backend.capabilities, configs=configs, broadcast_q=True, min_batch=1), label="problem")
    with supported(check):
        verdicts = checks.broadcast_native(backend, problem, device)
    check.verify(problem, verdicts)
