"""What one spec check saw, kept on its pytest item for reports: examples run, unsupported reasons, the
last problem and its verdicts (after a failure, hypothesis's shrunk counterexample), and the worst
budget used per quantity over all examples."""
from __future__ import annotations

from .configs import KernelConfig, problem_axes
from .harness import assert_verdicts
from .problem import Problem
from .tolerance import Verdict


class CheckLog:
    def __init__(self, backend: str):
        self.backend = backend
        self.examples = 0
        self.unsupported: dict[str, int] = {}
        self.last_problem: Problem | None = None
        self.last_verdicts: list[Verdict] = []
        self.worst: dict[str, Verdict] = {}
        self.axes: dict[str, dict[str, int]] = {}  # coverage: axis -> value -> examples run
        self.configs: dict[str, int] = {}  # kernel configuration key -> examples run

    def exercised(self, problem: Problem, gradients: bool = False) -> None:
        """Count one example that ran on ``problem`` (with ``gradients``: backpropagated) in the tallies."""
        for axis, value in problem_axes(problem, gradients).items():
            counts = self.axes.setdefault(axis, {})
            counts[value] = counts.get(value, 0) + 1
        key = KernelConfig.of(problem).key
        self.configs[key] = self.configs.get(key, 0) + 1

    def __repr__(self) -> str:  # hypothesis prints fixtures in failing cases: keep it short
        return f"CheckLog({self.backend!r})"

    def add_unsupported(self, reason: str) -> None:
        self.unsupported[reason] = self.unsupported.get(reason, 0) + 1

    def unsupported_summary(self) -> str:
        ranked = sorted(self.unsupported.items(), key=lambda kv: -kv[1])
        return "; ".join(reason for reason, _ in ranked[:3]) or "no supported example could be drawn"

    def verify(self, problem: Problem, verdicts: list[Verdict]) -> None:
        """Record the verdicts of one example, then fail if any verdict fails."""
        self.examples += 1
        self.exercised(problem, any(v.quantity in ("dq", "dk", "dv") for v in verdicts))
        self.last_problem, self.last_verdicts = problem, list(verdicts)
        for v in verdicts:
            if v.quantity not in self.worst or v.budget_used > self.worst[v.quantity].budget_used:
                self.worst[v.quantity] = v
        assert_verdicts(problem, verdicts, self.backend)
