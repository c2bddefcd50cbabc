"""Hypothesis settings profiles of the spec: ``ci`` (default, fast and reproducible), ``dev``, ``thorough``."""
from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings
from hypothesis.internal.conjecture import engine

DEFAULT = "ci"
_COMMON = dict(
    deadline=None,  # kernels compile on first use; timing belongs to benchmarks, not to checks
    print_blob=True,
    # The explain phase prints the source lines only failing examples ran: noise in a conformance
    # report (it lists our own harness lines) and extra time after every failure.
    phases=[phase for phase in Phase if phase != Phase.explain],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                           HealthCheck.differing_executors, HealthCheck.function_scoped_fixture],
)
PROFILES = {
    "ci": settings(max_examples=8, derandomize=True, database=None, **_COMMON),
    "dev": settings(max_examples=40, **_COMMON),
    "thorough": settings(max_examples=300, **_COMMON),
}
# Kernel configurations per run (configs.py): beyond the set that covers every declared value, this many
# more random ones; None draws every kernel axis freely (many more compiles, for long exploratory runs).
# A profile registered elsewhere gets the covering set alone.
EXTRA_KERNEL_CONFIGS = {"ci": 0, "dev": 6, "thorough": None}
for _name, _settings in PROFILES.items():
    settings.register_profile(_name, _settings)


# Seconds hypothesis may spend shrinking one failing check, per profile (its own limit, 300 s, otherwise).
# A failing check of a vendor kernel on a GPU spent 79 s of a 194 s cold run shrinking (H100, FA4's
# broadcast-Q dQ error), the run's longest check; after the limit the smallest failing example found so far
# is reported, which is still a real failure. hypothesis has no setting for it: its engine's module
# constant is set when a profile is loaded (tests/test_run_speed.py fails if a hypothesis release renames it).
SHRINK_SECONDS = {"ci": 30, "dev": 120}
_HYPOTHESIS_SHRINK_SECONDS = getattr(engine, "MAX_SHRINKING_SECONDS", 300)  # its own, for the other profiles


def extra_kernel_configs(name: str | None) -> int | None:
    return EXTRA_KERNEL_CONFIGS.get(name or DEFAULT, 0)


def load(name: str, max_examples: int | None = None) -> None:
    """Load profile ``name`` (ours or one the adopter registered), optionally with another max_examples."""
    if max_examples is not None:
        derived = f"{name}-n{max_examples}"
        settings.register_profile(derived, settings(settings.get_profile(name), max_examples=max_examples))
        base, name = name, derived
    else:
        base = name
    settings.load_profile(name)
    engine.MAX_SHRINKING_SECONDS = SHRINK_SECONDS.get(base, _HYPOTHESIS_SHRINK_SECONDS)
