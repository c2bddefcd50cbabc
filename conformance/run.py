"""``jfa-conformance run``: the spec in a pytest child process and its report.

pytest runs the spec (hypothesis draws the problems, pytest-xdist runs the checks in worker processes that are
replaced when a backend kills one, pytest-timeout stops hung checks, pytest-benchmark times the backends),
beside the warm-up that compiles the kernels first (warmup.py) and the benchmark session that times them after
the checks (pytest_session.py); what the recorder plugin writes becomes ``reports/<run-name>/``
(cli_common.write_run_dir).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from . import workers
from .cli_common import USAGE_ERROR, UsageError, load_report, make_console, print_summary, write_run_dir
from .configs import coverage_of
from .environment import environment
from .live import LiveView, WarmupView
from .pytest_session import BenchmarkSession, RunStopped, run_pytest, stop_on_sigterm, timed_specs
from .reporting.perf import BENCH_NOT_ASKED
from .warmup import backend_times

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_COMPILE_TIMEOUT_S = 600.0  # one warm-up job: a backend compiling one kernel configuration
# Every check can cost its worker (segfault, device fault), and a crashed check is never retried, so the
# number of restarts is bounded by the number of checks; this only stops a run that restarts in a loop.
DEFAULT_MAX_WORKER_RESTART = 2000
# Overall budget of a run per profile, seconds (--time-limit overrides; 0 means none). What it does not
# reach is reported not-run, with the reason.
DEFAULT_TIME_LIMIT_S = {"ci": 1800.0, "dev": 7200.0}


def _worker_count(ns, device: str) -> int:
    return workers.worker_count(device, _gpu_list(ns.gpus) if ns.gpus else None, ns.workers)


def _worker_sets(ns, device: str) -> list[tuple[str | None, int]]:
    return workers.worker_sets(device, _gpu_list(ns.gpus) if ns.gpus else None, ns.workers)


def _gpu_list(spec: str) -> list[str]:
    """``--gpus all`` or ``--gpus 0,2``: the CUDA device indices to put one worker on each."""
    if spec == "all":
        import torch
        count = torch.cuda.device_count()
        if count == 0:
            raise UsageError("--gpus all: no CUDA GPU is visible")
        return [str(i) for i in range(count)]
    indices = [s.strip() for s in spec.split(",") if s.strip()]
    if not indices or not all(i.isdigit() for i in indices):
        raise UsageError(f"--gpus must be 'all' or comma-separated device indices like 0,1, got {spec!r}")
    return indices


def _resolve_backends(specs: list[str], device: str):
    """``[(spec, BackendInfo)]`` for the run; every name is checked before pytest starts."""
    from . import registry
    if not specs:
        specs = [b.name for b in registry.available(device)]
    chosen = []
    for spec in specs:
        ref = spec
        if ":" in spec and spec.partition(":")[0].endswith(".py"):
            path, _, attr = spec.partition(":")
            ref = f"{Path(path).resolve()}:{attr}"  # the child pytest may run from elsewhere
        try:
            chosen.append((ref, registry.describe(ref, device)))
        except (ValueError, ImportError) as exc:
            raise UsageError(f"--backend: {exc}") from None
    return chosen


def _pytest_command(ns, run_dir: Path, backend_specs: list[str], device: str) -> list[str]:
    spec_dir = Path(__file__).resolve().parent / "spec"
    args = [sys.executable, "-m", "pytest", str(spec_dir), "-p", "conformance.plugin", "-p", "conformance.recorder",
            "-p", "no:cacheprovider", "-q", "-rN",
            "--jfa-records", str(run_dir / ".records.jsonl"), "--jfa-flight-dir", str(run_dir / ".flight"),
            "--hypothesis-profile", ns.profile, "--device", device,
            "--timeout", f"{ns.timeout:g}", "--timeout-method", "thread",
            "--junitxml", str(run_dir / ".junit.xml.partial"), "-o", "junit_family=xunit2"]
    for spec in backend_specs:
        args += ["--backend", spec]
    for dtype in ns.dtype:
        args += ["--dtype", dtype]
    if ns.max_examples is not None:
        args += ["--max-examples", str(ns.max_examples)]
    if ns.xfails_file:
        args += ["--xfails-file", str(Path(ns.xfails_file).resolve())]
    if ns.seed is not None:
        args += [f"--hypothesis-seed={ns.seed}"]
    if ns.k:
        args += ["-k", ns.k]
    if ns.gpus:
        for index, count in _worker_sets(ns, device):
            if count:
                args += ["--tx", f"{count}*popen//env:CUDA_VISIBLE_DEVICES={index}//env:JFA_CONFORMANCE_DEVICE_INDEX={index}"]
        args += ["--dist", "worksteal"]
    else:
        args += ["-n", str(_worker_count(ns, device)), "--dist", "worksteal"]
    args += ["--max-worker-restart", str(ns.max_worker_restart)]
    return args


def _child_env(device: str, n_workers: int, cache_dir: Path) -> dict:
    from .cache import cache_env
    env = cache_env(cache_dir, os.environ)  # every compile cache shared by the workers and by later runs
    import torch
    if not torch.cuda.is_available():
        env.setdefault("TRITON_INTERPRET", "1")  # Triton kernels run under the interpreter without a GPU
    # Workers share the cores (the oracle and compilers are CPU work on any device): more intra-op
    # threads than cores only adds contention.
    share = str(max(1, workers.cores() // max(1, n_workers)))
    env.setdefault("OMP_NUM_THREADS", share)
    # Inductor (flex_attention) otherwise starts a pool of one compile process per core in every worker:
    # with a worker per core, that is cores x cores processes competing for the same cores.
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", share)
    return env


def _replay(run_dir: Path, record: dict, spec_of: dict) -> dict | None:
    """The backend spec (as the user named it) a failed check's reproducer calls; ``write_run_dir`` writes
    the artifact and script under the report's ``failures/`` and fills in the rest of the entry."""
    return {"backend": spec_of.get(record["backend"], record["backend"])}


def _unfinished_checks(ns) -> list[str]:
    """Ids (``check_key``) of the checks ``--resume``'s report has no verdict for; fills in its backends and
    profile where the command line gives none."""
    from .plugin import check_key
    earlier = load_report(ns.resume, "--resume")
    unfinished = [r for r in earlier["records"] if r["outcome"] == "not-run"]
    if not ns.backend:
        from . import registry
        known = set(registry.known_names())
        names = sorted({r["backend"] for r in unfinished})
        # a name the registry knows, else where the earlier run loaded the backend from (module:attr, file.py:attr)
        ns.backend = [n if n in known else earlier.get("backends", {}).get(n, {}).get("source") or n for n in names]
    ns.profile = ns.profile or earlier["run"].get("profile") or "ci"
    return [check_key(r["id"]) for r in unfinished]


def _checked_options(ns):
    """The options a run reads before anything starts, checked (a UsageError naming the option); returns the
    ``--baseline`` report, loaded, or None."""
    from .problem import DTYPES
    baseline = load_report(ns.baseline, "--baseline") if ns.baseline else None
    if ns.xfails_file and not Path(ns.xfails_file).is_file():
        raise UsageError(f"--xfails-file: {ns.xfails_file} does not exist")
    bad_dtypes = [d for d in ns.dtype if d not in DTYPES]
    if bad_dtypes:
        raise UsageError(f"--dtype: {', '.join(bad_dtypes)} is not one of {', '.join(DTYPES)}")
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    from . import profiles  # noqa: F401 - registers the profiles
    try:
        settings.get_profile(ns.profile)
    except InvalidArgument:
        raise UsageError(f"--profile: unknown profile {ns.profile!r} (known: {', '.join(profiles.PROFILES)})") from None
    if ns.gpus:
        _gpu_list(ns.gpus)
    return baseline


@dataclasses.dataclass
class _Run:
    """What a run fixed before its checks started, and what its phases add as they end; the report is made
    from it (``report``), also while the run goes on (``snapshot``)."""
    ns: Any
    name: str
    run_dir: Path
    device: str
    chosen: list  # (spec, BackendInfo) of the backends the run covers
    n_workers: int
    cache_dir: Path
    cache_bytes: int
    env_info: dict  # (environment.environment)
    started: dt.datetime = dataclasses.field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))
    t0: float = dataclasses.field(default_factory=time.perf_counter)  # made with the run: it starts then
    timed_names: list = dataclasses.field(default_factory=list)  # the backends the benchmarks time, once they start
    warm_summary: dict = dataclasses.field(default_factory=dict)  # what the warm-up compiled, per backend
    warm_info: dict = dataclasses.field(default_factory=lambda: {"ran": False})
    check_phase: dict | None = None  # where the checks' time went (report.check_phase)

    @property
    def records_path(self) -> Path:
        return self.run_dir / ".records.jsonl"

    def report(self, out: _Outcome, *, complete: bool) -> dict:
        from . import report as rp
        ns, chosen, records = self.ns, self.chosen, out.records
        times = backend_times([info.name for _, info in chosen], self.warm_summary, records)
        return {
            "schema": rp.SCHEMA, "schema_version": rp.SCHEMA_VERSION,
            "run": {"name": self.name, "command": rp.home_relative("jfa-conformance " + shlex.join(ns.argv)),
                    "started": self.started.isoformat(timespec="seconds"),
                    "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    "duration_s": round(time.perf_counter() - self.t0, 1), "profile": ns.profile,
                    "max_examples": ns.max_examples,
                    "seed": ns.seed if ns.seed is not None else ("derandomized" if ns.profile == "ci" else None),
                    "dtypes": ns.dtype or None, "xfails_file": ns.xfails_file, "timeout_s": ns.timeout,
                    "time_limit_s": ns.time_limit, "workers": self.n_workers, "gpus": ns.gpus,
                    "pytest_exit_code": out.rc, "benchmarks": out.bench_status,
                    "timed_backends": self.timed_names or None, "complete": complete, "stopped": out.stop_reason,
                    "resumed_from": ns.resume,
                    "cache_dir": rp.home_relative(str(self.cache_dir)), "cache_bytes_before": self.cache_bytes,
                    "warmup": self.warm_info, "checks": self.check_phase, "timing_phase": out.timing_phase,
                    "environment": self.env_info},
            "backends": {info.name: {"source": info.source, "available": info.available, "reason": info.reason,
                                     "capabilities": info.capabilities, "time": times[info.name]}
                         for _, info in chosen},
            "coverage": coverage_of(records),
            "records": records,
            "timings": out.timings,
            "timing_gaps": list(out.gaps),
        }

    def snapshot(self) -> None:
        """report.json of what has run so far (``complete: false``), in case this process is killed."""
        from . import report as rp
        collected, records, _ = rp.read_record_stream(self.records_path)
        records = rp.complete_records(collected, records, "not reached yet: the run was still going")
        partial = self.report(_Outcome(records, bench_status="not run yet",
                                       stop_reason="snapshot taken while the run was going; the process never finished"),
                              complete=False)
        partial["summary"] = rp.summarize_backends(partial)
        rp.write_json(self.run_dir / "report.json", partial)


@dataclasses.dataclass
class _Outcome:
    """What the checks and the timings left: every collected check's record, the timings, how it ended."""
    records: list
    collected: Any = None
    finished: bool = False
    rc: int | None = None
    stop_reason: str | None = None
    timings: list = dataclasses.field(default_factory=list)
    bench_status: str = "not run"
    gaps: list = dataclasses.field(default_factory=list)  # timings that failed or could not be made
    timing_phase: dict | None = None  # where the timings' session spent its time


def cmd_run(ns) -> int:
    from .plugin import default_device

    console = make_console()
    unfinished = _unfinished_checks(ns) if ns.resume else None
    if unfinished is not None and not unfinished:
        console.print(f"{ns.resume}: every check has a verdict; nothing to resume")
        return 0
    ns.profile = ns.profile or "ci"
    if ns.seed is None and ns.profile != "ci":
        # a random run still gets a recorded seed, so `--seed` reproduces every draw of it
        import random
        ns.seed = random.SystemRandom().randrange(2**31)
    device = ns.device or default_device()
    baseline = _checked_options(ns)
    chosen = _resolve_backends(ns.backend, device)
    if not chosen:
        console.print(f"[bold red]no backend is available on {device}[/]; see `jfa-conformance list`")
        return 1
    from . import registry
    note = None if ns.backend else registry.registration_note()
    if note:
        console.print(f"[yellow]note:[/] {note}")
    name = ns.name or f"{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}-{ns.profile}"
    run_dir = Path(ns.report_dir) / name
    if (run_dir / "report.json").exists():
        raise UsageError(f"--name: {run_dir} already holds a report")
    (run_dir / ".flight").mkdir(parents=True, exist_ok=True)
    from .cache import check_seconds_file, default_dir, size_of
    cache_dir = Path(ns.cache_dir).expanduser() if ns.cache_dir else default_dir()
    (run_dir / ".records.jsonl").unlink(missing_ok=True)
    n_workers = _worker_count(ns, device)
    cache_bytes = size_of(cache_dir)
    env = _child_env(device, n_workers, cache_dir)
    if device.startswith("cuda"):  # workers sharing a GPU hand back cached memory beyond an equal part of it
        from .containment import MEMORY_SHARE_ENV, memory_share
        env.setdefault(MEMORY_SHARE_ENV, str(memory_share(max(n for _, n in _worker_sets(ns, device)))))
    if ns.time_limit is None:
        ns.time_limit = DEFAULT_TIME_LIMIT_S.get(ns.profile)
    ns.time_limit = ns.time_limit or None  # 0: no limit
    command = _pytest_command(ns, run_dir, [spec for spec, _ in chosen], device)
    if unfinished:
        only = run_dir / ".resume-ids"
        only.write_text("\n".join(unfinished) + "\n")
        command += ["--jfa-only", str(only)]
    from . import check_order
    seconds_kind = check_order.run_kind(device, ns.profile, ns.max_examples)
    # the checks run longest expected first, from this run's copy of the seconds earlier runs measured
    command += ["--jfa-check-seconds", str(check_order.snapshot(check_seconds_file(cache_dir), seconds_kind,
                                                                run_dir / ".check-seconds.json"))]
    run = _Run(ns, name, run_dir, device, chosen, n_workers, cache_dir, cache_bytes, environment(device))
    console.print(f"jfa-conformance run [bold]{name}[/]: {', '.join(info.name for _, info in chosen)} on {device}, "
                  f"profile {ns.profile}, {n_workers} worker{'s' if n_workers > 1 else ''}, compile caches in {cache_dir} "
                  f"({cache_bytes / 1e6:.0f} MB)", highlight=False)
    out = _checks_then_timings(run, command, env, console)
    if isinstance(out, int):  # pytest could not run the spec
        return out
    return _finish(run, out, baseline, seconds_kind, console)


def _checks_then_timings(run: _Run, command: list[str], env: dict, console) -> _Outcome | int:
    """The warm-up beside the checks, the checks (pytest), then the timings; stops at the run's time limit or
    SIGTERM with what it has.  An int: pytest could not run the spec (its exit code for the command)."""
    from . import report as rp
    ns, device, chosen, run_dir = run.ns, run.device, run.chosen, run.run_dir
    import signal
    previous = signal.signal(signal.SIGTERM, stop_on_sigterm)
    out = _Outcome(records=[])
    timing_session = None  # the benchmark session, started with the checks (pytest_session.BenchmarkSession)
    try:
        deadline = time.monotonic() + ns.time_limit if ns.time_limit else None
        bench = ns.bench if ns.bench is not None else device.startswith("cuda")
        timed = timed_specs(ns.backend, chosen)
        warming = None
        if ns.warmup if ns.warmup is not None else device.startswith("cuda"):
            from .warmup import start_beside
            warming = start_beside(ns, chosen, device, run_dir, env, run.cache_dir, console, deadline,
                                   _worker_sets(ns, device), lambda jobs: WarmupView(console, jobs, enabled=False),
                                   timed=timed if bench else ())
            if warming.gates:  # the checks of the backends still compiling wait at their gates
                command = command + ["--jfa-warming", str(warming.gate_dir)]
        if bench and timed:  # its start-up and first calls beside the checks; its timings after them
            timing_session = BenchmarkSession(run_dir, timed, device, env, ns.timeout,
                                              after=warming.wait if warming is not None else None)
        checks_started = time.time()
        try:
            with LiveView(console, enabled=not ns.quiet, flight_dir=run_dir / ".flight",
                          compiling=warming.status if warming is not None and warming.gates else None) as view:
                out.rc, out.stop_reason = run_pytest(command, env, run_dir / "pytest.log", run.records_path, view,
                                                     deadline, run.snapshot)
        finally:
            if warming is not None:  # the checks are over (a full run's gates are all open by then): what the
                warming.checks_over.set()  # warm-up has yet to compile for checks (-k left them out) serves nobody,
                if not (bench and out.rc is not None and out.stop_reason is None):  # and the rest only timings to come
                    warming.stopping.set()
                elif (left := warming.status()):
                    console.print(f"warm-up: the timings' kernels: {left}", highlight=False, soft_wrap=True)
                run.warm_summary, run.warm_info = warming.join()
        checks_wall = time.time() - checks_started
        out.collected, records, out.finished = rp.read_record_stream(run.records_path)
        run.check_phase = rp.check_phase(records, checks_started, checks_wall, run.n_workers)
        if out.rc in (3, 4) and not records and out.stop_reason is None:
            log_tail = (run_dir / "pytest.log").read_text(errors="replace")[-3000:]
            console.print(log_tail, markup=False)
            console.print(f"[bold red]pytest could not run the spec (exit code {out.rc}); see {run_dir / 'pytest.log'}[/]")
            (run_dir / "report.json").unlink(missing_ok=True)
            return USAGE_ERROR if out.rc == 4 else 1
        out.records = rp.complete_records(
            out.collected, records, f"never ran: {out.stop_reason}" if out.stop_reason else
            "never ran: the run stopped before reaching it (see pytest.log)", stopped=out.stop_reason is not None)
        out.bench_status = BENCH_NOT_ASKED
        if bench and out.stop_reason is None:
            run.timed_names[:] = [info.name for spec, info in chosen if spec in timed and info.available]
        if bench and out.stop_reason is not None:
            out.bench_status = f"not run: {out.stop_reason}"
        elif bench and not timed:
            out.bench_status = ("not run: no kernel backend to time (the references, and backends an interpreter "
                                "runs, are timed when named with --backend)")
        elif bench:
            out.timings, out.bench_status, out.gaps, out.timing_phase = timing_session.finish(console, deadline)
    except RunStopped as exc:  # SIGTERM while the benchmarks ran, or outside the checks' own stop handling
        out.stop_reason, out.bench_status = str(exc), f"stopped: {exc}"
        if out.collected is None:  # stopped before the checks' records were read: what they wrote, the rest not run
            out.collected, records, out.finished = rp.read_record_stream(run.records_path)
            out.records = rp.complete_records(out.collected, records, f"never ran: {out.stop_reason}", stopped=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if timing_session is not None:  # a run that ends without its timings: the session leaves
            timing_session.cancel()
    return out


def _finish(run: _Run, out: _Outcome, baseline, seconds_kind, console) -> int:
    """The report: replay files for the failures, the baseline comparison, the run directory's files, the
    checks' seconds for the next run's order, the printed summary; returns the exit code."""
    from . import check_order
    from . import report as rp
    from .cache import check_seconds_file
    ns, run_dir = run.ns, run.run_dir
    spec_of = {info.name: spec for spec, info in run.chosen}
    for r in out.records:
        if r["outcome"] in rp.FAILING and r["outcome"] != "not-run":
            r["replay"] = _replay(run_dir, r, spec_of)
    partial_junit = run_dir / ".junit.xml.partial"
    if partial_junit.exists():
        os.replace(partial_junit, run_dir / "junit.xml")
    complete = rp.verdicts_complete(out.collected, out.records, out.finished)
    report = run.report(out, complete=complete)
    regressions = []
    if baseline is not None:
        comparison = rp.compare(baseline, report, ns.timing_threshold)
        regressions = rp.regressions_of(comparison)
        report["baseline"] = {"path": str(ns.baseline), "name": baseline["run"].get("name"),
                              "threshold": ns.timing_threshold, "regressions": regressions}
    report["run"]["exit_code"] = rp.exit_code(report, regressions)
    write_run_dir(run_dir, report, regressions)
    shutil.rmtree(run_dir / ".flight", ignore_errors=True)
    try:  # what the checks took orders the next run's (check_order.py)
        check_order.record(check_seconds_file(run.cache_dir), seconds_kind, report["records"])
    except OSError as exc:
        console.print(f"could not record the checks' seconds in {run.cache_dir}: {exc}", style="yellow", markup=False)
    if out.stop_reason:
        console.print(f"[bold yellow]{out.stop_reason}[/]: the checks that never ran are marked not-run")
    print_summary(console, report, regressions, run_dir)
    return report["run"]["exit_code"]
