"""Gates: the checks of a backend start once its warm-up (warmup.py) has finished.

The warm-up runs beside the checks: the checks of backends with nothing to compile (and of those whose
compiles an earlier run settled) start at once, and a worker that reaches a check of a backend still
compiling waits for that backend's last warm-up job. A gate is a file in the run's gate directory; the wait
is outside the check's timeout.
"""
from __future__ import annotations

import json
import time
from pathlib import Path


def gate_path(gate_dir: Path, name: str) -> Path:
    return Path(gate_dir) / f"{name}.warming"


GATED = "gated.json"  # the backends gated at the start, fixed for the run: every xdist worker orders by it


def open_gates(gate_dir: Path, names) -> None:
    """Before the checks start: one file per backend whose checks must wait, and the list of them."""
    Path(gate_dir).mkdir(parents=True, exist_ok=True)
    for name in names:
        gate_path(gate_dir, name).write_text("")
    (Path(gate_dir) / GATED).write_text(json.dumps(sorted(names)))


def gated_backends(gate_dir: Path) -> set[str]:
    """The backends whose gates were opened at the start (released or not since)."""
    try:
        return set(json.loads((Path(gate_dir) / GATED).read_text()))
    except (OSError, ValueError):
        return set()


def release_gate(gate_dir: Path | None, name: str) -> None:
    if gate_dir is not None:
        gate_path(gate_dir, name).unlink(missing_ok=True)


def wait_for_gate(gate_dir: Path | None, name: str, poll_s: float = 0.2) -> float:
    """Block while backend ``name`` is still compiling; the seconds waited. The warm-up releases every gate
    when it ends, however it ends (its time limit included)."""
    if gate_dir is None or not gate_path(gate_dir, name).exists():
        return 0.0
    start = time.monotonic()
    while gate_path(gate_dir, name).exists():
        time.sleep(poll_s)
    return time.monotonic() - start
