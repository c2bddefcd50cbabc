"""Replayable failures: per failed check an artifact, a standalone reproducer script, and
``jfa-conformance replay`` to rerun it.

An artifact (``<report dir>/failures/<id>.pt``, written with ``torch.save``) holds what the check ran:
the problem as a dict (its seed regenerates the inputs bit for bit, see ``make_inputs``), the check's
name and parameters (edge case, relation, ...), the backend spec string, the device and the pytest
node id. ``jfa-conformance replay <artifact> --backend X`` reruns exactly that check through the same
harness functions the spec uses, prints the verdicts and exits 1 if the check still fails (0 if it
passes now, 2 if it cannot be replayed here).

Beside it, ``failures/<id>.py`` is the same failure as one Python file that needs nothing from the report
directory (what one attaches to an upstream bug report): its docstring says what failed, on which problem
and machine, and running it rebuilds the problem's inputs, prints them, calls the backend and judges the
result against the float64 oracle (exit 1: reproduced, 0: passes now, 2: cannot run here). A check whose
process died (crash, timeout) is reproduced by calling the backend on the problem it was running; any
other by rerunning the check. Every path a report stores is relative to the report directory, so a
moved or downloaded report keeps working.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import pprint
import re
import shlex
import shutil
import sys
import textwrap
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
from .problem import Problem, expand_lengths
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
    "test_offsets_rewritten_between_calls": _verdicts(checks.offsets_rewritten),
    "test_edge_case": _verdicts(checks.everything),
    "test_kernel_configs": _verdicts(checks.everything),
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


def _edge_case_problem(check: str, params: dict) -> Problem | None:
    """The fixed problem an edge case runs (at the record's dtype); None for other checks."""
    if check != "test_edge_case" or "case" not in params:
        return None
    from .spec.edge_cases import EDGE_CASES

    case = EDGE_CASES.get(params["case"])
    return None if case is None else case.replace(dtype=params.get("dtype", case.dtype))


def _problem_dict(record: dict, check: str, params: dict) -> dict | None:
    """The problem to rebuild: an edge case's own (it is what the check ran, layouts included, whatever the
    record kept of it), else the record's."""
    problem = _edge_case_problem(check, params) or record.get("problem")
    if isinstance(problem, Problem):
        problem = dataclasses.asdict(problem)
    return None if problem is None else _json_safe(problem)


def problem_from_dict(data: dict) -> Problem:
    known = {f.name for f in dataclasses.fields(Problem)}
    values = {k: v for k, v in data.items() if k in known}
    for key in ("seqlens_q", "seqlens_k"):
        values[key] = expand_lengths(values.get(key, ()))
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
    from . import registry

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


# -- reproducers in the report ---------------------------------------------------------------------------
REPRODUCED_OUTCOMES = ("fail", "crash", "timeout")
DEVICE_FAULT_PHASE = re.compile(r"DeviceFault: \S+ (forward|backward):")


def artifact_record(record: dict, backend_spec: str) -> dict:
    """A report record as :func:`write_artifact` takes it: the backend as the user named it, the check,
    and all its parameters (the dtype included)."""
    params = dict(record.get("params") or {})
    if record.get("dtype"):
        params["dtype"] = record["dtype"]
    return {**record, "backend": backend_spec, "check": record.get("test") or check_name({"nodeid": record.get("id")}),
            "nodeid": record.get("id"), "params": params}


def _existing_artifact(report_dir: Path, replay_info: dict) -> Path | None:
    """The artifact a record names, in the report's ``failures/`` (copied there when the record names a file
    elsewhere: relative to the directory a run was started from, or absolute), or None."""
    given = replay_info.get("artifact")
    if not given:
        return None
    home = report_dir / FAILURES_DIR / Path(given).name
    for candidate in (home, report_dir / given):
        if candidate.is_file():
            if candidate.resolve() != home.resolve():  # it lives elsewhere: the report gets its own copy
                home.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(candidate, home)
            return home
    return None


def pytest_command(record: dict, backend_spec: str, run: dict | None = None) -> str | None:
    """The pytest command that runs the failed check's node (from a jfa-conformance checkout)."""
    nodeid = record.get("id")
    if not nodeid or "::" not in str(nodeid):
        return None
    run = run or {}
    parts = ["python", "-m", "pytest", str(nodeid), "-p", "conformance.plugin", "--backend", backend_spec]
    if record.get("device"):
        parts += ["--device", str(record["device"])]
    if run.get("profile"):
        parts += ["--hypothesis-profile", str(run["profile"]).split(",")[0]]
    if isinstance(run.get("seed"), int):
        parts += [f"--hypothesis-seed={run['seed']}"]
    return shlex.join(parts)


def reproducer_mode(record: dict) -> tuple[str, bool]:
    """``(mode, gradients)``: ``call`` the backend on the problem a dead process was running (the check
    around that call cannot be rebuilt: hypothesis drew it), or rerun the ``check`` (a failure's, or an edge
    case's, whose fixed problem is the one that ran); whether the call includes the backward."""
    check = record.get("test") or check_name({"nodeid": record.get("id")})
    if record.get("problem_source") != "running" or check == "test_edge_case":  # an edge case reruns exactly
        return "check", False
    phase = DEVICE_FAULT_PHASE.search(record.get("message") or "")
    gradients = check == "test_gradients" or bool(phase and phase.group(1) == "backward")
    return "call", gradients


SOURCES = {
    "shrunk": "hypothesis's minimal counterexample",
    "running": "the call in flight when the check's process died: the shapes and options are the ones that failed, "
               "the input values come from the problem's seed and may differ from the run's",
    "failing example": "the failing example",
    "last example": "the last example",
}
TEST_TOOLS = ("hypothesis", "pytest", "pytest-xdist", "pytest-benchmark", "pytest-timeout")


def _docstring(record: dict, spec: dict, run: dict, summary_line: str) -> str:
    env = run.get("environment") or {}
    problem = problem_from_dict(spec["problem"])
    what = (f"{record.get('backend')} · {record.get('feature') or spec['check']}"
            + (f" · {record['dtype']}" if record.get("dtype") else "") + f" ({record.get('outcome')})")
    source = SOURCES.get(record.get("problem_source"), "the check's problem")
    lines = [f"Reproducer: {what}", "", *textwrap.wrap(summary_line, 100), "",
             f"Check:    {record.get('id')}", f"Problem:  {problem!r}",
             *textwrap.wrap(f"({source})", 100, initial_indent=" " * 10, subsequent_indent=" " * 10)]
    if env:
        device = env.get("device_name") or env.get("device")
        cc = f" (compute capability {env['compute_capability']})" if env.get("compute_capability") else ""
        versions = ", ".join(f"{k} {v}" for k, v in (env.get("packages") or {}).items() if k not in TEST_TOOLS)
        lines += [f"Recorded: {device}{cc}; python {env.get('python')}; {versions or 'torch ' + str(env.get('torch'))}"]
        if env.get("git_commit"):
            lines += [" " * 10 + f"jfa-conformance commit {env['git_commit'][:12]}"
                      + (" with uncommitted changes" if env.get("git_dirty") else "")]
    name = spec["script"]
    lines += ["", "Needs jfa-conformance and the backend's own package installed, nothing from the report directory:",
              f"    python {name}                      exit 1: reproduced, 0: passes now, 2: cannot run here",
              f"    python {name} --backend reference  the same problem on another backend",
              f"    python {name} --device cuda:1      on another device", ""]
    if spec["mode"] == "call":
        lines += textwrap.wrap(
            "It calls the backend once on the problem" + (", forward and backward," if spec["gradients"] else "")
            + " and judges the result against the float64 oracle; CUDA_LAUNCH_BLOCKING=1 makes a device fault "
            "surface at the kernel launch that caused it.", 100)
    else:
        lines += textwrap.wrap(f"It reruns the check ({spec['check']}) on the problem as the run did and judges the "
                               "result against the float64 oracle.", 100)
    text = "\n".join(line.rstrip() for line in lines)
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def script_text(record: dict, spec: dict, run: dict | None, summary_line: str) -> str:
    """The source of a standalone reproducer (see the module docstring)."""
    data = pprint.pformat({k: v for k, v in spec.items() if k != "script"}, width=110, sort_dicts=False, compact=True)
    return "\n".join([
        "#!/usr/bin/env python3",
        f'"""{_docstring(record, spec, run or {}, summary_line)}',
        '"""',
        "import os",
        "import sys",
        "",
        f"REPRODUCER = {data}",
        "",
        'if __name__ == "__main__":',
        "    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)",
        '    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")',
        "    from conformance.replay import reproducer_main",
        "",
        "    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))",
        "",
    ])


def write_reproducer(report_dir, record: dict, backend_spec: str | None = None, run: dict | None = None,
                     summary_line: str | None = None) -> dict | None:
    """The record's replay artifact and standalone script under ``<report_dir>/failures/`` (the artifact
    kept when it is already there), and the ``replay`` entry for the record, its paths relative to
    ``report_dir``; None when the failure cannot be rebuilt (no problem, or a check replay does not know)."""
    report_dir = Path(report_dir)
    previous = record.get("replay") or {}
    spec_name = backend_spec or previous.get("backend") or record.get("backend") or ""
    artifact = _existing_artifact(report_dir, previous)
    if artifact is None:
        artifact = write_artifact(report_dir, artifact_record(record, spec_name))
    if artifact is None:
        return None
    data = load_artifact(artifact)
    mode, gradients = reproducer_mode(record)
    relative = f"{FAILURES_DIR}/{artifact.name}"
    script = f"{FAILURES_DIR}/{artifact.stem}.py"
    spec = {"backend": spec_name, "device": data.get("device") or "cpu", "check": data["check"],
            "params": data.get("params") or {}, "problem": _json_safe(dataclasses.asdict(problem_from_dict(data["problem"]))),
            "mode": mode, "gradients": gradients,
            "nodeid": data.get("nodeid") or record.get("id"), "outcome": record.get("outcome"),
            "script": Path(script).name}
    if summary_line is None:
        from .reporting.triage import summary
        summary_line = summary(record)
    text = script_text(record, spec, run, summary_line)
    path = report_dir / script
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
        path.chmod(0o755)
    return {"artifact": relative, "script": script, "backend": spec_name,
            "command": replay_command(relative, spec_name), "pytest": pytest_command(record, spec_name, run)}


def write_reproducers(report_dir, report: dict) -> int:
    """Give every failed, crashed or timed-out record of ``report`` its artifact and script in
    ``<report_dir>/failures/`` (``failures/`` exists afterwards even when nothing failed) and a ``replay``
    entry relative to the report directory; returns how many records have one. A reproducer that cannot be
    written is noted in the record's ``replay.error``, never raised: the report matters more."""
    (Path(report_dir) / FAILURES_DIR).mkdir(parents=True, exist_ok=True)
    written = 0
    for record in report.get("records", []):
        if record.get("outcome") not in REPRODUCED_OUTCOMES:
            continue
        try:
            entry = write_reproducer(report_dir, record, run=report.get("run"))
        except Exception as exc:  # noqa: BLE001 - a reproducer bug must not lose the report
            entry = {"artifact": None, "command": None, "error": f"{type(exc).__name__}: {exc}"}
        if entry is not None:
            record["replay"] = entry
            written += bool(entry.get("artifact"))
        else:
            record.pop("replay", None)
    return written


def describe_inputs(args) -> list[str]:
    """The packed call's tensors and options, as one would write them into a bug report."""
    def tensor(name, t):
        dtype = str(t.dtype).removeprefix("torch.")
        offset = f", storage offset {t.storage_offset()}" if t.storage_offset() else ""
        return f"{name}: shape {tuple(t.shape)}, {dtype}, stride {tuple(t.stride())}{offset}"

    def listed(t):
        values = t.tolist()
        shown = str(values) if len(values) <= 24 else f"{values[:12]} ... {values[-4:]} ({len(values)} entries)"
        kind = str(t.dtype).removeprefix("torch.") + ("" if t.stride(0) == 1 else f", stride {t.stride(0)}")
        return f"{shown} ({kind})"

    return [tensor("q", args.q), tensor("k", args.k), tensor("v", args.v),
            f"cu_seqlens_q: {listed(args.cu_seqlens_q)}", f"cu_seqlens_k: {listed(args.cu_seqlens_k)}",
            f"max_seqlen_q={args.max_seqlen_q}, max_seqlen_k={args.max_seqlen_k}, causal={args.causal!r}, "
            f"softmax_scale={args.softmax_scale!r}, broadcast_q={args.broadcast_q}"]


def reproduce(spec: dict, backend_spec: str | None = None, device: str | None = None) -> Outcome:
    """Run a reproducer: the backend called once on the problem (``mode == "call"``) or the check rerun;
    a backend exception, device fault included, is a failed outcome with its text."""
    if spec.get("mode") != "call":
        return replay(spec, backend_spec, device)
    from . import registry

    from .harness import judge_forward, judge_gradients, run_backend

    backend = registry.resolve(backend_spec or spec["backend"])
    device = device or spec.get("device") or "cpu"
    reason = backend.unavailable_reason(device)
    if reason:
        raise Unsupported(f"{backend.name} cannot run on {device} here: {reason}")
    problem = problem_from_dict(spec["problem"])
    gradients = bool(spec.get("gradients")) and backend.capabilities.backward
    try:
        run = run_backend(backend, problem, device, gradients=gradients)
    except (Unsupported, KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001 - DeviceFault is a BaseException; any error is the reproduction
        return Outcome(False, traceback.format_exc().rstrip().splitlines())
    verdicts = judge_forward(problem, run) + (judge_gradients(problem, run) if gradients else [])
    return Outcome.from_verdicts(verdicts)


def reproducer_main(spec: dict, argv: list[str] | None = None) -> int:
    """The command line of a ``failures/<id>.py`` script."""
    parser = argparse.ArgumentParser(description=f"Reproduce {spec['check']} of {spec['backend']} "
                                                 f"({spec.get('outcome')}); exit 1 when it fails again.")
    parser.add_argument("--backend", default=None, help=f"backend to run (default: {spec['backend']})")
    parser.add_argument("--device", default=None, help=f"device (default: {spec.get('device')})")
    args = parser.parse_args(argv)
    from .problem import make_inputs

    problem = problem_from_dict(spec["problem"])
    device = args.device or spec.get("device") or "cpu"
    backend = args.backend or spec["backend"]
    how = "one call" if spec.get("mode") == "call" else "the check"
    print(f"{spec['check']} of {backend} on {device} ({how}{', forward and backward' if spec.get('gradients') else ''})")
    print(f"  problem: {problem!r}")
    gpu = f", {torch.cuda.get_device_name(device)}" if device.startswith("cuda") and torch.cuda.is_available() else ""
    print(f"  torch {torch.__version__}{gpu}")
    try:
        for line in describe_inputs(make_inputs(problem, "cpu")):
            print(f"  {line}")
        outcome = reproduce(spec, args.backend, args.device)
    except (Unsupported, ValueError, ImportError) as exc:
        print(f"cannot run here: {exc}", file=sys.stderr)
        return 2
    for line in outcome.lines:
        print(f"  {line}")
    print("PASS: it does not fail here" if outcome.ok else "REPRODUCED: it fails again")
    return 0 if outcome.ok else 1


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
