"""Replayable failures: a small artifact per failed check, and ``jfa-conformance replay`` to rerun it.

An artifact (``<report dir>/failures/<id>.pt``, written with ``torch.save``) holds what the check ran:
the problem as a dict (its seed regenerates the inputs bit for bit, see ``make_inputs``), the check's
name and parameters (edge case, relation, ...), the backend spec string, the device and the pytest
node id. ``jfa-conformance replay <artifact> --backend X`` reruns exactly that check through the same
harness functions the spec uses, prints the verdicts and exits 1 if the check still fails (0 if it
passes now, 2 if it cannot be replayed here).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import shlex
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from . import checks
from .harness import (
    ContractError,
    Unsupported,
    ensure_supported,
)
from .problem import Problem
from .relations import RELATIONS
from .tolerance import Verdict

FORMAT = "jfa-conformance-failure/1"
FAILURES_DIR = "failures"
CORE_KEYS = ("backend", "check", "params", "problem", "device", "nodeid")


@dataclass
class Outcome:
    """What a replayed check concluded: ``ok`` and the lines that explain it."""

    ok: bool
    lines: list[str] = field(default_factory=list)

    @classmethod
    def from_verdicts(cls, verdicts: list[Verdict]) -> Outcome:
        return cls(all(v.ok for v in verdicts), [str(v) for v in verdicts])


CheckFn = Callable[[object, Problem, str, dict], Outcome]


# -- the checks, as the spec runs them on one problem --------------------------------------------------
def _verdicts(fn) -> CheckFn:
    return lambda backend, problem, device, params: Outcome.from_verdicts(fn(backend, problem, device))


def _metamorphic(backend, problem, device, params):
    return Outcome.from_verdicts(checks.relation(backend, problem, device, params.get("relation")))


def _determinism(backend, problem, device, params):
    from .spec.test_determinism import determinism_runs, repeated_runs

    ensure_supported(backend, problem)
    runs = determinism_runs()
    differences = repeated_runs(backend, problem, device, runs)
    lines = [
        f"{q}: {'identical' if not n else f'{n} elements differ'} over {runs} runs, max difference {d:.3e}"
        for q, (n, d) in differences.items()
    ]
    varies = any(n for n, _ in differences.values())
    if varies and not backend.capabilities.deterministic:
        lines.append(f"{backend.name} does not declare deterministic=True: this is reported, not failed")
    return Outcome(not (varies and backend.capabilities.deterministic), lines)


def _guarded_inputs(backend, problem, device, params):
    from .spec.test_unwritten_memory import guarded_forward_verdicts

    return Outcome.from_verdicts(guarded_forward_verdicts(backend, problem, device))


CHECKS: dict[str, CheckFn] = {
    "test_forward": _verdicts(checks.forward),
    "test_lse": _verdicts(checks.lse),
    "test_gradients": _verdicts(checks.gradients),
    "test_edge_case": _verdicts(checks.everything),
    "test_metamorphic": _metamorphic,
    "test_broadcast_q_native_matches_replicated": _verdicts(checks.broadcast_native),
    "test_determinism": _determinism,
    "test_guarded_inputs": _guarded_inputs,
}


# -- writing and reading artifacts ---------------------------------------------------------------------
def check_name(record: dict) -> str:
    """The test function's name from ``check`` (or the node id): ``test_forward[x]`` -> ``test_forward``."""
    raw = record.get("check") or str(record.get("nodeid") or "").rpartition("::")[2]
    return str(raw).partition("[")[0]


def _json_safe(value):
    return json.loads(json.dumps(value, default=str))


def _params(record: dict, check: str) -> dict:
    """The check's parameters; a relation missing from them is recovered from the node id."""
    params = dict(record.get("params") or {})
    params.pop("backend", None)
    if check == "test_metamorphic" and "relation" not in params:
        ids = str(record.get("nodeid") or "").partition("[")[2].rstrip("]")
        found = [r for r in RELATIONS if ids == r or ids.endswith("-" + r)]
        if found:
            params["relation"] = found[0]
    return _json_safe(params)


def _problem_dict(record: dict, check: str, params: dict) -> dict | None:
    problem = record.get("problem")
    if isinstance(problem, Problem):
        problem = dataclasses.asdict(problem)
    if problem is None and check == "test_edge_case" and "case" in params:
        from .spec.edge_cases import EDGE_CASES

        case = EDGE_CASES.get(params["case"])
        if case is not None:
            problem = dataclasses.asdict(case.replace(dtype=params.get("dtype", case.dtype)))
    return None if problem is None else _json_safe(problem)


def problem_from_dict(data: dict) -> Problem:
    known = {f.name for f in dataclasses.fields(Problem)}
    values = {k: v for k, v in data.items() if k in known}
    for key in ("seqlens_q", "seqlens_k"):
        values[key] = tuple(int(n) for n in values.get(key, ()))
    return Problem(**values)


def write_artifact(report_dir, record: dict) -> Path | None:
    """Write ``record``'s failure under ``<report_dir>/failures/`` and return the path, or None when the
    check cannot be replayed (no problem to regenerate, or a check replay does not know)."""
    check = check_name(record)
    if check not in CHECKS:
        return None
    params = _params(record, check)
    problem = _problem_dict(record, check, params)
    if problem is None:
        return None
    artifact = {
        "format": FORMAT,
        "backend": str(record.get("backend", "")),
        "check": check,
        "params": params,
        "problem": problem,
        "device": str(record.get("device") or "cpu"),
        "nodeid": str(record.get("nodeid") or ""),
        "extra": _json_safe({k: v for k, v in record.items() if k not in CORE_KEYS}),
    }
    digest = hashlib.sha1(
        json.dumps([artifact[k] for k in ("backend", "check", "params", "problem", "device")], sort_keys=True).encode()
    ).hexdigest()[:10]
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{check}-{artifact['backend'].rpartition(':')[2]}")[:80]
    path = Path(report_dir) / FAILURES_DIR / f"{label}-{digest}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(artifact, path)
    return path


def record_for_item(item) -> dict:
    """The record of a spec test item, as :func:`write_artifact` takes it: backend spec string, check,
    parameters, the last problem the check ran (after a failure, the shrunk counterexample), device."""
    from .plugin import CHECK_LOG, default_device

    callspec = getattr(item, "callspec", None)
    params = dict(callspec.params) if callspec else {}
    backend = params.pop("backend", None)
    spec = getattr(backend, "name", "")
    # ``--backend`` values and the selected backends line up, so the spec string the user gave (a
    # ``module:attr`` reference, say) is recovered, not only the backend's display name.
    chosen = getattr(item.config, "_jfa_backends", [])
    for given, (selected, _) in zip(item.config.getoption("backend") or [], chosen):
        if selected is backend:
            spec = given
    log = item.stash.get(CHECK_LOG, None)
    problem = log.last_problem if log is not None else None
    return {
        "backend": spec,
        "check": getattr(item, "originalname", item.name),
        "params": params,
        "problem": None if problem is None else dataclasses.asdict(problem),
        "device": item.config.getoption("device") or default_device(),
        "nodeid": item.nodeid,
    }


def replay_command(path, backend: str) -> str:
    """The one line that reproduces the failure stored at ``path``."""
    return f"jfa-conformance replay {shlex.quote(str(path))} --backend {shlex.quote(backend)}"


def load_artifact(path) -> dict:
    data = torch.load(Path(path), map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a jfa-conformance failure artifact (format {FORMAT})")
    return data


def replay(artifact: dict, backend_spec: str | None = None, device: str | None = None) -> Outcome:
    """Rerun the artifact's check; exceptions from the backend become a failed outcome with the traceback.
    Raises :class:`Unsupported` when the check cannot run here."""
    from backends import registry

    spec = backend_spec or artifact["backend"]
    if not spec:
        raise Unsupported("the artifact names no backend: pass --backend")
    backend = registry.resolve(spec)
    device = device or artifact.get("device") or "cpu"
    reason = backend.unavailable_reason(device)
    if reason:
        raise Unsupported(f"{backend.name} cannot run on {device} here: {reason}")
    problem = problem_from_dict(artifact["problem"])
    check = CHECKS[artifact["check"]]
    try:
        return check(backend, problem, device, dict(artifact.get("params") or {}))
    except Unsupported:
        raise
    except (AssertionError, ContractError) as exc:
        return Outcome(False, [f"{type(exc).__name__}: {exc}"])
    except Exception:  # a crash of the backend is a failure of the check, as it was in the run
        return Outcome(False, traceback.format_exc().rstrip().splitlines())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jfa-conformance replay", description="Rerun one failed check from its artifact.")
    parser.add_argument("artifact", help="a failures/<id>.pt file written by a conformance run")
    parser.add_argument("--backend", default=None, help="backend to run (default: the one that failed)")
    parser.add_argument("--device", default=None, help="device to run on (default: the one the failure happened on)")
    args = parser.parse_args(argv)
    try:
        artifact = load_artifact(args.artifact)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"cannot read {args.artifact}: {exc}", file=sys.stderr)
        return 2
    problem = problem_from_dict(artifact["problem"])
    backend = args.backend or artifact["backend"]
    device = args.device or artifact["device"]
    params = ", ".join(f"{k}={v}" for k, v in artifact["params"].items())
    print(f"replaying {artifact['check']}{f' ({params})' if params else ''} of {backend} on {device}")
    print(f"  problem: {problem!r}")
    if artifact.get("nodeid"):
        print(f"  originally: {artifact['nodeid']}")
    try:
        outcome = replay(artifact, args.backend, args.device)
    except (Unsupported, ValueError) as exc:
        print(f"cannot replay: {exc}", file=sys.stderr)
        return 2
    for line in outcome.lines:
        print(f"  {line}")
    print("PASS: the check passes now" if outcome.ok else "FAIL: the check still fails")
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
