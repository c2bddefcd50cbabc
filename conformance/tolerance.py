"""The tolerance rule, the only place where "close enough" is defined.

A result passes when its error against the float64 oracle is at most ``factor`` times the error that the
same oracle makes when run in the test dtype (the low-precision reference), plus floors:

    allowed = factor * reference_error
              + 4 * eps(dtype) * max(1, max|oracle|)                      # rounding of the result
              + 4 * max|LSE| * eps(float32) * max(1, max|out|)            # out only
              + 4 * (sqrt(D) + max|LSE|) * eps(float32)
                  * max(1, max|all gradients|)                            # gradients only

``factor`` is 2 for forward quantities (out, LSE) and 3 for gradients.

The floor of ``out`` covers the rounding of the scores: every kernel forms scale * q.k (often times
log2(e), for exp2) in float32 and subtracts the running max, each rounded at the scores' own size, about
|LSE|; the probabilities, and so ``out``, carry a relative error of a few eps(float32) * |LSE|. The
low-precision reference rounds its scores too, but in its own order and domain, which may be half as much.
For usual scores (|LSE| of 10 or so) this is a few dozen float32 ulps; where scores are near 6.5e4 (values
far from 0) it is about 3% of ``out``, still far below what a wrong kernel does there (zeros, NaN).

The gradient floor covers two errors every flash backward makes and the reference does not:

* it subtracts nearly equal length-D dot products (dP - rowsum(dO*O)) in float32 accumulators, so a
  gradient that is 0 in exact arithmetic (a single visible key, say) comes out as noise of that size,
  while the low-precision reference may cancel exactly;
* it recomputes the probabilities from the stored LSE, P = exp(scale * q.k - LSE), with the scores and the
  LSE rounded in float32 at their own size: P is off by about eps(float32) * |LSE| relative and no longer
  sums to 1, which the gradients inherit, while the reference normalises P afresh. This term matters only
  where scores are large (values far from 0: an LSE near 6.5e4 makes it about 1% of the gradients).

No backend gets its own numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FORWARD_FACTOR = 2.0
GRADIENT_FACTOR = 3.0
FLOOR_ULPS = 4.0


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
        used = f"{self.budget_used:.0%}" if self.budget_used < 10 else f"{self.budget_used:.3g}x the allowance"
        return (
            f"{self.quantity}: {status}, observed error {self.observed:.3e}, allowed {self.allowed:.3e} "
            f"(budget used {used}; low-precision reference error {self.reference_error:.3e})"
        )


def allowed_error(reference_error: float, dtype: torch.dtype, scale: float, factor: float,
                  dot_length: int = 0, gradient_scale: float = 0.0, score_scale: float = 0.0) -> float:
    if reference_error != reference_error or reference_error == float("inf"):
        raise ValueError(
            f"the low-precision reference in {dtype} is not finite; the problem is outside what {dtype} can "
            "represent and cannot calibrate a tolerance"
        )
    eps32 = torch.finfo(torch.float32).eps
    result_floor = FLOOR_ULPS * torch.finfo(dtype).eps * max(1.0, scale)
    if dot_length:  # a gradient
        return factor * reference_error + result_floor + \
            FLOOR_ULPS * (math.sqrt(dot_length) + score_scale) * eps32 * max(1.0, gradient_scale)
    return factor * reference_error + result_floor + FLOOR_ULPS * score_scale * eps32 * max(1.0, scale)


def judge(quantity: str, observed, oracle, low_precision, dtype: torch.dtype, factor: float,
          dot_length: int = 0, gradient_scale: float = 0.0, score_scale: float = 0.0) -> Verdict:
    """Judge ``observed`` against ``oracle`` (float64) with the rule above; gradients pass the head dim,
    the largest oracle gradient and the largest oracle |LSE| as ``dot_length``, ``gradient_scale`` and
    ``score_scale``; ``out`` passes the largest oracle |LSE| as ``score_scale``."""
    reference_error = max_error(low_precision, oracle)
    return Verdict(
        quantity=quantity,
        observed=max_error(observed, oracle),
        allowed=allowed_error(reference_error, dtype, magnitude(oracle), factor, dot_length, gradient_scale,
                              score_scale),
        reference_error=reference_error,
    )
