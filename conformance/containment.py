"""Hang containment: a backend that has timed out once must not cost a full timeout per remaining check.

The run keeps a small state file per run (``backends.json`` in the flight directory) that the pytest
controller and the warm-up write and every worker reads before each check:

* ``suspect`` — the backend timed out (in a check, or compiling in the warm-up), or crashed in
  :data:`CRASH_STREAK` checks in a row. Before its next check, each worker runs a *probe*: one tiny
  call (forward, and backward where declared) under a short watchdog. If it answers, the check runs as
  usual (a slow check is not a hang; a backend that crashes on some problems still gets every check). If
  it hangs, crashes its process or raises a device error, the check is recorded ``not-run`` and the
  backend is marked
* ``dead`` — its remaining checks are reported ``not-run: <backend> hung in <check>`` (or ``crashed in
  each of its last checks``) at once.

So a hanging backend costs about one check timeout plus one probe, and a backend that crashes on every
call a few worker restarts, however many checks it has.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

STATE_FILE = "backends.json"
CRASH_STREAK = 4  # crashes in a row (no pass or fail between) that make a backend suspect
PROBE_EXIT_STATUS = 75  # a worker ended by the probe's watchdog
NOT_RUN_PREFIX = "not run: "  # a skip whose reason starts so is recorded as not-run, not unsupported


def probe_seconds(timeout_s: float | None) -> float:
    """The probe's budget: a fifth of the check timeout, between 5 and 60 seconds."""
    return max(5.0, min(60.0, (timeout_s or 300.0) / 5))


def _path(flight_dir) -> Path | None:
    return None if not flight_dir else Path(flight_dir) / STATE_FILE


def read(flight_dir) -> dict[str, dict]:
    path = _path(flight_dir)
    if path is None:
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def mark(flight_dir, backend: str, state: str, why: str) -> None:
    """Set ``backend``'s state (``suspect`` or ``dead``); ``dead`` is never downgraded."""
    path = _path(flight_dir)
    if path is None:
        return
    states = read(flight_dir)
    if states.get(backend, {}).get("state") == "dead":
        return
    states[backend] = {"state": state, "why": why}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(states))
    os.replace(tmp, path)


class Watchdog:
    """Ends this process with :data:`PROBE_EXIT_STATUS` unless stopped within ``seconds``."""

    def __init__(self, seconds: float):
        self.timer = threading.Timer(seconds, lambda: os._exit(PROBE_EXIT_STATUS))
        self.timer.daemon = True

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()


MEMORY_SHARE_ENV = "JFA_GPU_MEMORY_SHARE"  # set by ``jfa-conformance run`` for its workers


def gpu_memory_share(environ=None) -> float | None:
    """This worker's share of its GPU's memory (``$JFA_GPU_MEMORY_SHARE``, a fraction), or None."""
    raw = (os.environ if environ is None else environ).get(MEMORY_SHARE_ENV)
    return min(1.0, max(0.01, float(raw))) if raw else None


def release_gpu_memory_over_share(share: float | None) -> bool:
    """After a check: if this process's caching allocator holds more than its share of the GPU, collect
    garbage (failure tracebacks keep tensors alive through their frames) and hand the cached blocks back,
    so that neighbours sharing the GPU do not run out of memory. Below the share the cache stays, already
    poisoned for the next check (poison.py). No hard cap: a legitimately large problem still runs.
    Returns whether memory was released."""
    if share is None:
        return False
    import torch
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    index = torch.cuda.current_device()
    if torch.cuda.memory_reserved(index) <= share * torch.cuda.get_device_properties(index).total_memory:
        return False
    import gc
    gc.collect()
    torch.cuda.empty_cache()
    return True


# A process's CUDA context with torch's kernels loaded, as a fraction of the GPU: about 0.6 GB of 80 GB.
CONTEXT_SHARE = 0.008
# What a warm-up process keeps cached between jobs (its problems are tiny): it hands back nearly everything.
WARMUP_SHARE = 0.01


def memory_share(workers_per_gpu: int, warmup_per_gpu: int = 0) -> float:
    """Each check worker's fraction of a GPU: an equal part of 92% less every process's context and what
    the warm-up's processes keep (``warmup_per_gpu`` of them while the warm-up runs beside the checks)."""
    held = CONTEXT_SHARE * (workers_per_gpu + warmup_per_gpu) + WARMUP_SHARE * warmup_per_gpu
    return round(max(0.01, (0.92 - held) / max(1, workers_per_gpu)), 4)
