"""The tolerance rule, the only place where "close enough" is defined.

A result passes when its error against the float64 oracle is at most ``factor`` times the error that the
same oracle makes when run in the test dtype (the low-precision reference), plus a floor of a few units
of rounding of the test dtype at the magnitude of the result:

    allowed = factor * reference_error + floor_ulps * eps(dtype) * max(1, max|oracle|)

``factor`` is 2 for forward quantities (out, LSE) and 3 for gradients; ``floor_ulps`` is 4 and 16. The
gradient floor is wider because the backward subtracts nearly equal terms (dP - rowsum(dO*O)), whose
rounding is at the scale of the terms, not of the result: a gradient that is exactly 0 in exact
arithmetic is computed as noise of a few ulps by every kernel. No backend gets its own numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FORWARD_FACTOR = 2.0
GRADIENT_FACTOR = 3.0
FLOOR_ULPS = {FORWARD_FACTOR: 4.0, GRADIENT_FACTOR: 16.0}


def max_error(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute difference, with equal infinities counting as exact and NaN as infinite."""
    if observed.shape != expected.shape:
        raise ValueError(f"shape {tuple(observed.shape)} does not match expected {tuple(expected.shape)}")
    if observed.numel() == 0:
        return 0.0
    a, b = observed.detach().to("cpu", torch.float64), expected.detach().to("cpu", torch.float64)
    diff = (a - b).abs()
    diff = torch.where(a == b, torch.zeros_like(diff), diff)  # -inf == -inf for empty rows
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    return float(diff.max())


def magnitude(t: torch.Tensor) -> float:
    finite = t.detach()[torch.isfinite(t.detach())]
    return float(finite.abs().max()) if finite.numel() else 0.0


@dataclass(frozen=True)
class Verdict:
    quantity: str
    observed: float
    allowed: float
    reference_error: float

    @property
    def ok(self) -> bool:
        return self.observed <= self.allowed

    @property
    def budget_used(self) -> float:
        """observed / allowed: 1.0 is the edge of the tolerance."""
        return self.observed / self.allowed if self.allowed > 0 else float("inf")

    def __str__(self) -> str:
        status = "ok" if self.ok else "FAIL"
        return (
            f"{self.quantity}: {status}, observed error {self.observed:.3e}, allowed {self.allowed:.3e} "
            f"(budget used {self.budget_used:.0%}; low-precision reference error {self.reference_error:.3e})"
        )


def allowed_error(reference_error: float, dtype: torch.dtype, scale: float, factor: float) -> float:
    if reference_error != reference_error or reference_error == float("inf"):
        raise ValueError(
            f"the low-precision reference in {dtype} is not finite; the problem is outside what {dtype} can "
            "represent and cannot calibrate a tolerance"
        )
    return factor * reference_error + FLOOR_ULPS[factor] * torch.finfo(dtype).eps * max(1.0, scale)


def judge(quantity: str, observed, oracle, low_precision, dtype: torch.dtype, factor: float) -> Verdict:
    """Judge ``observed`` against ``oracle`` (float64) with the rule above."""
    reference_error = max_error(low_precision, oracle)
    return Verdict(
        quantity=quantity,
        observed=max_error(observed, oracle),
        allowed=allowed_error(reference_error, dtype, magnitude(oracle), factor),
        reference_error=reference_error,
    )
