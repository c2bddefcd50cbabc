"""Warm-up: compile every kernel a run will use before its checks start, in parallel, under its own budget.

The first call of a JIT backend on a kernel configuration compiles (seconds to minutes); later calls, in
any process, load the result from the persistent caches that ``jfa-conformance run`` points every process
at (see cache.py). So the run first calls each backend once per configuration of its run set
(configs.py) on a few tiny problems — forward, and backward where declared — in a pool of worker
processes, timing each (backend, configuration) job. The checks run beside it: those of backends with
nothing to compile start at once, and a backend's checks wait (outside their timeout) until its last
warm-up job has ended, so their timeout measures checking rather than compiling. That holds only if the
warm-up's calls launch every kernel variant the checks launch; for the project's Triton kernel,
tests/test_compile_keys.py checks it on the CPU with the compile keys a GPU would use.

What compiled once is not compiled again: the manifest (manifest.py) lists, under a fingerprint of the
versions and sources the kernels depend on, the jobs that finished ``ok`` and those that ended in a compile
error or a refusal; a run whose caches are warm skips them, and their checks load the kernels from the
caches on first use (or meet the error and report it).

The manifest also keeps each job's last compile seconds, whatever the fingerprint, so a run that has to
compile again (after an upgrade or an edit) can order its jobs: the backend with the fewest expected
compile-seconds first, each backend's longest jobs first. Its checks wait for its last job, so the cheapest
gates open first and their checks run while the dearer backends compile; on the H100 FlashInfer run's
measured seconds (15 workers, four backends of 44 to 1,081 compile-seconds), this order opens the gates at
13, 64, 129 and 195 s in simulation, where the longest-job-first order opens all four at about 177 s.

Several configurations may share one compiled artifact: FlashInfer's JIT builds one module per path,
dtypes, head dims and index type, whatever the heads or the mask, and its auto path on sm_90 builds the fa3
modules. A backend says so with ``Backend.build_key``. Such a build counts once in its backend's expected
seconds, its other jobs go after the backend's builds, and no job starts while another job's process is
making its build: it would only wait for that process's lock, holding a worker (in the H100 run of
2026-12-06, twelve auto jobs each measured about 137 s, nearly all of it waiting for three fa3 builds).
On that run's measured seconds, with the build keys added, ``tools/simulate_warmup_order.py`` opens the
FlashInfer gates at about 130 s where the order without build keys gives 143 and 285 s (266 s measured).
Measured on an H200 (2026-12-06), the FlashInfer gates opened at 311 s, not 130: the model gives each job
one core, but one FlashInfer build runs nvcc on every core (ninja), and with its builds counted once
FlashInfer ranked cheap, so six builds started first and FA4's, flex's and triton-jfa's compiles, sharing
the cores with them, took 1.9-2.4x the seconds of the H100 run (their gates opened at 275-309 s). So the jobs of a
backend that declares ``Capabilities.parallel_build`` run in worker processes of lower CPU priority
(``BACKGROUND_NICE``, and the same for the scheduler group of the worker's session where the kernel groups
sessions, as Linux's autogroup does: there a process's niceness ranks it only inside its own session): its
builds take the cores the others leave idle. And they run a few at a time, each on its share of the cores
(``parallel_builds``: on 16 cores two, of 8 compiler processes each, through MAX_JOBS): in the H200's dev run
four fa3 builds at once ran some 70 nvcc processes and the kernel killed one for memory. Measured on a
fresh H200 with both (reports/examples/h200/2026-12-06b/): FA4's, triton-jfa's and flex's gates opened at
83, 91 and 96 s instead of 275-310 s, no compiler was killed, and FlashInfer's eight builds, two at a time,
opened its last gates at 320 s (the cold run: 344 s, every check judged).

A run that times the backends (``--bench``, the default on a GPU) also warms the configurations of the
timings' shapes (benchmarks.py) that the checks' list lacks: those jobs go after all the others and open no
gate (no check waits for them), the checks' end does not stop them, and the timings start once they are
done, so a timing's first call loads a kernel the warm-up compiled in parallel instead of compiling it
there, one shape after another.

A job that outlives ``budget_s`` is stopped with its process (a fresh one takes its place) and reported
as ``timeout``; the backend's remaining jobs are skipped, and the checks phase starts that backend as
*suspect* (see containment.py): a short probe decides whether its checks run at all. A process that dies
(segfault, abort) reports ``crash``; a device fault reports ``crash`` and the process is replaced.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import gates, manifest
from .configs import KernelConfig

MARKER = "@@jfa-warmup@@ "  # prefixes the one result line per job on a worker's stdout
# The niceness of the worker processes that run jobs of backends with parallel builds (Job.background): the
# scheduler then gives their compiler processes the cores that the other workers leave idle
BACKGROUND_NICE = 10
# The cores one parallel build gets: at most cpu_count // PARALLEL_BUILD_CORES of them at once (at least one),
# each told through MAX_JOBS (the variable ninja-driven builds read: FlashInfer's JIT, torch's cpp_extension)
# to run that share of the cores as compiler processes. Unbounded, each ran one per core: four fa3 builds
# at once on the H200 (16 cores, 128 GB) ran some 70 nvcc processes and the kernel killed one for memory
# (exit 137), a compile error that was not the backend's
PARALLEL_BUILD_CORES = 8


def parallel_builds(cpus: int | None = None) -> tuple[int, int]:
    """(how many parallel builds may run at once, MAX_JOBS for each) on ``cpus`` cores (default: this
    machine's)."""
    cpus = max(1, cpus or os.cpu_count() or 1)
    at_once = max(1, cpus // PARALLEL_BUILD_CORES)
    return at_once, max(1, cpus // at_once)
# (query lengths, key lengths): a short ragged batch and one with a tile-aligned sequence, so that the
# kernels' specialisations on aligned sizes are compiled too
WARM_LENGTHS = (((3, 17), (3, 17)), ((64, 1, 129), (64, 1, 129)))
BROADCAST_LQ = (4, 17)


@dataclass(frozen=True)
class Job:
    backend: str  # the name the run resolves (registry name, entry point, module:attr)
    name: str  # the backend's display name
    config: KernelConfig
    packages: str = ""  # the versions of the backend's own packages (package_versions)
    build: str = ""  # what the job compiles (Backend.build_key); jobs with one build key share what it makes
    background: bool = False  # its backend builds with many processes at once (Capabilities.parallel_build)
    gate: bool = True  # its backend's checks wait for it; False: a configuration only the timings call

    @property
    def build_key(self) -> str:
        return self.build or f"{self.backend} | {self.config.key}"

    def as_json(self) -> str:
        return json.dumps({"backend": self.backend, "name": self.name, "config": self.config.as_dict()})

    def result(self, outcome: str, seconds: float = 0.0, message: str | None = None,
               worker: int | None = None) -> Result:
        return Result(self.name, self.config.key, outcome, round(seconds, 3), message, worker, self.build, self.gate)


@dataclass
class Result:
    backend: str
    key: str
    outcome: str  # ok, cached (compiled by an earlier run), unsupported, error, crash, timeout, skipped
    seconds: float
    message: str | None = None
    worker: int | None = None
    build: str = ""  # the job's build key where its backend declares one (Backend.build_key)
    gate: bool = True  # (Job.gate)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def warm_problems(config: KernelConfig, extra=()):
    """The problems one job runs for ``config``: the small ones of :data:`WARM_LENGTHS`, then the backend's
    own sizes (``extra``: ``Capabilities.warmup_lengths``)."""
    pairs = list(WARM_LENGTHS) + list(extra)
    if config.broadcast_q:
        return [config.problem((BROADCAST_LQ[min(i, len(BROADCAST_LQ) - 1)],) * len(k), k, seed=i)
                for i, (_, k) in enumerate(pairs)]
    return [config.problem(q, k, seed=i) for i, (q, k) in enumerate(pairs)]


def keys_cover_queries(config: KernelConfig, extra=()):
    """The problems of :func:`warm_problems` with each sequence's query length cut to its key length (at
    least 1). A backend that refuses causal attention with more queries than keys in a sequence
    (FlashInfer) refuses every broadcast-Q problem of ``warm_problems`` (a dense query block of 4 or 17 rows
    beside sequences of 1 and 3 keys); its checks still draw such configurations, with other lengths, and
    would build the kernel inside a check, after the backend's gate has opened."""
    fitted = []
    for problem in warm_problems(config, extra):
        keys = [max(1, k) for k in problem.seqlens_k]
        queries = [max(1, min(q, k)) for q, k in zip(problem.seqlens_q, keys)]
        if config.broadcast_q:  # one query block for every sequence
            queries = [min(queries)] * len(keys)
        fitted.append(dataclasses.replace(problem, seqlens_q=tuple(queries), seqlens_k=tuple(keys)))
    return fitted


def warm(backend, config: KernelConfig, device: str) -> None:
    """Call ``backend`` the way the checks will on ``config``: forward and backward where declared, the
    forward alone too (inputs that need no gradient: a graph compiler such as torch.compile builds another
    graph for those), and the replicated form of a native broadcast-Q call (the native-vs-replicated check
    runs both)."""
    from .harness import Unsupported, run_backend

    extra = backend.capabilities.warmup_lengths
    problems = warm_problems(config, extra)
    if config.broadcast_q and backend.capabilities.broadcast_q == "native":
        problems += warm_problems(dataclasses.replace(config, broadcast_q=False), extra)
    modes = (True, False) if backend.capabilities.backward else (False,)

    def run_all(problems) -> bool:
        ran = False
        for problem in problems:
            for gradients in modes:  # (a backend may refuse only the backward of a configuration)
                try:
                    run_backend(backend, problem, device, gradients=gradients)
                    ran = True
                except Unsupported:
                    continue
        return ran

    # failing those, the same kernel configuration on lengths the backend may take
    ran = run_all(problems) or run_all(keys_cover_queries(config, extra))
    if not ran:
        raise Unsupported(f"{backend.name} supports none of the warm-up problems of {config.key}")


# -- the worker process ---------------------------------------------------------------------------------
def serve(device: str) -> int:
    """Worker loop: one job per stdin line, one ``MARKER`` result line per job on stdout."""
    from . import registry

    from .containment import gpu_memory_share, release_gpu_memory_over_share
    from .harness import DeviceFault, Unsupported

    share = gpu_memory_share()
    backends = {}
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        config = KernelConfig(**job["config"])
        start = time.perf_counter()
        outcome, message, fatal = "ok", None, False
        try:
            if job["backend"] not in backends:
                backends[job["backend"]] = registry.resolve(job["backend"])
            warm(backends[job["backend"]], config, device)
        except Unsupported as exc:
            outcome, message = "unsupported", str(exc)
        except DeviceFault as exc:
            outcome, message, fatal = "crash", str(exc), True
        except Exception as exc:  # noqa: BLE001 - a compile error is a finding, reported with the job
            outcome, message = "error", f"{type(exc).__name__}: {exc}"
        result = {"outcome": outcome, "seconds": round(time.perf_counter() - start, 3), "message": message}
        if not fatal:
            release_gpu_memory_over_share(share)
        out.write("\n" + MARKER + json.dumps(result) + "\n")  # after whatever the backend printed
        out.flush()
        if fatal:
            return 70  # the device context is unusable: the pool starts a fresh process
    return 0


# -- the pool -------------------------------------------------------------------------------------------
@dataclass
class _Worker:
    index: int
    env: dict
    proc: subprocess.Popen
    nice: int = 0
    max_jobs: int | None = None
    lines: queue.Queue = field(default_factory=queue.Queue)
    job: Job | None = None
    started: float = 0.0

    def send(self, job: Job) -> None:
        self.job, self.started = job, time.monotonic()
        self.proc.stdin.write(job.as_json() + "\n")
        self.proc.stdin.flush()


def _lower_priority(nice: int) -> None:
    """In a worker process, before its first job: its niceness and, where the kernel groups each session for
    the scheduler (autogroup: a worker is a session of its own), its group's niceness, without which the
    group would get an equal share of the cores whatever its processes' niceness. What it starts (a
    compiler's processes) inherits both."""
    os.nice(nice)
    try:
        with open("/proc/self/autogroup", "w") as group:
            group.write(str(nice))
    except OSError:  # no autogroup here: the niceness alone ranks the processes
        pass


def _spawn(index: int, device: str, env: dict, log, nice: int = 0, max_jobs: int | None = None) -> _Worker:
    """A worker process; ``nice`` (a worker for parallel builds): its priority lowered by that much, and
    MAX_JOBS set to ``max_jobs`` unless the environment sets it."""
    command = [sys.executable, "-m", "conformance.warmup", "--serve", "--device", device]
    popen_env = env
    if nice:
        if hasattr(os, "nice"):
            command += ["--nice", str(nice)]
        if max_jobs and "MAX_JOBS" not in env:
            popen_env = {**env, "MAX_JOBS": str(max_jobs)}
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=popen_env,
                            text=True, bufsize=1, start_new_session=True)
    worker = _Worker(index, env, proc, nice, max_jobs)

    def pump():
        for line in proc.stdout:
            worker.lines.put(line)
        proc.stdout.close()
        worker.lines.put(None)  # end of output: the process has exited

    threading.Thread(target=pump, daemon=True).start()
    return worker


def _respawn(worker: _Worker, device: str, log) -> _Worker:
    """A fresh process in ``worker``'s place, as it was started (environment, priority)."""
    return _spawn(worker.index, device, worker.env, log, worker.nice, worker.max_jobs)


def _retire(worker: _Worker) -> None:
    """Ends an idle worker: its input closed, then killed if it does not exit at once."""
    if worker.proc.poll() is None:
        try:
            worker.proc.stdin.close()
            worker.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            _kill(worker)


def _kill(worker: _Worker) -> None:
    import signal
    try:
        os.killpg(worker.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    worker.proc.wait()
    try:
        worker.proc.stdin.close()
    except OSError:  # a pipe whose reader died mid-write
        pass


def order(jobs: list[Job], seconds: dict[str, float] | None = None,
          priors: dict[str, float] | None = None) -> list[Job]:
    """Backends by their expected compile-seconds, fewest first, and each backend's jobs longest first: the
    checks of a backend wait for its last job (its gate), so this opens the gates soonest on average. A job's
    expected seconds: what an earlier run measured for it (``seconds``: job key -> seconds), else the mean
    measured for its backend, else the backend's declared hint (``priors``: job backend ->
    ``Capabilities.compile_s``), else the mean of everything measured, else 0. Equal estimates, and every job
    when nothing is known, keep backends interleaved (one job of each in turn). The jobs no gate waits for
    (``Job.gate`` False: configurations only the timings call) go after all the others."""
    by_backend: dict[str, list[Job]] = {}
    for job in jobs:
        by_backend.setdefault(job.backend, []).append(job)
    queues = list(by_backend.values())
    ordered = []
    while any(queues):
        for q in queues:
            if q:
                ordered.append(q.pop(0))
    seconds, priors = seconds or {}, {b: s for b, s in (priors or {}).items() if s is not None}
    if not seconds and not priors:
        return sorted(ordered, key=lambda job: not job.gate)
    per_backend: dict[str, list[float]] = {}
    for key, s in seconds.items():
        per_backend.setdefault(key.split(" | ", 1)[0], []).append(s)
    overall = sum(seconds.values()) / len(seconds) if seconds else 0.0

    def expected(job: Job) -> float:
        known = seconds.get(manifest.seconds_key(job))
        if known is not None:
            return known
        same = per_backend.get(job.backend)
        if same:
            return sum(same) / len(same)
        return priors.get(job.backend, overall)

    # A build shared by several jobs counts once in its backend's total, at its dearest job (the others
    # load what it made; what they measured was mostly waiting for it)
    builds: dict[tuple[str, str], float] = {}
    for job in ordered:
        if job.gate:
            key = (job.backend, job.build_key)
            builds[key] = max(builds.get(key, 0.0), expected(job))
    totals: dict[str, float] = {}
    for (backend, _), cost in builds.items():
        totals[backend] = totals.get(backend, 0.0) + cost
    ranked = sorted(ordered, key=lambda job: (totals.get(job.backend, 0.0), -expected(job)))  # stable: ties interleaved
    # then, within each backend, the jobs whose build an earlier job makes go after its builds
    seen: set[str] = set()
    follows = {}
    for job in ranked:
        follows[id(job)] = job.build_key in seen
        seen.add(job.build_key)
    return sorted(ranked, key=lambda job: (not job.gate, totals.get(job.backend, 0.0), follows[id(job)], -expected(job)))


def next_job(pending: list[Job], building: set[str], background_free: bool = True) -> int | None:
    """The index of the first pending job whose build no running job is making, or None: a job that would
    only wait for another process's build (FlashInfer's JIT holds a lock) would hold a worker idle, and
    loads the build in a moment once it is made. ``background_free``: whether another parallel build
    (``Job.background``) may start now (:func:`parallel_builds`); if not, such jobs wait too."""
    for index, job in enumerate(pending):
        if job.build_key not in building and (background_free or not job.background):
            return index
    return None


def run_pool(jobs: list[Job], *, device: str, envs: list[dict], budget_s: float, log_path: Path,
             on_result=None, on_start=None, deadline: float | None = None,
             seconds: dict[str, float] | None = None, priors: dict[str, float] | None = None,
             stop: threading.Event | None = None, checks_over: threading.Event | None = None,
             builds_at_once: tuple[int, int] | None = None) -> list[Result]:
    """Run ``jobs`` on ``len(envs)`` worker processes (one environment each, e.g. a pinned GPU), in the
    order of :func:`order` (``seconds``: what earlier runs took; ``priors``: the backends' hints).

    ``on_start(worker_index, job)`` and ``on_result(result)`` feed a live view. Past ``deadline``
    (time.monotonic), or once ``stop`` is set, the jobs not yet finished are reported ``skipped``; once
    ``checks_over`` is set, so are the gated jobs not yet started (only the timings' jobs still run).
    """
    pending = order(jobs, seconds, priors)
    at_once, max_jobs = builds_at_once or parallel_builds()
    results: list[Result] = []
    stopped_backends: dict[str, str] = {}  # backend -> why its remaining jobs are skipped
    with open(log_path, "a", encoding="utf-8") as log:
        workers = [_spawn(i, device, env, log) for i, env in enumerate(envs[: max(1, min(len(envs), len(pending)))])]

        def finish(worker: _Worker, outcome: str, seconds: float, message: str | None):
            job = worker.job
            result = job.result(outcome, seconds, message, worker.index)
            results.append(result)
            worker.job = None
            if outcome == "timeout":
                stopped_backends[job.backend] = f"{job.name} timed out compiling {job.config.key}"
            if on_result:
                on_result(result)

        try:
            while pending or any(w.job for w in workers):
                if deadline is not None and time.monotonic() > deadline or stop is not None and stop.is_set():
                    break
                for i, worker in enumerate(workers):
                    if worker.job is not None:
                        try:
                            line = worker.lines.get_nowait()
                        except queue.Empty:
                            if time.monotonic() - worker.started > budget_s:
                                _kill(worker)
                                finish(worker, "timeout", time.monotonic() - worker.started,
                                       f"no answer after {budget_s:g} s (compile budget); the process was stopped")
                                workers[i] = worker = _respawn(worker, device, log)
                            continue
                        if line is None:  # the process died mid-job
                            code = worker.proc.wait()
                            finish(worker, "crash", time.monotonic() - worker.started,
                                   f"the warm-up process died (exit status {code})")
                            workers[i] = worker = _respawn(worker, device, log)
                        elif line.startswith(MARKER):
                            data = json.loads(line[len(MARKER):])
                            finish(worker, data["outcome"], data["seconds"], data["message"])
                            if data["outcome"] == "crash":  # the process exits: replace it
                                worker.proc.wait()
                                workers[i] = worker = _respawn(worker, device, log)
                        else:
                            if line.strip():
                                log.write(line)
                            continue
                    while worker.job is None and pending:
                        running = [w.job for w in workers if w.job is not None]
                        index = next_job(pending, {j.build_key for j in running},
                                         sum(j.background for j in running) < at_once)
                        if index is None:
                            break  # every pending job waits for a build in progress
                        job = pending.pop(index)
                        why = stopped_backends.get(job.backend) or (
                            "the checks were over before it started" if job.gate and checks_over is not None
                            and checks_over.is_set() else None)
                        if why:
                            results.append(job.result("skipped", message=why))
                            if on_result:
                                on_result(results[-1])
                            continue
                        nice = BACKGROUND_NICE if job.background else 0
                        if worker.proc.poll() is not None or worker.nice != nice:
                            _retire(worker)  # (a niceness is kept for life: a process may not lower its own)
                            workers[i] = worker = _spawn(worker.index, device, worker.env, log, nice, max_jobs)
                        worker.send(job)
                        if on_start:
                            on_start(worker.index, job)
                time.sleep(0.05)
        finally:
            for worker in workers:
                if worker.job is not None:
                    results.append(worker.job.result("skipped", time.monotonic() - worker.started,
                                                     "the run's time limit ended it"))
                _retire(worker)
    for job in pending:
        results.append(job.result("skipped", message=stopped_backends.get(job.backend)
                                  or "the run's time limit came first"))
    return results


def summarize(results: list[Result]) -> dict[str, dict]:
    """Per backend: ``compile_s`` (sum of its jobs), ``configs`` and the job list for the report."""
    summary: dict[str, dict] = {}
    for r in results:
        entry = summary.setdefault(r.backend, {"compile_s": 0.0, "configs": 0, "warmup": []})
        entry["compile_s"] = round(entry["compile_s"] + r.seconds, 3)
        entry["configs"] += 1
        job = {"key": r.key, "seconds": r.seconds, "outcome": r.outcome, "message": r.message}
        if r.build:
            job["build"] = r.build
        if not r.gate:
            job["for"] = "timings"
        entry["warmup"].append(job)
    return summary


# -- the run's warm-up phase ------------------------------------------------------------------------------
@dataclass
class Plan:
    """A run's warm-up before it starts: every job, those still to run, those an earlier run settled."""
    jobs: list[Job]
    todo: list[Job]
    cached: list[Result]
    priors: dict[str, float]
    fingerprint: str
    done: set[str]
    failed: dict[str, tuple[str, str]]

    def warming(self) -> set[str]:
        """The backends (display names) whose checks must wait for this warm-up."""
        return {job.name for job in self.todo if job.gate}


def _build_key(backend, config: KernelConfig, device: str) -> str:
    """The backend's build key for ``config`` ("" when it declares none, or its method fails: then the job
    is scheduled on its own, which costs time, never a result)."""
    try:
        key = backend.build_key(config, device)
    except Exception:  # noqa: BLE001 (a third party's adapter must not stop the warm-up)
        return ""
    return str(key) if key else ""


def timing_configs(backend, device: str, known=()) -> list[KernelConfig]:
    """The configurations of the timings' shapes (benchmarks.py) that ``backend`` takes and ``known`` lacks."""
    from .benchmarks import shapes
    made: list[KernelConfig] = []
    for problem in shapes(device).values():
        config = KernelConfig.of(problem)
        if config not in known and config not in made and not backend.not_supported_reasons(problem):
            made.append(config)
    return made


def warm_configs(backend, seed: int, extra: int = 0, dtypes=()) -> tuple[KernelConfig, ...]:
    """The kernel configurations the checks of ``backend`` call (in ``dtypes``, if given): the run's
    (plugin.configs_for), then those the relations' own calls add (relations.folded_configs)."""
    from .plugin import configs_for
    from .relations import folded_configs
    configs = configs_for(backend, seed, extra)
    if dtypes:
        configs = tuple(c for c in configs if c.dtype in dtypes)
    return configs + tuple(c for c in folded_configs(configs) if c not in configs)


def plan_warmup(ns, chosen, device: str, cache_dir: Path, timed=()) -> Plan:
    """Every backend's kernel configurations (configs.py), less those an earlier run settled (the manifest);
    for the backends of ``timed`` (the run times them), also the configurations of the timings' shapes, which
    no check waits for (``Job.gate`` False): compiled beside the checks, not in the timings' first calls."""
    from . import profiles, registry
    seed = ns.seed if ns.seed is not None else 0
    extra = profiles.extra_kernel_configs(ns.profile) or 0
    jobs, priors = [], {}
    for spec, info in chosen:
        if not info.available:
            continue
        backend = registry.resolve(spec)
        if backend.capabilities.compile_s == 0:
            continue  # compiles nothing a cache could keep
        configs = warm_configs(backend, seed, extra, ns.dtype)
        packages = manifest.package_versions(backend.requires)
        background = backend.capabilities.parallel_build
        jobs += [Job(spec, info.name, c, packages, _build_key(backend, c, device), background) for c in configs]
        if spec in timed:
            jobs += [Job(spec, info.name, c, packages, _build_key(backend, c, device), background, gate=False)
                     for c in timing_configs(backend, device, configs)]
        priors[spec] = backend.capabilities.compile_s
    print_ = manifest.fingerprint(device)
    done, failed = manifest.load(cache_dir, print_), manifest.load_failed(cache_dir, print_)
    todo, cached = manifest.split_done(jobs, done, failed)
    return Plan(jobs, todo, cached, priors, print_, done, failed)


def run_warmup(ns, plan: Plan, device: str, run_dir: Path, env: dict, cache_dir: Path, console, deadline,
               worker_sets, view, gate_dir: Path | None = None, stop: threading.Event | None = None,
               checks_over: threading.Event | None = None) -> tuple[dict, dict]:
    """Run ``plan``: compile in a pool of worker processes (one environment per worker of ``worker_sets``),
    releasing each backend's gate in ``gate_dir`` when its last job ends (:class:`Beside` releases the rest
    however the warm-up ends); a backend that timed out compiling starts its checks as suspect
    (containment.py). ``view(jobs)`` is the warm-up view's context manager."""
    from . import containment
    envs = []
    for gpu, count in worker_sets:
        pinned = dict(env) if gpu is None else {**env, "CUDA_VISIBLE_DEVICES": gpu}
        envs += [pinned] * count
    started = time.monotonic()
    left: dict[str, int] = {}
    compiled: dict[str, float] = {}
    ready: dict[str, float] = {}  # backend -> seconds into the warm-up when its last job ended (its gate opened)
    gated = {(job.name, job.config.key) for job in plan.todo if job.gate}
    for job in plan.todo:
        if job.gate:
            left[job.name] = left.get(job.name, 0) + 1
    with view(plan.todo) as shown:
        def finished(result: Result) -> None:
            if result.outcome == "timeout":
                containment.mark(run_dir / ".flight", result.backend, "suspect",
                                 f"{result.backend} hung compiling {result.key}")
            compiled[result.backend] = compiled.get(result.backend, 0.0) + result.seconds
            if (result.backend, result.key) not in gated:
                shown.finished(result)
                return
            left[result.backend] -= 1
            if left[result.backend] == 0:
                gates.release_gate(gate_dir, result.backend)
                ready[result.backend] = round(time.monotonic() - started, 1)
                if gate_dir is not None:
                    console.print(f"warm-up: {result.backend} ready after {ready[result.backend]:.0f} s "
                                  f"({compiled[result.backend]:.0f} s of compiling)", highlight=False)
            shown.finished(result)

        results = run_pool(plan.todo, device=device, envs=envs, budget_s=ns.compile_timeout,
                           log_path=run_dir / "warmup.log", on_start=shown.started, on_result=finished,
                           deadline=deadline, seconds=manifest.load_seconds(cache_dir), priors=plan.priors,
                           stop=stop, checks_over=checks_over) if plan.todo else []
    manifest.save(cache_dir, plan.fingerprint, plan.jobs, results, plan.done, plan.failed)
    results = plan.cached + results
    wall = round(time.monotonic() - started, 1)
    counts: dict[str, int] = {}
    for r in results:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    console.print(f"warm-up: {len(plan.jobs)} kernel configurations ({len(plan.cached)} settled by an earlier run) "
                  f"in {wall:g} s wall "
                  f"({', '.join(f'{n} {o}' for o, n in sorted(counts.items()))}; "
                  f"compile budget {ns.compile_timeout:g} s each)", highlight=False)
    return summarize(results), {"ran": True, "wall_s": wall, "jobs": len(plan.jobs), "outcomes": counts,
                                "budget_s": ns.compile_timeout, "ready_s": ready}


class Beside:
    """The warm-up running in a thread beside the checks: ``join()`` gives its summary and report entry.
    ``run(stop, checks_over)`` runs it; ``checks_over`` says the checks have ended (their jobs not yet
    started are skipped; the timings' still run), ``stopping`` ends it early (nothing more will use it);
    ``status()`` says what compiles now, for the live view. However the warm-up ends, every gate is
    released: no check waits on it."""

    def __init__(self, run, gate_dir: Path, names: set[str], status=lambda: ""):
        self.gate_dir, self.gates, self.status = gate_dir, names, status
        self.stopping, self.checks_over = threading.Event(), threading.Event()
        self._result, self._error = ({}, {"ran": False}), None

        def target():
            try:
                self._result = run(self.stopping, self.checks_over)
            except BaseException as exc:  # noqa: BLE001 - re-raised in join()
                self._error = exc
            finally:
                for name in names:
                    gates.release_gate(gate_dir, name)

        self._thread = threading.Thread(target=target, name="jfa-warmup", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Until the warm-up has ended (its result stays for :meth:`join`)."""
        self._thread.join()

    def join(self) -> tuple[dict, dict]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result


def start_beside(ns, chosen, device: str, run_dir: Path, env: dict, cache_dir: Path, console, deadline,
                 worker_sets, make_view, timed=()) -> Beside:
    """Plan the warm-up, open a gate per backend with something to compile, and run it in a thread
    (``make_view(jobs)``: a WarmupView, not live: the checks' view is, and shows its ``status()``). While
    both run, each GPU holds twice the processes: the warm-up's hand back their cached memory after every
    job, and the check workers' share (``env``, updated here) leaves room for every context."""
    from .containment import MEMORY_SHARE_ENV, WARMUP_SHARE, memory_share
    plan = plan_warmup(ns, chosen, device, cache_dir, timed)
    warm_env = dict(env)
    if plan.todo and device.startswith("cuda") and MEMORY_SHARE_ENV not in os.environ:
        per_gpu = max(n for _, n in worker_sets)
        env[MEMORY_SHARE_ENV] = str(memory_share(per_gpu, warmup_per_gpu=per_gpu))
        warm_env[MEMORY_SHARE_ENV] = str(WARMUP_SHARE)
    gate_dir = run_dir / ".flight" / "warming"
    gates.open_gates(gate_dir, plan.warming())
    if plan.todo:
        timings = sum(not job.gate for job in plan.todo)
        console.print(f"warm-up: compiling {len(plan.todo)} kernel configurations of "
                      f"{', '.join(sorted({job.name for job in plan.todo}))} beside the checks; their checks wait "
                      f"for them" + (f" ({timings} of them for the timings only, last)" if timings else ""),
                      highlight=False, soft_wrap=True)
    views = []

    def view(jobs):
        views.append(make_view(jobs))
        return views[-1]

    return Beside(lambda stop, checks_over: run_warmup(ns, plan, device, run_dir, warm_env, cache_dir, console,
                                                       deadline, worker_sets, view, gate_dir=gate_dir, stop=stop,
                                                       checks_over=checks_over),
                  gate_dir, plan.warming(), status=lambda: views[-1].status() if views else "starting")


def backend_times(names, warm_summary: dict, records: list[dict]) -> dict[str, dict]:
    """Per backend of ``names``: compile time (the warm-up's jobs) apart from check time (the checks'
    durations), the part of the check time spent compiling inside checks (records' ``jit``: Triton kernels,
    torch.compile graphs), and the worker processes that called it with what its first call in one cost
    beyond a later one (check_order.py)."""
    from .check_order import first_call_seconds
    first_calls = first_call_seconds(records)
    by_backend: dict[str, list[dict]] = {}
    for r in records:
        by_backend.setdefault(r["backend"], []).append(r)
    times = {}
    for name in names:
        mine, warm = by_backend.get(name, []), warm_summary.get(name, {})
        jit = [r["jit"] for r in mine if r.get("jit")]
        workers = {r.get("worker") for r in mine if r.get("outcome") in ("pass", "fail")} - {None}
        times[name] = {
            "compile_s": warm.get("compile_s", 0.0),
            "workers": len(workers), "first_call_s": first_calls.get(name),
            "check_s": round(sum(r.get("duration_s") or 0.0 for r in mine), 3),
            "check_jit_s": round(float(sum(j["seconds"] for j in jit)), 3),
            "check_jit_builds": sum(j["builds"] for j in jit),
            "kernel_configs_checked": len({c for r in mine for c in (r.get("kernel_configs") or ())}),
            "warmup": warm.get("warmup", []),
        }
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.warmup", description="warm-up worker process")
    parser.add_argument("--serve", action="store_true", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--nice", type=int, default=0, help="lower this process's CPU priority by this much first")
    ns = parser.parse_args(argv)
    if ns.nice:
        _lower_priority(ns.nice)
    return serve(ns.device)


if __name__ == "__main__":
    sys.exit(main())
