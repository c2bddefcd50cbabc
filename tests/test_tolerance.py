"""The tolerance rule and its error metric."""
import math

import pytest
import torch

from conformance.tolerance import FORWARD_FACTOR, GRADIENT_FACTOR, allowed_error, judge, max_error


def test_equal_infinities_are_exact_and_nan_is_infinite():
    a = torch.tensor([float("-inf"), 1.0])
    assert max_error(a, a.clone()) == 0.0
    assert max_error(torch.tensor([float("nan"), 1.0]), a) == math.inf
    assert max_error(torch.tensor([0.0, 1.0]), a) == math.inf  # finite where -inf is expected


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shape"):
        max_error(torch.zeros(2, 3), torch.zeros(3, 2))


def test_allowed_error_is_factor_times_reference_plus_floor():
    eps = torch.finfo(torch.bfloat16).eps
    assert allowed_error(0.01, torch.bfloat16, 2.0, FORWARD_FACTOR) == pytest.approx(0.02 + 4 * eps * 2.0)
    grad = allowed_error(0.01, torch.bfloat16, 2.0, GRADIENT_FACTOR, dot_length=64, gradient_scale=3.0)
    assert grad == pytest.approx(0.03 + 4 * eps * 2.0 + 4 * 8 * torch.finfo(torch.float32).eps * 3.0)
    # scores rounded at the size of the LSE: out's floor and the gradients' grow with it
    eps32 = torch.finfo(torch.float32).eps
    out = allowed_error(0.0, torch.float32, 2.0, FORWARD_FACTOR, score_scale=6.5e4)
    assert out == pytest.approx(4 * eps32 * 2.0 + 4 * 6.5e4 * eps32 * 2.0)
    grad = allowed_error(0.0, torch.float32, 2.0, GRADIENT_FACTOR, dot_length=64, gradient_scale=3.0, score_scale=6.5e4)
    assert grad == pytest.approx(4 * eps32 * 2.0 + 4 * (8 + 6.5e4) * eps32 * 3.0)


def test_verdict_reports_budget_and_fails_past_the_allowance():
    oracle = torch.tensor([1.0, 2.0], dtype=torch.float64)
    low = torch.tensor([1.01, 2.0])
    ok = judge("out", torch.tensor([1.015, 2.0]), oracle, low, torch.float16, FORWARD_FACTOR)
    bad = judge("out", torch.tensor([1.05, 2.0]), oracle, low, torch.float16, FORWARD_FACTOR)
    assert ok.ok and 0 < ok.budget_used < 1
    assert not bad.ok and bad.budget_used > 1
    assert "observed error" in str(bad) and "allowed" in str(bad) and "budget used" in str(bad)


def test_non_finite_reference_cannot_calibrate():
    with pytest.raises(ValueError, match="not finite"):
        allowed_error(math.inf, torch.float16, 1.0, FORWARD_FACTOR)
