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
import threading
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
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return supervise(proc, records_path, view, deadline, snapshot)


def supervise(proc, records_path: Path, view: "LiveView | None" = None, deadline: float | None = None,
              snapshot=None) -> tuple[int, str | None]:
    """Wait for a started session (see :func:`run_pytest`), stopping its process group at the deadline, on
    SIGTERM or on Ctrl-C; ``(return code, why it was stopped or None)``."""
    last_snapshot = time.monotonic()
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
    """SIGINT, then SIGTERM, then SIGKILL to the session's process group, each given time to act. SIGINT
    goes twice: one that lands while xdist brings up its workers is swallowed there, and the session would
    run on."""
    import signal
    for sig, wait in ((signal.SIGINT, 2), (signal.SIGINT, 8), (signal.SIGTERM, 10), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


TIMINGS_GATE = ".timings-gate"  # empty while the checks run; then "go" (time now) or "stop" (the run ended)
TIMINGS_SETUP = ".timings-setup.json"  # what the session did before the gate opened (plugin.py writes it)
BENCHMARK_LOG = "benchmarks.log"
NOT_STARTED = "benchmarks not started: stopped: the run reached its --time-limit"


class BenchmarkSession:
    """The benchmark session (``benchmarks.py``: pytest-benchmark, no xdist, which switches it off), started
    beside the checks: its interpreter start, imports, collection and each timed backend's first calls (one
    shape per causal mode, ``benchmarks.prelude``: a DSL's per-process set-up, a graph compile) overlap
    them, and its timings wait at a gate until :meth:`finish`, so that they run on a device the checks have
    left.  ``after`` (the warm-up's end) delays the start, so that the prelude compiles nothing beside the
    warm-up that the warm-up compiles anyway.  :meth:`cancel` ends a session whose timings will not run."""

    def __init__(self, run_dir: Path, backend_specs, device: str, env: dict, timeout_s: float, after=None):
        self.run_dir = Path(run_dir)
        self.gate = self.run_dir / TIMINGS_GATE
        self.gate.write_text("")
        self.partial = self.run_dir / ".benchmark.json.partial"
        self.junit = self.run_dir / ".benchmark-junit.xml"
        self.setup_file = self.run_dir / TIMINGS_SETUP
        bench_file = Path(__file__).resolve().parent / "benchmarks.py"
        self.command = [sys.executable, "-m", "pytest", str(bench_file), "-p", "conformance.plugin", "-p",
                        "no:cacheprovider", "-q", "--device", device, "--benchmark-only", "--benchmark-json",
                        str(self.partial), "--junitxml", str(self.junit), "--timeout", f"{timeout_s:g}",
                        "--timeout-method", "thread", "--jfa-timings-gate", str(self.gate)]
        for spec in backend_specs:
            self.command += ["--backend", spec]
        from .containment import MEMORY_SHARE_ENV
        # no memory share: the timings run alone on the device, so handing the cache back after each (a garbage
        # collection and an empty cache per timing) would buy nothing and cost time
        self.env = {key: value for key, value in env.items() if key != MEMORY_SHARE_ENV}
        self.proc, self.started_at, self.finished = None, None, False
        self._starter = threading.Thread(target=self._start, args=(after,), name="jfa-timings", daemon=True)
        self._starter.start()

    def _start(self, after) -> None:
        if after is not None:
            after()
        if self.gate.read_text() == "stop":
            return
        self.started_at = time.time()
        with open(self.run_dir / BENCHMARK_LOG, "ab") as log:  # its own: the checks' session writes pytest.log
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)

    def cancel(self) -> None:
        """The run ends without timings: the session leaves at its gate (or is stopped).  After
        :meth:`finish`, nothing to do."""
        if self.finished:
            return
        self.finished = True
        self.gate.write_text("stop")
        self._starter.join()
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                stop_group(self.proc)
        for leftover in (self.setup_file, self.gate, self.partial, self.junit):
            leftover.unlink(missing_ok=True)

    def finish(self, console, deadline: float | None = None) -> tuple[list[dict], str, list[dict], dict | None]:
        """Open the gate and wait for the timings, stopped at ``deadline`` (the run's --time-limit): a stopped
        session still writes what it timed (pytest-benchmark saves at session finish).  Returns the timings,
        the session's status, its gaps (``timing_gaps``: the timings that failed or could not be made, each
        with its reason) and where its time went (``timing_phase``)."""
        from . import report as rp
        if deadline is not None and time.monotonic() > deadline:
            self.cancel()
            return [], NOT_STARTED, [], None
        self.finished = True
        self.gate.write_text("go")
        opened = time.monotonic()
        with console.status("timing forward and backward of each backend (pytest-benchmark) ..."):
            self._starter.join()
            if self.proc is None:
                return [], "benchmarks did not start", [], None
            rc, stopped = supervise(self.proc, self.run_dir / ".none", None, deadline)
        gaps = timing_gaps(self.junit)
        phase = timing_phase(self.junit, time.monotonic() - opened, self._setup())
        for leftover in (self.junit, self.setup_file, self.gate):
            leftover.unlink(missing_ok=True)
        if not self.partial.exists():
            why = f"stopped: {stopped}" if stopped else f"pytest exit code {rc}; see {BENCHMARK_LOG}"
            return [], f"benchmarks did not complete ({why})", gaps, phase
        bench = json.loads(self.partial.read_text())
        os.replace(self.partial, self.run_dir / "benchmark.json")
        if stopped:
            status = f"stopped: {stopped}; the timings finished before it are kept"
        else:
            status = "ok" if rc == 0 else f"some benchmarks failed (pytest exit code {rc}; see {BENCHMARK_LOG})"
        return rp.timings_from_benchmark(bench), status, gaps, phase

    def _setup(self) -> dict | None:
        """What the session did before the gate opened: ``ready_s`` (its start-up and prelude, from its
        start), ``waited_s`` (at the gate: the part the checks hid entirely) and each backend's prelude."""
        try:
            noted = json.loads(self.setup_file.read_text())
        except (OSError, ValueError):
            return None
        if self.started_at is None:
            return None
        return {"ready_s": round(noted["ready_at"] - self.started_at, 1),
                "waited_s": round(max(0.0, noted["go_at"] - noted["ready_at"]), 1),
                "prelude_s": noted.get("prelude_s", {})}


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


def timing_phase(junit_path: Path, wall_s: float, setup: dict | None = None) -> dict:
    """Where the timing phase's wall time (from the gate's opening) went: its timings (set-up, first call and
    rounds, from the JUnit file's per-test seconds), the rest (what of the interpreter start, imports and
    collection was not done beside the checks) and the slowest timings, so that a slow phase says what to look
    at; with ``setup`` (``TIMINGS_SETUP``), what the session did beside the checks before the gate opened."""
    cases = [(b, s, d, float(c.get("time") or 0)) for b, s, d, c in _timing_cases(junit_path)]
    in_timings = sum(seconds for *_, seconds in cases)
    slowest = sorted(cases, key=lambda c: -c[3])[:SLOWEST_TIMINGS]
    phase = {"wall_s": round(wall_s, 1), "timings": len(cases), "timings_s": round(in_timings, 1),
             "outside_timings_s": round(max(0.0, wall_s - in_timings), 1),
             "slowest": [{"backend": b, "shape": s, "direction": d, "seconds": round(t, 2)} for b, s, d, t in slowest]}
    if setup:
        phase["beside_checks"] = setup
    return phase


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

