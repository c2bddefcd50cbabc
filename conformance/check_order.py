"""The order the spec's checks run in: longest expected first, in equal shares per xdist worker.

A run ends when its slowest worker ends. Checks take from a millisecond (unsupported) to about a minute
(a drawn check of many examples on a slow backend), so the order decides the run's tail: a minute-long
check started last keeps the run going a minute after every other worker has finished, and a run cut
short by its time limit loses it. Longest first puts the long checks at the start and leaves short ones,
which fill gaps, for the end.

*Expected seconds.* Every finished run records each check's measured seconds (``duration_s`` of its report
records, unsupported ones included, not-run ones not) in ``check-seconds.json`` in the cache directory
(cache.py), per kind of run (device type, profile, ``--max-examples``), newer values replacing older ones
(two runs on one cache directory that finish together: the later write wins, and only the order of a
later run suffers from the seconds it drops).
``jfa-conformance run`` hands the run's table to pytest as a file of its own that no other run rewrites
(``--jfa-check-seconds``), read once per process, so every worker collects the same order. A check with no
measurement of its own is expected to take the mean measured for the same test function on the same
backend, else for the same test function on any backend, else a prior: a check that draws hypothesis
examples is expected to take longer than a check of one problem. Equal estimates keep the spec modules'
order (the oracle checks first) and, within a module, collection order.

*Equal shares.* pytest-xdist's ``worksteal`` scheduler (3.x) first cuts the item list into one contiguous
run per worker, ``len(pending) // workers_left`` items each in turn, and later moves the tail of a busy
worker's queue to an idle one. A plain longest-first list would give the first worker every long check,
so the sorted checks are dealt out: each goes to the share with the least expected seconds that still has
room, the shares are as long as worksteal's cuts, and laid end to end they are the item list. Each worker
thus starts longest first with about the same expected total, and what worksteal moves later is short.
Outside xdist, and under its other modes (which hand the list out from its head), the order is one share:
longest first.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

SCHEMA_VERSION = 1
# Priors, seconds: only their ranking matters (a drawn check above a one-problem check); measured means
# replace them as soon as a test function has any measurement.
DRAWN_PRIOR_S = 10.0
SINGLE_PRIOR_S = 1.0


@dataclass(frozen=True)
class Check:
    """What the order knows of one collected item."""

    key: str  # plugin.check_key of its node id: "test_oracle_checks.py::test_forward[fa4]"
    backend: str | None = None
    draws: bool = False  # it draws hypothesis examples (many problems), not one problem
    rank: int = 0  # its spec module's place in plugin.SPEC_ORDER: the tie-break

    @property
    def function(self) -> str:
        return function_of(self.key)


@dataclass(frozen=True)
class Measured:
    seconds: float
    backend: str | None


def function_of(key: str) -> str:
    """``test_oracle_checks.py::test_forward[fa4]`` -> ``test_oracle_checks.py::test_forward``."""
    return key.partition("[")[0]


def run_kind(device: str, profile: str, max_examples: int | None) -> str:
    """The table a run's seconds belong to: checks take different times on another device type, profile or
    number of examples."""
    kind = f"{device.partition(':')[0]}, profile {profile}"
    return kind + (f", max-examples {max_examples}" if max_examples is not None else "")


# -- the tables -------------------------------------------------------------------------------------------
def parse_table(data) -> dict[str, Measured]:
    """``{check key: Measured}`` from a table's JSON (``{key: {"seconds": s, "backend": name}}``); entries
    that are not a finite, non-negative number of seconds are left out."""
    table = {}
    if not isinstance(data, dict):
        return table
    for key, entry in data.items():
        if not isinstance(key, str) or not isinstance(entry, dict):
            continue
        seconds, backend = entry.get("seconds"), entry.get("backend")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
            continue
        table[key] = Measured(float(seconds), backend if isinstance(backend, str) else None)
    return table


def table_json(table: dict[str, Measured]) -> dict:
    return {key: {"seconds": m.seconds, "backend": m.backend} for key, m in sorted(table.items())}


def read_file(path: Path) -> dict[str, dict[str, Measured]]:
    """The cache's ``{run kind: table}``; a missing, unreadable or malformed file is an empty one (the
    order then falls back on the priors; the next run writes a good file)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    kinds = data.get("kinds") if isinstance(data, dict) else None
    if not isinstance(kinds, dict):
        return {}
    return {kind: parse_table(table) for kind, table in kinds.items() if isinstance(kind, str)}


def _write_json(path: Path, data) -> None:
    """Readers see the old file or the new one, never a torn one."""
    from .report import atomic_write_text
    atomic_write_text(path, json.dumps(data, indent=0, sort_keys=True) + "\n")


def measured(records) -> dict[str, Measured]:
    """``{check key: Measured}`` of a run's report records that ran (every outcome but not-run) and have a
    duration."""
    from .plugin import check_key
    table = {}
    for r in records:
        seconds = r.get("duration_s")
        if r.get("outcome") == "not-run" or isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            continue
        if math.isfinite(seconds) and seconds >= 0:
            table[check_key(r["id"])] = Measured(float(seconds), r.get("backend"))
    return table


def record(path: Path, kind: str, records) -> int:
    """Merge a run's measured seconds into the file at ``path`` under ``kind`` (new values replace old
    ones; other kinds are kept) and write it atomically; returns the number of checks recorded."""
    new = measured(records)
    kinds = read_file(path)
    kinds[kind] = {**kinds.get(kind, {}), **new}
    _write_json(Path(path), {"version": SCHEMA_VERSION,
                             "kinds": {k: table_json(t) for k, t in sorted(kinds.items())}})
    return len(new)


def snapshot(path: Path, kind: str, dest: Path) -> Path:
    """Write the table of ``kind`` from the file at ``path`` to ``dest``: the copy one run reads, which no
    other run rewrites while this one is collecting."""
    _write_json(Path(dest), table_json(read_file(path).get(kind, {})))
    return Path(dest)


def read_snapshot(path: str | os.PathLike) -> dict[str, Measured]:
    """The table :func:`snapshot` wrote; a missing or malformed file raises ValueError naming it."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold an object {{check key: {{\"seconds\": s, \"backend\": name}}}}")
    return parse_table(data)


# -- the order --------------------------------------------------------------------------------------------
def expected_seconds(checks: list[Check], table: dict[str, Measured]) -> list[float]:
    """Each check's expected seconds: measured, else the mean of its test function on its backend, else of
    its test function, else the prior."""
    by_function_backend: dict[tuple[str, str | None], list[float]] = {}
    by_function: dict[str, list[float]] = {}
    for key, m in table.items():
        function = function_of(key)
        by_function_backend.setdefault((function, m.backend), []).append(m.seconds)
        by_function.setdefault(function, []).append(m.seconds)
    expected = []
    for check in checks:
        if check.key in table:
            expected.append(table[check.key].seconds)
            continue
        same = by_function_backend.get((check.function, check.backend)) or by_function.get(check.function)
        expected.append(sum(same) / len(same) if same else DRAWN_PRIOR_S if check.draws else SINGLE_PRIOR_S)
    return expected


def worksteal_shares(n_items: int, n_workers: int) -> list[int]:
    """How many items each worker gets when xdist's worksteal scheduler first splits ``n_items`` over
    ``n_workers`` idle workers: in turn, the pending items divided by the workers still to serve."""
    if n_workers < 1:
        raise ValueError(f"n_workers must be at least 1, got {n_workers}")
    shares, left = [], n_items
    for i in range(n_workers):
        share = left // (n_workers - i)
        shares.append(share)
        left -= share
    return shares


def arrange(checks: list[Check], table: dict[str, Measured], n_workers: int = 1) -> list[int]:
    """The run order, as indices into ``checks``: longest expected first (ties: spec module, then
    collection order), dealt into ``n_workers`` shares as worksteal cuts them (each sorted check to the
    share with the least expected seconds that has room; ties to the first), the shares end to end."""
    expected = expected_seconds(checks, table)
    ranked = sorted(range(len(checks)), key=lambda i: (-expected[i], checks[i].rank, i))
    sizes = worksteal_shares(len(checks), n_workers)
    shares: list[list[int]] = [[] for _ in sizes]
    loads = [0.0] * len(sizes)
    for i in ranked:
        open_ = [s for s in range(len(sizes)) if len(shares[s]) < sizes[s]]
        target = min(open_, key=lambda s: (loads[s], s))
        shares[target].append(i)
        loads[target] += expected[i]
    return [i for share in shares for i in share]
