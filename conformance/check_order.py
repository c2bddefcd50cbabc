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

*First calls.* A worker process pays extra for its first check of a backend: imports, and loading the
compiled kernels of the configurations it meets from the caches (on one H200 with warm caches, the first
flex or FA4 check in a worker took 7-26 s where its later ones took under a second). Spread over every
worker, those costs came to a third of that run's check seconds. So a run also records, per backend, what
its first check in a worker cost beyond a later one (:func:`first_call_seconds`), and the deal gives each
backend with a cost of :data:`HOME_MIN_S` or more a few *home* shares, as many as its checks fill, where
its checks go (dealt before the others, so that they find room): the other shares never pay its first
call. The other backends' checks go where the expected seconds, first calls counted, are least. A backend
never measured is expected to pay half its declared compile cost (``Capabilities.compile_s``) at a first call.
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
# A backend gets home shares when its first check in a worker costs at least this much more than a later
# one. Homes for every backend (a second's import each) constrain the deal more than they save: simulated
# on the H200 run's seconds, homes from 2 s on gave the shortest runs.
HOME_MIN_S = 2.0


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
def _seconds(value) -> float | None:
    """``value`` as seconds: a finite, non-negative number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def parse_table(data) -> dict[str, Measured]:
    """``{check key: Measured}`` from a table's JSON (``{key: {"seconds": s, "backend": name}}``); entries
    that are not a finite, non-negative number of seconds are left out."""
    table = {}
    if not isinstance(data, dict):
        return table
    for key, entry in data.items():
        if not isinstance(key, str) or not isinstance(entry, dict):
            continue
        seconds, backend = _seconds(entry.get("seconds")), entry.get("backend")
        if seconds is not None:
            table[key] = Measured(seconds, backend if isinstance(backend, str) else None)
    return table


def table_json(table: dict[str, Measured]) -> dict:
    return {key: {"seconds": m.seconds, "backend": m.backend} for key, m in sorted(table.items())}


def _file_section(path: Path, section: str, parse) -> dict:
    """``{run kind: parse(entry)}`` of one section of the cache file; a missing, unreadable or malformed
    file or section is an empty one (the order then falls back on the priors; the next run writes a good
    file)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    kinds = data.get(section) if isinstance(data, dict) else None
    if not isinstance(kinds, dict):
        return {}
    return {kind: parse(entry) for kind, entry in kinds.items() if isinstance(kind, str)}


def read_file(path: Path) -> dict[str, dict[str, Measured]]:
    """The cache's ``{run kind: table}``."""
    return _file_section(path, "kinds", parse_table)


def _write_json(path: Path, data) -> None:
    """Readers see the old file or the new one, never a torn one."""
    from .report import atomic_write_text
    atomic_write_text(path, json.dumps(data, indent=0, sort_keys=True) + "\n")


def first_in_worker(records) -> list[bool]:
    """Per record (in each worker's order): whether it was its worker's first call of its backend, i.e.
    the first of the backend's checks there that called it (passed or failed)."""
    seen, first = set(), []
    for r in records:
        place = (r.get("worker"), r.get("backend"))
        first.append(r.get("outcome") in ("pass", "fail") and place not in seen)
        if first[-1]:
            seen.add(place)
    return first


def measured(records, first_call: dict[str, float] | None = None) -> dict[str, Measured]:
    """``{check key: Measured}`` of a run's report records that ran (every outcome but not-run) and have a
    duration; a check that was its worker's first call of its backend less that backend's ``first_call``
    cost (the deal counts first calls apart)."""
    from .plugin import check_key
    first_call = first_call or {}
    table = {}
    for r, first in zip(records, first_in_worker(records)):
        seconds = _seconds(r.get("duration_s"))
        if r.get("outcome") == "not-run" or seconds is None:
            continue
        if first:
            seconds = max(0.0, seconds - first_call.get(r.get("backend"), 0.0))
        table[check_key(r["id"])] = Measured(seconds, r.get("backend"))
    return table


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


# Before a backend's first call was ever measured: a backend that compiles pays part of it again at its
# first call in each process (imports, loading what the warm-up compiled). On one H200: flex 12 s of its
# 16 s per compile, FA4 7.7 of 19.5, triton-jfa 5.4 of 13.
FIRST_CALL_PRIOR_SHARE = 0.5


def first_call_prior(compile_s: float | None) -> float:
    """A backend's expected first-call cost from its declared compile cost (``Capabilities.compile_s``)."""
    return FIRST_CALL_PRIOR_SHARE * compile_s if compile_s else 0.0


def first_call_seconds(records) -> dict[str, float]:
    """Per backend, what its first check in a worker process cost beyond a later one, from a run's report
    records (in the order each worker ran them): the median over workers of the first check's seconds less
    the median of the backend's later checks of the same test function (else of any). Only checks that
    called the backend count (passed or failed); a backend first met by a single worker tells nothing apart
    and is left out."""
    from .plugin import check_key
    firsts: dict[str, list[tuple[str, float]]] = {}
    later: dict[tuple[str, str | None], list[float]] = {}
    for r, first in zip(records, first_in_worker(records)):
        seconds, backend = _seconds(r.get("duration_s")), r.get("backend")
        if r.get("outcome") not in ("pass", "fail") or seconds is None or not backend or not r.get("worker"):
            continue
        function = function_of(check_key(r["id"]))
        if first:
            firsts.setdefault(backend, []).append((function, seconds))
        else:
            later.setdefault((backend, function), []).append(seconds)
            later.setdefault((backend, None), []).append(seconds)
    costs = {}
    for backend, first in firsts.items():
        if len(first) < 2 or (backend, None) not in later:
            continue
        extra = [s - _median(later.get((backend, f)) or later[(backend, None)]) for f, s in first]
        costs[backend] = round(max(0.0, _median(extra)), 3)
    return costs


def read_first_calls(path: Path) -> dict[str, dict[str, float]]:
    """The cache file's ``{run kind: {backend: first-call seconds}}``."""
    return _file_section(path, "first_call", _first_call_table)


def _first_call_table(data) -> dict[str, float]:
    if not isinstance(data, dict):
        return {}
    return {b: s for b, s in ((b, _seconds(v)) for b, v in data.items()) if isinstance(b, str) and s is not None}


def record(path: Path, kind: str, records) -> int:
    """Merge a run's measured seconds, and its backends' first-call costs, into the file at ``path`` under
    ``kind`` (new values replace old ones; other kinds are kept) and write it atomically; returns the
    number of checks recorded."""
    first_calls = read_first_calls(path)
    first_calls[kind] = {**first_calls.get(kind, {}), **first_call_seconds(records)}
    new = measured(records, first_calls[kind])
    kinds = read_file(path)
    kinds[kind] = {**kinds.get(kind, {}), **new}
    _write_json(Path(path), {"version": SCHEMA_VERSION,
                             "kinds": {k: table_json(t) for k, t in sorted(kinds.items())},
                             "first_call": dict(sorted(first_calls.items()))})
    return len(new)


def snapshot(path: Path, kind: str, dest: Path) -> Path:
    """Write the table and first-call costs of ``kind`` from the file at ``path`` to ``dest``: the copy one
    run reads, which no other run rewrites while this one is collecting."""
    _write_json(Path(dest), {"checks": table_json(read_file(path).get(kind, {})),
                             "first_call": read_first_calls(path).get(kind, {})})
    return Path(dest)


def _read_json_object(path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold an object {{\"checks\": {{check key: {{\"seconds\": s, "
                         f"\"backend\": name}}}}, \"first_call\": {{backend: s}}}}")
    return data


def read_snapshot(path: str | os.PathLike) -> dict[str, Measured]:
    """The table :func:`snapshot` wrote (a bare ``{check key: entry}`` table is read too); a missing or
    malformed file raises ValueError naming it."""
    data = _read_json_object(path)
    return parse_table(data["checks"] if isinstance(data.get("checks"), dict) else data)


def read_snapshot_first_calls(path: str | os.PathLike) -> dict[str, float]:
    """The first-call costs :func:`snapshot` wrote ({} in a bare table)."""
    return _first_call_table(_read_json_object(path).get("first_call"))


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


def homes(checks: list[Check], expected: list[float], first_call: dict[str, float], n_shares: int) -> dict[str, set[int]]:
    """Each backend with a first-call cost: the shares its checks go to. As many as its expected seconds
    fill at the run's mean load per share, and as its checks fill at the mean number of checks per share
    (at least one); the least planned ones, dearest backend first."""
    work: dict[str | None, float] = {}
    count: dict[str | None, int] = {}
    for check, seconds in zip(checks, expected):
        work[check.backend] = work.get(check.backend, 0.0) + seconds
        count[check.backend] = count.get(check.backend, 0) + 1
    costly = [b for b in work if b is not None and first_call.get(b, 0.0) > 0.0]
    if n_shares < 2 or not costly:
        return {}
    per_share = (sum(expected) + sum(first_call[b] for b in costly)) / n_shares
    per_share_checks = len(checks) / n_shares
    planned = [0.0] * n_shares
    out = {}
    for backend in sorted(costly, key=lambda b: (-work[b], b)):
        need = max(math.ceil(work[backend] / per_share) if per_share > 0 else n_shares,
                   math.ceil(count[backend] / per_share_checks))
        k = max(1, min(n_shares, need))
        chosen = sorted(range(n_shares), key=lambda s: (planned[s], s))[:k]
        for s in chosen:
            planned[s] += work[backend] / k + first_call[backend]
        out[backend] = set(chosen)
    return out


def arrange(checks: list[Check], table: dict[str, Measured], n_workers: int = 1,
            first_call: dict[str, float] | None = None) -> list[int]:
    """The run order, as indices into ``checks``: longest expected first (ties: spec module, then
    collection order), dealt into ``n_workers`` shares as worksteal cuts them, the shares end to end. Each
    sorted check goes to the share, among its backend's homes that have room (:func:`homes`; else among all
    that have room), whose expected seconds are least after it, counting the backend's first-call cost
    (``first_call``: backend -> seconds) where the share holds none of its checks yet; ties to the first.
    The homed backends' checks are dealt first, and run first within their shares."""
    expected = expected_seconds(checks, table)
    ranked = sorted(range(len(checks)), key=lambda i: (-expected[i], checks[i].rank, i))
    sizes = worksteal_shares(len(checks), n_workers)
    costs = {b: s for b, s in (first_call or {}).items() if s > 0.0}
    home = homes(checks, expected, {b: s for b, s in costs.items() if s >= HOME_MIN_S}, len(sizes))
    # the homed backends' checks are dealt first, so that the others do not take their homes' room
    ranked.sort(key=lambda i: checks[i].backend not in home)
    shares: list[list[int]] = [[] for _ in sizes]
    loads = [0.0] * len(sizes)
    present: list[set] = [set() for _ in sizes]
    for i in ranked:
        backend = checks[i].backend
        open_ = [s for s in range(len(sizes)) if len(shares[s]) < sizes[s]]
        candidates = [s for s in open_ if s in home.get(backend, ())] or open_

        def after(s: int) -> float:
            return loads[s] + expected[i] + (costs.get(backend, 0.0) if backend not in present[s] else 0.0)

        target = min(candidates, key=lambda s: (after(s), s))
        loads[target] = after(target)
        shares[target].append(i)
        present[target].add(backend)
    # within a share the homed backends' checks run first: what worksteal moves off the end of a busy
    # worker's queue is then the others' checks, which cost the idle worker that takes them no first call
    for share in shares:
        share.sort(key=lambda i: checks[i].backend not in home)  # (stable: longest first within each part)
    return [i for share in shares for i in share]


def gated_last(order: list[int], gated: list[bool], n_workers: int) -> list[int]:
    """``order`` (item indices laid out in worksteal's shares, :func:`arrange`) with, in each share, the
    items ``gated[i]`` after the others, each group keeping its order: a worker runs what it can before it
    waits for a backend still compiling."""
    out, start = [], 0
    for size in worksteal_shares(len(order), n_workers):
        share = order[start:start + size]
        out += [i for i in share if not gated[i]] + [i for i in share if gated[i]]
        start += size
    return out
