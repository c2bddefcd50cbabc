"""pytest plugin that turns every spec check into a report record (see reports/README.md).

Loaded by ``jfa-conformance run`` with ``-p conformance.recorder``; it only writes anything when
``--jfa-records PATH`` is given. Where records are made:

* in the process that ran the check (the xdist worker, or pytest itself without xdist), from the test
  outcome and the check's :class:`~conformance.checklog.CheckLog`; the record rides on the test report
  (``report.jfa_record``), which xdist serialises to the controller;
* in the controller, for checks whose worker died (segfault, abort, a hang killed by pytest-timeout's
  thread method): xdist reports "worker crashed while running ...", and the worker's *flight file* says
  which problem the backend was running and when the check started, so the record is ``crash`` or
  ``timeout`` with the problem that triggered it. xdist then starts a fresh worker for what remains.

The controller appends records as JSON lines to ``--jfa-records`` as they arrive (the CLI tails that file
for its live view) and, at the end, marks every collected check that never reported as ``not-run``.

Device pinning: ``jfa-conformance run --gpus`` splits the xdist workers over the GPUs, each set started with
``CUDA_VISIBLE_DEVICES`` and ``JFA_CONFORMANCE_DEVICE_INDEX`` set in its environment (xdist ``--tx env:``
specs, which survive worker restarts); the record carries that index.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import time
from pathlib import Path

import pytest

from . import containment, jit_watch
from .checklog import CheckLog
from .harness import device_error
from .problem import Problem, problem_of_args

RECORD_ATTR = "jfa_record"
DEVICE_INDEX_ENV = "JFA_CONFORMANCE_DEVICE_INDEX"
OUTCOMES = ("pass", "fail", "unsupported", "expected-fail", "crash", "timeout", "not-run")
FAILING_OUTCOMES = ("fail", "crash", "timeout", "not-run")
TIMEOUT_MESSAGE = re.compile(r"Timeout \(>[\d.]+s\) from pytest-timeout")
# hypothesis prints each labelled draw, possibly over several lines: "Draw 1 (problem): Problem(...)"
DRAWN_PROBLEM = re.compile(r"Draw \d+ \(problem\): (Problem\((?:[^()]|\([^()]*\))*\))")
MESSAGE_LIMIT = 4000


def pytest_addoption(parser):
    group = parser.getgroup("jfa-conformance")
    group.addoption("--jfa-records", default=None, metavar="PATH",
                    help="append one JSON record per spec check to PATH (JSON lines)")
    group.addoption("--jfa-flight-dir", default=None, metavar="DIR",
                    help="where each worker notes the check and problem it is running (crash diagnosis)")
    group.addoption("--dtype", action="append", default=[], metavar="DTYPE",
                    help="only check these dtypes (repeatable; default: every dtype a backend supports)")


# -- helpers shared with the CLI -------------------------------------------------------------------------
def _lengths_value(node: ast.expr) -> list[int]:
    """A lengths literal as ``Problem.__repr__`` prints it: ``[3, 5]`` or ``[1] * 65537 + [2] * 3``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _lengths_value(node.left) + _lengths_value(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return list(ast.literal_eval(node.left)) * int(ast.literal_eval(node.right))
    return list(ast.literal_eval(node))


def problem_from_repr(text: str) -> Problem | None:
    """Parse ``Problem(...)`` as printed by ``Problem.__repr__`` (hypothesis prints drawn problems so)."""
    try:
        call = ast.parse(text.strip(), mode="eval").body
        if not isinstance(call, ast.Call) or getattr(call.func, "id", None) != "Problem":
            return None
        lengths = ("seqlens_q", "seqlens_k")
        kwargs = {kw.arg: _lengths_value(kw.value) if kw.arg in lengths else ast.literal_eval(kw.value)
                  for kw in call.keywords}
        for key in ("seqlens_q", "seqlens_k"):
            kwargs[key] = tuple(kwargs.get(key, ()))
        return Problem(**kwargs)
    except (SyntaxError, ValueError, TypeError):
        return None


def split_params(param_id: str, backend_names) -> tuple[str, str]:
    """``'reference-online-tile_edges-float16'`` -> ``('reference-online', 'tile_edges-float16')``; the
    backend id comes first and may itself contain dashes, so the longest known name wins."""
    for name in sorted(backend_names, key=len, reverse=True):
        if param_id == name or param_id.startswith(name + "-"):
            return name, param_id[len(name) + 1:]
    head, _, rest = param_id.partition("-")
    return head, rest


def check_identity(nodeid: str, backend_names=()) -> dict:
    """backend / test / feature of a check from its node id alone (for checks that never reported)."""
    name = nodeid.split("::")[-1]
    test, _, params = name.partition("[")
    backend, rest = split_params(params.rstrip("]"), backend_names)
    parts = [p for p in rest.split("-") if p]
    dtype = parts.pop() if parts and parts[-1] in ("float32", "float16", "bfloat16") else None
    return {"backend": backend, "test": test, "feature": feature_name(test, parts), "dtype": dtype}


def feature_name(test: str, param_values) -> str:
    """The spec test name without ``test_``, plus its non-dtype parameters: ``metamorphic:permute_batch``."""
    return ":".join([test.removeprefix("test_"), *map(str, param_values)])


# -- the check's record, made where the check ran --------------------------------------------------------
def _backend_of(item):
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else callspec.params.get("backend")


def _identity(item) -> dict:
    params = {k: v for k, v in item.callspec.params.items() if k != "backend"}
    dtype = params.pop("dtype", None)
    test = getattr(item, "originalname", item.name.partition("[")[0])
    return {"backend": _backend_of(item).name, "test": test, "feature": feature_name(test, params.values()),
            "dtype": dtype, "params": {k: str(v) for k, v in params.items()}}


def _verdict_dict(v) -> dict:
    return {"quantity": v.quantity, "observed": v.observed, "allowed": v.allowed,
            "reference_error": v.reference_error, "budget_used": v.budget_used, "ok": v.ok}


def _short(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT] + "\n[...]"


def classify(report, message: str) -> tuple[str, str | None]:
    """``(outcome, reason)`` of a finished pytest phase."""
    if report.skipped:
        if hasattr(report, "wasxfail"):
            return "expected-fail", report.wasxfail or "expected failure"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        if reason.startswith(containment.NOT_RUN_PREFIX):
            return "not-run", reason.removeprefix(containment.NOT_RUN_PREFIX)
        return "unsupported", reason.removeprefix("unsupported: ")
    if report.passed:
        return "pass", ("expected to fail but passed: " + report.wasxfail) if hasattr(report, "wasxfail") else None
    if TIMEOUT_MESSAGE.search(message):
        return "timeout", TIMEOUT_MESSAGE.search(message).group(0)
    fault = device_error(message)
    if fault:
        return "crash", "device error: " + fault
    if report.when != "call":
        return "fail", f"error in {report.when}"
    return "fail", None


def build_record(item, report, call) -> dict:
    log: CheckLog | None = item.stash.get(_check_log_key(), None)
    message = ""
    if report.failed:
        message = call.excinfo.exconly() if call.excinfo is not None else report.longreprtext
    outcome, reason = classify(report, report.longreprtext if report.failed else message)
    if report.failed and outcome == "fail" and reason is None:
        reason = message.strip().splitlines()[0][:300] if message.strip() else "failed"
    record = {
        "id": item.nodeid, **_identity(item), "outcome": outcome, "reason": reason,
        "message": _short(message) if message else None,
        "duration_s": round(report.duration, 4), "started_at": round(call.start, 3),
        "examples": log.examples if log else 0,
        "unsupported_examples": dict(log.unsupported) if log else {},
        "axes": log.axes if log else {}, "kernel_configs": log.configs if log else {},
    }
    verdicts = []
    if log:
        failed_in_verify = log.last_verdicts and not all(v.ok for v in log.last_verdicts)
        verdicts = log.last_verdicts if report.failed and failed_in_verify else list(log.worst.values())
    record["verdicts"] = [_verdict_dict(v) for v in verdicts]
    worst = max(verdicts, key=lambda v: v.budget_used, default=None)
    record.update(
        quantity=worst.quantity if worst else None,
        observed_error=worst.observed if worst else None,
        allowed_error=worst.allowed if worst else None,
        budget_used=worst.budget_used if worst else None,
    )
    problem, source = None, None
    if report.failed:
        drawn = DRAWN_PROBLEM.findall(message) or DRAWN_PROBLEM.findall(report.longreprtext)
        problem, source = (problem_from_repr(drawn[-1]), "shrunk") if drawn else (None, None)
        if problem is None and log and log.last_verdicts and not all(v.ok for v in log.last_verdicts):
            problem, source = log.last_problem, "failing example"
        if problem is None and _FLIGHT.get("problem"):
            problem, source = Problem(**_FLIGHT["problem"]), "running"
    elif log and log.last_problem is not None:
        problem, source = log.last_problem, "last example"
    record["problem"] = problem.summary() if problem else None
    record["problem_source"] = source
    record["counterexample"] = repr(problem) if report.failed and problem else None
    record.update(_device_fields(item.config))
    before = item.stash.get(_JIT_BEFORE, None)
    # Triton kernels and torch.compile graphs built during the check: what the warm-up did not prepare
    record["jit"] = jit_watch.since(before) if before is not None else None
    return record


_JIT_BEFORE = pytest.StashKey[tuple]()


def _check_log_key():
    from .plugin import CHECK_LOG
    return CHECK_LOG


def _device_fields(config) -> dict:
    device = config.getoption("device") or _default_device()
    index = os.environ.get(DEVICE_INDEX_ENV)
    if index is None and device.startswith("cuda"):
        import torch
        index = torch.device(device).index if torch.device(device).index is not None else torch.cuda.current_device()
    return {"device": device, "device_index": None if index is None else int(index),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}


def _default_device() -> str:
    from .plugin import default_device
    return default_device()


# -- flight file: what this process is running right now -------------------------------------------------
_FLIGHT: dict = {}


def _flight_path(config) -> Path | None:
    directory = config.getoption("jfa_flight_dir", default=None)
    if not directory:
        return None
    return Path(directory) / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.json"


def _write_flight() -> None:
    path = _FLIGHT.get("path")
    if path is None:
        return
    # Plain write, no fsync: the page cache outlives a crashed process, which is all we need.
    data = json.dumps({k: v for k, v in _FLIGHT.items() if k != "path"}).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def note_probe(why: str | None, seconds: float | None) -> None:
    """Say in the flight file that this process is probing a suspect backend (``why`` it is suspect), so
    that a watchdog exit reads as the probe's verdict rather than as a crash of the check."""
    if why is None:
        _FLIGHT.pop("probe", None)
    else:
        _FLIGHT["probe"] = {"why": why, "seconds": seconds, "started": time.time()}
    _write_flight()


def note_waiting(config, backend: str) -> None:
    """Say in the flight file that this process waits for ``backend``'s warm-up (the live view shows it)."""
    path = _flight_path(config)
    if path is not None:
        _FLIGHT.clear()
        _FLIGHT.update(path=path, waiting=backend, backend=backend, started=time.time())
        _write_flight()


def _watch(backend) -> None:
    """Note each forward call's problem in the flight file before the backend runs it."""
    if getattr(backend, "_jfa_watched", False):
        return
    original = backend.forward

    def forward(args):
        try:
            _FLIGHT["problem"] = dataclasses.asdict(problem_of_args(args))
            _write_flight()
        except Exception:  # noqa: BLE001 - diagnosis must never change what the backend sees
            pass
        return original(args)

    try:
        backend.forward, backend._jfa_watched = forward, True
    except AttributeError:
        pass


def _timeout_of(item) -> float | None:
    try:
        from pytest_timeout import _get_item_settings
        return _get_item_settings(item).timeout or None
    except Exception:  # noqa: BLE001 - pytest-timeout absent or changed: no timeout diagnosis
        return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    backend = _backend_of(item)
    if backend is not None:
        jit_watch.install()  # (once Triton is imported; torch.compile's tallies need nothing installed)
        item.stash[_JIT_BEFORE] = jit_watch.totals()
    path = _flight_path(item.config)
    if backend is not None and path is not None:
        _FLIGHT.clear()
        _FLIGHT.update(path=path, id=item.nodeid, **_identity(item), started=time.time(),
                       timeout=_timeout_of(item), problem=None, **_device_fields(item.config))
        _write_flight()
        _watch(backend)
    try:
        return (yield)
    finally:
        _FLIGHT.pop("problem", None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if _backend_of(item) is None or not item.config.getoption("jfa_records", default=None) and \
            not item.config.getoption("jfa_flight_dir", default=None):
        return report
    relevant = call.when == "call" or (call.when == "setup" and not report.passed) or \
        (call.when == "teardown" and report.failed)
    if relevant:
        setattr(report, RECORD_ATTR, build_record(item, report, call))
        # A device error leaves its process suspect on any device (state a backend keeps between calls
        # included): the rest of the run gets a fresh process, so the next check is judged on its own.
        if report.failed and getattr(report, RECORD_ATTR)["outcome"] == "crash":
            item.config._jfa_poisoned = True
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_logreport(report):
    result = yield
    config = _CONFIG.get("config")
    if config is None:
        return result
    if _is_worker(config):
        # After a device error xdist replaces this worker, once this check's last report has gone out.
        if report.when == "teardown" and getattr(config, "_jfa_poisoned", False):
            time.sleep(0.5)
            os._exit(70)
        return result
    _controller_receive(config, report)
    return result


# -- controller side ------------------------------------------------------------------------------------
_CONFIG: dict = {}


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


class RecordSink:
    """Appends records to the JSON-lines file and remembers which checks have a record."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the session
        self.seen: set[str] = set()
        self.collected: list[str] | None = None
        self.backend_names: set[str] = set()

    def write(self, line: dict) -> None:
        self.file.write(json.dumps(line, default=str) + "\n")
        self.file.flush()

    def record(self, record: dict) -> None:
        if record["id"] in self.seen:
            return
        self.seen.add(record["id"])
        self.backend_names.add(record["backend"])
        self.write({"kind": "record", **record})


def pytest_configure(config):
    _CONFIG["config"] = config
    _restrict_dtypes(config)
    path = config.getoption("jfa_records", default=None)
    if path and not _is_worker(config):
        config._jfa_sink = RecordSink(path)


def _restrict_dtypes(config) -> None:
    """``--dtype``: narrow each backend's declared dtypes, so strategies only draw those."""
    wanted = config.getoption("dtype", default=None)
    if not wanted:
        return
    from .plugin import selected_backends
    chosen = []
    for backend, why in selected_backends(config):
        if hasattr(backend, "capabilities"):
            kept = tuple(d for d in backend.capabilities.dtypes if d in wanted)
            backend.capabilities = dataclasses.replace(backend.capabilities, dtypes=kept)
        chosen.append((backend, why))
    config._jfa_backends = chosen


def pytest_collection_modifyitems(config, items):
    wanted = config.getoption("dtype", default=None)
    if not wanted:
        return
    kept, dropped = [], []
    for item in items:
        dtype = getattr(item, "callspec", None) and item.callspec.params.get("dtype")
        (dropped if dtype is not None and dtype not in wanted else kept).append(item)
    for item in kept:
        backend = _backend_of(item)
        if backend is not None and not getattr(backend.capabilities, "dtypes", True):
            item.add_marker(pytest.mark.skip(reason=f"unsupported: {backend.name} supports none of {', '.join(wanted)}"))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_collection_finish(session):
    sink = getattr(session.config, "_jfa_sink", None)
    if sink is not None:
        _note_collected(sink, [item.nodeid for item in session.items if _backend_of(item) is not None],
                        {_backend_of(item).name for item in session.items if _backend_of(item) is not None})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    config = _CONFIG.get("config")
    sink = getattr(config, "_jfa_sink", None)
    if sink is not None and sink.collected is None:
        _note_collected(sink, [i for i in ids if "[" in i and "/spec/" in "/" + i], _known_backend_names(config))


def _known_backend_names(config) -> set[str]:
    """The backend names node ids may hold: the registry's, and those of the backends the run names (a
    'file.py:attr' or 'module:attr' backend is known by its own name in node ids)."""
    names = set(config.getoption("backend", default=[]) or [])
    try:
        from . import registry
    except Exception:  # noqa: BLE001 - names only help parse node ids
        return names
    try:
        names.update(registry.known_names())
    except Exception:  # noqa: BLE001 - as above
        pass
    for spec in list(names):
        try:
            names.add(registry.resolve(spec).name)
        except Exception:  # noqa: BLE001 - as above
            pass
    return names


def _note_collected(sink: RecordSink, ids: list[str], backend_names) -> None:
    sink.collected = ids
    sink.backend_names.update(backend_names)
    checks = [{"id": i, **check_identity(i, sink.backend_names)} for i in ids]
    sink.write({"kind": "collected", "checks": checks})


def _controller_receive(config, report) -> None:
    sink = getattr(config, "_jfa_sink", None)
    if sink is None:
        return
    record = getattr(report, RECORD_ATTR, None)
    if record is None and report.failed and report.when not in ("setup", "call", "teardown"):
        record = crash_record(config, report, sink.backend_names)
    if record is None:
        return
    sink.record(record)
    flight_dir = config.getoption("jfa_flight_dir", default=None)
    where = f"{record['backend']} hung in {record.get('feature') or record['id']}" + \
        (f" [{record['dtype']}]" if record.get("dtype") else "")
    streaks = config.__dict__.setdefault("_jfa_crash_streaks", {})
    streak = streaks.setdefault(record["backend"], [])
    if record["outcome"] == "crash":
        streak.append(record.get("feature") or record["id"])
    elif record["outcome"] in ("pass", "fail", "expected-fail"):
        streak.clear()
    if record["outcome"] == "timeout":
        containment.mark(flight_dir, record["backend"], "suspect", where)
    elif record["outcome"] == "not-run" and "probe" in (record.get("reason") or ""):
        containment.mark(flight_dir, record["backend"], "dead", record["reason"].partition(";")[0])
    elif len(streak) >= containment.CRASH_STREAK:
        containment.mark(flight_dir, record["backend"], "suspect",
                         f"{record['backend']} crashed in each of its last {len(streak)} checks "
                         f"({', '.join(streak[-containment.CRASH_STREAK:])})")


def crash_record(config, report, backend_names) -> dict:
    """The record of a check whose worker died while running it."""
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
    flight = read_flight(config.getoption("jfa_flight_dir", default=None), worker, report.nodeid)
    identity = check_identity(report.nodeid, backend_names)
    outcome, reason = "crash", "the process running the check died (segfault, abort or exit); a fresh one took over"
    if flight:
        identity = {k: flight.get(k, identity.get(k)) for k in ("backend", "test", "feature", "dtype", "params")}
        elapsed = time.time() - flight.get("started", time.time())
        if flight.get("timeout") and elapsed >= flight["timeout"]:
            outcome = "timeout"
            reason = f"no result after {flight['timeout']:g} s (per-check timeout); the process was stopped"
    if flight and flight.get("probe"):
        probe = flight["probe"]
        outcome = "not-run"
        if time.time() - probe["started"] >= probe["seconds"] - 1:
            reason = f"{probe['why']}; a {probe['seconds']:g} s probe before this check got no answer either"
        else:
            reason = f"{probe['why']}; a probe before this check crashed its process too"
    # a probe's problem is not this check's: name none
    problem = Problem(**flight["problem"]) if flight and flight.get("problem") and not flight.get("probe") else None
    return {
        "id": report.nodeid, **identity, "outcome": outcome, "reason": reason, "message": str(report.longrepr),
        "duration_s": None, "examples": None, "unsupported_examples": {}, "verdicts": [], "quantity": None,
        "observed_error": None, "allowed_error": None, "budget_used": None,
        "problem": problem.summary() if problem else None, "counterexample": repr(problem) if problem else None,
        "problem_source": "running" if problem else None, "device": flight.get("device") if flight else None, "device_index": flight.get("device_index") if flight else None,
        "worker": worker,
    }


def read_flight(directory, worker, nodeid) -> dict | None:
    if not directory or not worker:
        return None
    try:
        flight = json.loads((Path(directory) / f"{worker}.json").read_text())
    except (OSError, ValueError):
        return None
    return flight if flight.get("id") == nodeid else None


def pytest_sessionfinish(session, exitstatus):
    sink = getattr(session.config, "_jfa_sink", None)
    if sink is None:
        return
    for nodeid in sink.collected or []:
        if nodeid not in sink.seen:
            sink.record({
                "id": nodeid, **check_identity(nodeid, sink.backend_names), "outcome": "not-run",
                "reason": "never ran: the run stopped before reaching it (interrupted, or too many crashed workers)",
                "message": None, "verdicts": [], "problem": None, "counterexample": None,
            })
    sink.write({"kind": "finished", "exitstatus": int(exitstatus)})
    sink.file.close()
