"""Every kernel configuration of the run once, on one small jagged problem.

The drawn checks take their kernel axes from the run's configurations (configs.py), half the time from
those no edge case runs, so nearly every configuration meets some drawn example, but not surely: with
another seed a configuration may be compiled by the warm-up and then never checked. This check gives each
configuration beyond the edge cases' a verdict of its own: forward, LSE and gradients on a short batch
with a sequence without queries and one past a 16-row tile.
"""
from __future__ import annotations

import pytest

from conformance import checks
from conformance.backend import Capabilities
from conformance.configs import KernelConfig
from conformance.harness import Unsupported
from conformance.problem import Problem

from .support import require

pytestmark = pytest.mark.spec

SEED = 97


def config_problem(config: KernelConfig, caps: Capabilities) -> Problem:
    """A small problem of ``config`` inside ``caps``: key lengths 7, 3, 17, 1; queries as many, or 5 each
    (broadcast-Q), or 5, 0 (2 without zero-length sequences), 17, 1 (cross-attention)."""
    lengths_k = (7, 3, 17, 1)
    if config.broadcast_q:
        lengths_q = (5,) * len(lengths_k)
    elif caps.cross_attention:
        lengths_q = (5, 0 if caps.zero_length else 2, 17, 1)
    else:
        lengths_q = lengths_k
    return config.problem(lengths_q, lengths_k, seed=SEED, length_law="given")


def test_kernel_configs(backend, device, check, configs):
    require(configs is not None, "this profile draws every kernel axis freely; there is no configuration list")
    fresh = getattr(configs, "fresh", ())
    require(bool(fresh), "every kernel configuration of the run is an edge case's")
    failed: list[tuple[Problem, list, AssertionError]] = []
    for config in fresh:
        problem = config_problem(config, backend.capabilities)
        try:
            verdicts = checks.everything(backend, problem, device)
        except Unsupported as exc:
            check.add_unsupported(str(exc))
            continue
        try:
            check.verify(problem, verdicts)
        except AssertionError as exc:
            failed.append((problem, verdicts, exc))
    if failed:
        problem, verdicts, first = failed[0]
        check.last_problem, check.last_verdicts = problem, verdicts  # what the report and replay show
        others = [KernelConfig.of(p).key for p, _, _ in failed[1:]]
        more = f"\n  {len(others)} more configuration(s) fail: {'; '.join(others)}" if others else ""
        raise AssertionError(f"{first}{more}") from None
    if not check.examples:
        pytest.skip(f"unsupported: {check.unsupported_summary()}")
