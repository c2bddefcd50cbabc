"""The pytest sessions a run drives in child processes: the spec's checks and the benchmarks.

A session runs in its own process group, so a stop reaches its xdist workers too; it is stopped at the
run's deadline (``--time-limit``), on SIGTERM or Ctrl-C, and says which. The benchmark session is stopped
the same way and keeps what it timed (pytest-benchmark writes its JSON when the session finishes).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .live import LiveView

SNAPSHOT_EVERY_S = 30.0  # report.json is rewritten this often during a run, so a killed run keeps its results


class RunStopped(Exception):
    """The run was stopped from outside (SIGTERM, Ctrl-C) or by ``--time-limit``; the message says which."""


def stop_on_sigterm(signum, frame):
    raise RunStopped("the run was terminated (SIGTERM)")


def run_pytest(command, env, log_path: Path, records_path: Path, view: "LiveView | None",
               deadline: float | None = None, snapshot=None) -> tuple[int, str | None]:
    """Run pytest, feeding the live view and writing a report snapshot now and then; returns
    ``(return code, why it was stopped or None)``. pytest runs in its own process group so that a stop
    reaches its xdist workers too."""
    last_snapshot = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            while proc.poll() is None:
                if view:
                    view.feed(records_path)
                if deadline is not None and time.monotonic() > deadline:
                    raise RunStopped("the run reached its --time-limit")
                if snapshot is not None and time.monotonic() - last_snapshot > SNAPSHOT_EVERY_S:
                    snapshot()
                    last_snapshot = time.monotonic()
                time.sleep(0.25)
        except (KeyboardInterrupt, RunStopped) as exc:
            reason = str(exc) if isinstance(exc, RunStopped) else "the run was interrupted (Ctrl-C)"
            with _sigterm_ignored():  # a second SIGTERM (a runner's retry) must not abandon the stop halfway
                stop_group(proc)
            return proc.returncode, reason
        if view:
            view.feed(records_path)
    return proc.returncode, None


@contextlib.contextmanager
def _sigterm_ignored():
    import signal
    try:
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:  # not the main thread: its handler is not ours to change
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_group(proc) -> None:
    """SIGINT, then SIGTERM, then SIGKILL to the session's process group, each given time to act."""
    import signal
    for sig, wait in ((signal.SIGINT, 10), (signal.SIGTERM, 10), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_benchmarks(run_dir: Path, backend_specs, device, env, console, timeout_s: float,
                   deadline: float | None = None) -> tuple[list[dict], str, list[dict], dict | None]:
    """pytest-benchmark timings of ``backend_specs``, stopped at ``deadline`` (the run's --time-limit):
    a stopped session still writes what it timed (pytest-benchmark saves at session finish).  Returns the
    timings, the session's status, its gaps (``timing_gaps``: the timings that failed or could not be
    made, each with its reason) and where its time went (``timing_phase``)."""
    from . import report as rp
    bench_file = Path(__file__).resolve().parent / "benchmarks.py"
    partial = run_dir / ".benchmark.json.partial"
    junit = run_dir / ".benchmark-junit.xml"
    command = [sys.executable, "-m", "pytest", str(bench_file), "-p", "conformance.plugin", "-p", "no:cacheprovider",
               "-q", "--device", device, "--benchmark-only", "--benchmark-json", str(partial),
               "--junitxml", str(junit), "--timeout", f"{timeout_s:g}", "--timeout-method", "thread"]
    for spec in backend_specs:
        command += ["--backend", spec]
    if deadline is not None and time.monotonic() > deadline:
        return [], "benchmarks not started: stopped: the run reached its --time-limit", [], None
    started = time.monotonic()
    with console.status("timing forward and backward of each backend (pytest-benchmark) ..."):
        rc, stopped = run_pytest(command, env, run_dir / "pytest.log", run_dir / ".none", None, deadline)
    gaps, phase = timing_gaps(junit), timing_phase(junit, time.monotonic() - started)
    junit.unlink(missing_ok=True)
    if not partial.exists():
        why = f"stopped: {stopped}" if stopped else f"pytest exit code {rc}; see pytest.log"
        return [], f"benchmarks did not complete ({why})", gaps, phase
    bench = json.loads(partial.read_text())
    os.replace(partial, run_dir / "benchmark.json")
    if stopped:
        status = f"stopped: {stopped}; the timings finished before it are kept"
    else:
        status = "ok" if rc == 0 else f"some benchmarks failed (pytest exit code {rc}; see pytest.log)"
    return rp.timings_from_benchmark(bench), status, gaps, phase


def _timing_cases(junit_path: Path):
    """(backend, shape, direction, testcase element) of each timing in the benchmark session's JUnit file."""
    import xml.etree.ElementTree as ET
    try:
        cases = list(ET.parse(junit_path).getroot().iter("testcase"))
    except (OSError, ET.ParseError):
        return []
    out = []
    for case in cases:
        name = case.get("name", "")
        if not name.startswith("test_timing[") or not name.endswith("]"):
            continue
        rest, direction = name[len("test_timing["):-1].rsplit("-", 1)
        backend, shape = rest.rsplit("-", 1)  # backend names may hold "-", shape names do not
        out.append((backend, shape, direction, case))
    return out


SLOWEST_TIMINGS = 5


def timing_phase(junit_path: Path, wall_s: float) -> dict:
    """Where the benchmark session's wall time went: its timings (set-up, first call and rounds, from the
    JUnit file's per-test seconds), the rest (interpreter start, imports, collection, the backends'
    set-up) and the slowest timings, so that a slow phase says what to look at."""
    cases = [(b, s, d, float(c.get("time") or 0)) for b, s, d, c in _timing_cases(junit_path)]
    in_timings = sum(seconds for *_, seconds in cases)
    slowest = sorted(cases, key=lambda c: -c[3])[:SLOWEST_TIMINGS]
    return {"wall_s": round(wall_s, 1), "timings": len(cases), "timings_s": round(in_timings, 1),
            "outside_timings_s": round(max(0.0, wall_s - in_timings), 1),
            "slowest": [{"backend": b, "shape": s, "direction": d, "seconds": round(t, 2)} for b, s, d, t in slowest]}


def timing_gaps(junit_path: Path) -> list[dict]:
    """The timings the benchmark session's JUnit file names as failed or not timed (skipped with a reason
    that starts "not timed", such as running out of device memory; declared-unsupported shapes are not
    gaps): backend, shape, direction, outcome and the first line of the reason."""
    gaps = []
    for backend, shape, direction, case in _timing_cases(junit_path):
        for tag, outcome in (("failure", "failed"), ("error", "failed"), ("skipped", "not timed")):
            node = case.find(tag)
            if node is None:
                continue
            message = (node.get("message") or node.text or "").strip().splitlines()
            message = message[0][:300] if message else ""
            if outcome == "not timed" and not message.startswith("not timed"):
                continue  # a declared-unsupported shape
            gaps.append({"backend": backend, "shape": shape, "direction": direction, "outcome": outcome,
                         "message": message.removeprefix("not timed: ")})
            break
    return gaps


def timed_specs(named: list[str], chosen) -> list[str]:
    """The backends the benchmarks time: every chosen one, except that the references (float64 oracles, not
    kernels; slow on a GPU's shapes) and backends run by an interpreter here (``interpreted_by``: their times
    are the interpreter's) are timed only when the user named the backends (``named``: --backend)."""
    from .registry import BUILTIN
    return [spec for spec, info in chosen
            if named or (spec not in BUILTIN and not (info.capabilities or {}).get("interpreted_by"))]

