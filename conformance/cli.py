"""``jfa-conformance``: list backends, run the spec and report, compare and merge reports.

``run`` drives pytest in a child process (hypothesis draws the problems, pytest-xdist runs the checks in
worker processes that are replaced when a backend kills one, pytest-timeout stops hung checks,
pytest-benchmark times the backends) and turns what the recorder plugin writes into
``reports/<run-name>/``: report.json, summary.md, index.html, junit.xml and, with ``--bench``,
benchmark.json.

Exit codes: 0 every check passed or was declared unsupported / an expected failure; 1 any failure, crash,
timeout or check that never ran, a backend that supports nothing, or (with ``--baseline``) a new failure
or a timing regression; 2 usage error.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.metadata
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from . import workers
from .configs import coverage_of
from .environment import environment
from .live import LiveView, WarmupView
from .reporting.perf import BENCH_NOT_ASKED
from .pytest_session import BenchmarkSession, RunStopped, run_pytest, stop_on_sigterm, timed_specs
from .warmup import backend_times

USAGE_ERROR = 2
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_COMPILE_TIMEOUT_S = 600.0  # one warm-up job: a backend compiling one kernel configuration
# Every check can cost its worker (segfault, device fault), and a crashed check is never retried, so the
# number of restarts is bounded by the number of checks; this only stops a run that restarts in a loop.
DEFAULT_MAX_WORKER_RESTART = 2000
# Overall budget of a run per profile, seconds (--time-limit overrides; 0 means none). What it does not
# reach is reported not-run, with the reason.
DEFAULT_TIME_LIMIT_S = {"ci": 1800.0, "dev": 7200.0}


class UsageError(Exception):
    """Bad command-line input; the message names the option."""


def _console():
    from rich.console import Console
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 140)  # CI logs: do not fold tables into 80 columns
    return console


# -- list -----------------------------------------------------------------------------------------------
def _caps_text(caps: dict) -> str:
    if not caps:
        return ""
    bits = [",".join(d.replace("float", "f").replace("bf16", "bf16") for d in caps["dtypes"]),
            "causal " + "/".join(caps["causal_modes"])]
    bits.append("GQA" if caps["gqa"] else "no GQA")
    bits.append(f"bcast-Q {caps['broadcast_q']}")
    bits.append("bwd" if caps["backward"] else "no bwd")
    bits.append("LSE" if caps["lse"] else "no LSE")
    if caps.get("deterministic"):
        bits.append("deterministic")
    if caps.get("head_dims"):
        bits.append("D in " + ",".join(map(str, caps["head_dims"])))
    elif caps.get("max_head_dim"):
        bits.append(f"D <= {caps['max_head_dim']}")
    if caps.get("min_compute_capability"):
        bits.append("sm >= {}.{}".format(*caps["min_compute_capability"]))
    return "; ".join(bits)


def cmd_list(ns) -> int:
    from . import registry

    from .plugin import default_device

    device = ns.device or default_device()
    names = registry.known_names() + [b for b in ns.backend if b not in registry.known_names()]
    infos = []
    for name in names:
        try:
            info = registry.describe(name, device)
        except (ValueError, ImportError) as exc:
            raise UsageError(f"--backend: {exc}") from None
        if name in registry.known_names():
            info.name = name  # the name that selects it (an entry point's key), whatever the class calls itself
        infos.append(info)
    if ns.json:
        print(json.dumps([info.__dict__ for info in infos], indent=1, default=list))
        return 0
    from rich.table import Table
    table = Table(title=f"Backends on {device}", show_lines=False)
    for column in ("backend", "available", "capabilities (or why it is not available)", "source"):
        table.add_column(column, overflow="fold")
    for info in infos:
        detail = _caps_text(info.capabilities) if info.available else f"[yellow]{info.reason}[/]"
        table.add_row(info.name, "[green]yes[/]" if info.available else "[red]no[/]", detail, info.source)
    console = _console()
    console.print(table)
    note = registry.registration_note()
    if note:
        console.print(f"[yellow]note:[/] {note}")
    return 0


# -- run ------------------------------------------------------------------------------------------------
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


def _threshold(text: str) -> float:
    try:
        value = float(text.rstrip("%")) / (100.0 if text.endswith("%") else 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction like 0.1 or a percentage like 10%, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _triage_file(text: str) -> str:
    """``--triage-file``: checked when the command line is read, so a bad file stops the run before it starts."""
    from .reporting.triage import TriageFileError, load_triage_file
    try:
        load_triage_file(text)
    except TriageFileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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


def _run_option(report: dict, option: str) -> str | None:
    """The value ``option`` had on the run's command line (``run.command``), or None."""
    try:
        tokens = shlex.split(str((report.get("run") or {}).get("command") or ""))
    except ValueError:
        return None
    value = None
    for i, token in enumerate(tokens):
        if token == option and i + 1 < len(tokens):
            value = tokens[i + 1]
        elif token.startswith(option + "="):
            value = token.partition("=")[2]
    return value


def write_run_dir(run_dir: Path, report: dict, regressions: list[dict] | None = None, *,
                  baseline_backend: str | None = None, triage_file: str | None = None) -> None:
    """report.json, summary.md and index.html in ``run_dir``, and every failure's reproducer (artifact and
    standalone script) in its ``failures/``. ``baseline_backend`` and ``triage_file`` default to the run's
    ``--baseline-backend`` and ``--triage-file``, then to what the report already holds."""
    from . import replay
    from . import report as rp
    from .reporting import render_html, render_markdown, triage
    run_dir = Path(run_dir)
    report["summary"] = rp.summarize_backends(report)
    baseline_backend = baseline_backend or _run_option(report, "--baseline-backend")
    if baseline_backend:
        report["run"]["baseline_backend"] = baseline_backend
    triage_file = triage_file or _run_option(report, "--triage-file")
    if triage_file:
        try:
            report["triage"] = {"file": str(triage_file), "entries": triage.load_triage_file(triage_file)}
        except triage.TriageFileError as exc:
            print(f"jfa-conformance: --triage-file: {exc}", file=sys.stderr)
    try:
        replay.write_reproducers(run_dir, report)
    except Exception as exc:  # noqa: BLE001 - report.json and the exit code matter more than reproducers
        print(f"jfa-conformance: could not write reproducers: {type(exc).__name__}: {exc}", file=sys.stderr)
    groups = triage.groups(report["records"], (report.get("triage") or {}).get("entries"))
    for group in groups:
        for r in group.records:
            r["summary"], r["signature"] = triage.summary(r), group.id
    report["causes"] = [g.as_dict() for g in groups]
    rp.write_json(run_dir / "report.json", report)
    for filename, render in (("summary.md", render_markdown), ("index.html", render_html)):
        try:
            rp.atomic_write_text(run_dir / filename, render(report, regressions))
        except Exception as exc:  # noqa: BLE001 - report.json and the exit code matter more than a page
            print(f"jfa-conformance: could not render {filename}: {type(exc).__name__}: {exc}", file=sys.stderr)


def print_summary(console, report: dict, regressions: list[dict], run_dir: Path | None) -> None:
    from rich.markup import escape
    from rich.table import Table

    from . import report as rp
    from .reporting import perf, triage
    times = perf.backend_times(report)
    table = Table(title="Conformance")
    time_keys = perf.time_columns(times)
    columns = ["backend", "verdict", "pass", "fail", "crash", "timeout", "not run", "xfail", "unsupported",
               "worst budget"] + [perf.TIME_LABELS[k] for k in time_keys]
    for column in columns:
        table.add_column(column, justify="left" if column in ("backend", "verdict") else "right")
    colour = {"conformant": "green", "failing": "bold red", "incomplete": "yellow", "supports nothing": "yellow"}
    for name, s in rp.summarize_backends(report).items():
        c = s["counts"]
        budget = s["worst_budget"]
        cells = [escape(name), f"[{colour.get(s['verdict'], '')}]{s['verdict']}[/]", str(c["pass"]), str(c["fail"] or ""),
                 str(c["crash"] or ""), str(c["timeout"] or ""), str(c["not-run"] or ""),
                 str(c["expected-fail"] or ""), str(c["unsupported"] or ""),
                 "" if budget is None else ("inf" if budget == float("inf") else f"{budget:.0%}")]
        if times:
            t = times.get(name) or {}
            cells += ["" if t.get(k) is None else f"{t[k]:.1f}" for k in time_keys]
        table.add_row(*cells)
    console.print(table)
    style = {"crash": "bold magenta", "fail": "bold red", "timeout": "bold yellow"}
    groups = triage.groups(report["records"], (report.get("triage") or {}).get("entries"))
    for group in groups[:20]:
        count = f" x{len(group.records)}" if len(group.records) > 1 else ""
        console.print(f"[{style.get(group.outcome, 'bold')}]{group.outcome.upper()}[/] {escape(group.backend)}{count}: "
                      f"{escape(group.summary)}", highlight=False, soft_wrap=True)
        if group.label:
            console.print(f"    known: {group.label}" + (f" ({group.link})" if group.link else ""), markup=False,
                          soft_wrap=True)
        if group.shared_text():
            console.print(f"    {group.shared_text()}", markup=False, soft_wrap=True)
        checks = ", ".join(r["feature"] + (f" [{r['dtype']}]" if r.get("dtype") else "") for r in group.records)
        console.print(f"    checks: {checks}", markup=False, soft_wrap=True)
        first = group.smallest() or group.records[0]
        if first.get("counterexample"):
            console.print(f"    {rp.problem_label(first)}: {first['counterexample']}", markup=False, soft_wrap=True)
        script = (first.get("replay") or {}).get("script")
        if script:
            where = Path(run_dir) / script if run_dir is not None else Path(script)
            console.print(f"    reproduce: python {where}", markup=False, soft_wrap=True)
    if len(groups) > 20:
        console.print(f"... and {len(groups) - 20} more causes (see summary.md)")
    built = perf.jit_in_checks(report, limit=3)
    if built and built[0]["seconds"] >= 1.0:  # what the warm-up did not prepare (a second or more of it)
        total = sum((t.get("check_jit_s") or 0.0) for t in times.values())
        console.print(f"[yellow]compiling inside checks[/]: {total:.0f} s; most in "
                      + "; ".join(f"{escape(b['id'].rsplit('/', 1)[-1])} ({b['seconds']:.1f} s: "
                                  f"{escape(', '.join(b['what']))})" for b in built), highlight=False, soft_wrap=True)
    run = report["run"]
    for phase in (rp.check_phase_text(run.get("checks")), rp.timing_phase_text(run.get("timing_phase"))):
        if phase:
            console.print(phase, markup=False, highlight=False, soft_wrap=True)
    unrun, _ = rp.unrun_checks(report)
    if unrun:
        console.print(f"[yellow]not run[/] (no verdict): {sum(map(len, unrun.values()))} checks of "
                      f"{', '.join(escape(b) for b in unrun)}", highlight=False, soft_wrap=True)
    for r in regressions:
        console.print(f"[bold red]REGRESSION[/] {r['kind']}: {escape(r['what'])} — {escape(r['detail'])}", soft_wrap=True)
    if run_dir is not None:
        console.print(f"report: {run_dir / 'index.html'}  (also report.json, summary.md, junit.xml, failures/)",
                      markup=False)


def _unfinished_checks(ns) -> list[str]:
    """Ids (``check_key``) of the checks ``--resume``'s report has no verdict for; fills in its backends and
    profile where the command line gives none."""
    from . import report as rp
    from .plugin import check_key
    try:
        earlier = rp.load(ns.resume)
    except rp.ReportError as exc:
        raise UsageError(f"--resume: {exc}") from None
    unfinished = [r for r in earlier["records"] if r["outcome"] == "not-run"]
    if not ns.backend:
        from . import registry
        known = set(registry.known_names())
        names = sorted({r["backend"] for r in unfinished})
        # a name the registry knows, else where the earlier run loaded the backend from (module:attr, file.py:attr)
        ns.backend = [n if n in known else earlier.get("backends", {}).get(n, {}).get("source") or n for n in names]
    ns.profile = ns.profile or earlier["run"].get("profile") or "ci"
    return [check_key(r["id"]) for r in unfinished]


def cmd_run(ns) -> int:
    from . import report as rp
    from .plugin import default_device
    from .problem import DTYPES

    console = _console()
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
    baseline = None
    if ns.baseline:
        try:
            baseline = rp.load(ns.baseline)
        except rp.ReportError as exc:
            raise UsageError(f"--baseline: {exc}") from None
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
    chosen = _resolve_backends(ns.backend, device)
    if not chosen:
        console.print(f"[bold red]no backend is available on {device}[/]; see `jfa-conformance list`")
        return 1
    specs = [spec for spec, _ in chosen]
    from . import registry
    note = None if ns.backend else registry.registration_note()
    if note:
        console.print(f"[yellow]note:[/] {note}")
    name = ns.name or f"{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}-{ns.profile}"
    run_dir = Path(ns.report_dir) / name
    if (run_dir / "report.json").exists():
        raise UsageError(f"--name: {run_dir} already holds a report")
    (run_dir / ".flight").mkdir(parents=True, exist_ok=True)
    records_path = run_dir / ".records.jsonl"
    records_path.unlink(missing_ok=True)
    n_workers = _worker_count(ns, device)
    from .cache import default_dir, size_of
    cache_dir = Path(ns.cache_dir).expanduser() if ns.cache_dir else default_dir()
    cache_bytes = size_of(cache_dir)
    env = _child_env(device, n_workers, cache_dir)
    if device.startswith("cuda"):  # workers sharing a GPU hand back cached memory beyond an equal part of it
        from .containment import MEMORY_SHARE_ENV, memory_share
        env.setdefault(MEMORY_SHARE_ENV, str(memory_share(max(n for _, n in _worker_sets(ns, device)))))
    if ns.time_limit is None:
        ns.time_limit = DEFAULT_TIME_LIMIT_S.get(ns.profile)
    ns.time_limit = ns.time_limit or None  # 0: no limit
    command = _pytest_command(ns, run_dir, specs, device)
    if unfinished:
        only = run_dir / ".resume-ids"
        only.write_text("\n".join(unfinished) + "\n")
        command += ["--jfa-only", str(only)]
    from . import check_order
    from .cache import check_seconds_file
    seconds_kind = check_order.run_kind(device, ns.profile, ns.max_examples)
    # the checks run longest expected first, from this run's copy of the seconds earlier runs measured
    command += ["--jfa-check-seconds", str(check_order.snapshot(check_seconds_file(cache_dir), seconds_kind,
                                                                run_dir / ".check-seconds.json"))]
    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.perf_counter()
    spec_of = {info.name: spec for spec, info in chosen}
    env_info = environment(device)

    timed_names: list[str] = []  # the backends the benchmarks time, once they start

    def assemble(records, *, complete, rc, bench_status, timings, stop_reason=None, gaps=(), timing_phase=None) -> dict:
        times = backend_times([info.name for _, info in chosen], warm_summary, records)
        return {
            "schema": rp.SCHEMA, "schema_version": rp.SCHEMA_VERSION,
            "run": {"name": name, "command": rp.home_relative("jfa-conformance " + shlex.join(ns.argv)),
                    "started": started.isoformat(timespec="seconds"),
                    "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    "duration_s": round(time.perf_counter() - t0, 1), "profile": ns.profile,
                    "max_examples": ns.max_examples,
                    "seed": ns.seed if ns.seed is not None else ("derandomized" if ns.profile == "ci" else None),
                    "dtypes": ns.dtype or None, "xfails_file": ns.xfails_file, "timeout_s": ns.timeout,
                    "time_limit_s": ns.time_limit, "workers": n_workers, "gpus": ns.gpus, "pytest_exit_code": rc,
                    "benchmarks": bench_status, "timed_backends": timed_names or None, "complete": complete,
                    "stopped": stop_reason,
                    "resumed_from": ns.resume, "cache_dir": rp.home_relative(str(cache_dir)), "cache_bytes_before": cache_bytes,
                    "warmup": warm_info, "checks": check_phase, "timing_phase": timing_phase, "environment": env_info},
            "backends": {info.name: {"source": info.source, "available": info.available, "reason": info.reason,
                                     "capabilities": info.capabilities, "time": times[info.name]}
                         for _, info in chosen},
            "coverage": coverage_of(records),
            "records": records,
            "timings": timings,
            "timing_gaps": list(gaps),
        }

    def snapshot() -> None:
        """report.json of what has run so far (``complete: false``), in case this process is killed."""
        collected, records, _ = rp.read_record_stream(records_path)
        records = rp.complete_records(collected, records, "not reached yet: the run was still going")
        partial = assemble(records, complete=False, rc=None, bench_status="not run yet", timings=[],
                           stop_reason="snapshot taken while the run was going; the process never finished")
        partial["summary"] = rp.summarize_backends(partial)
        rp.write_json(run_dir / "report.json", partial)

    console.print(f"jfa-conformance run [bold]{name}[/]: {', '.join(info.name for _, info in chosen)} on {device}, "
                  f"profile {ns.profile}, {n_workers} worker{'s' if n_workers > 1 else ''}, compile caches in {cache_dir} "
                  f"({cache_bytes / 1e6:.0f} MB)", highlight=False)
    import signal
    previous = signal.signal(signal.SIGTERM, stop_on_sigterm)
    records, timings, rc, finished, bench_status, check_phase = [], [], None, False, "not run", None
    gaps: list[dict] = []  # timings that failed or could not be made (pytest_session.timing_gaps)
    timing_phase = None  # where the timings' session spent its time (pytest_session.timing_phase)
    timing_session = None  # the benchmark session, started with the checks (pytest_session.BenchmarkSession)
    collected = None
    warm_summary, warm_info = {}, {"ran": False}
    try:
        deadline = time.monotonic() + ns.time_limit if ns.time_limit else None
        bench = ns.bench if ns.bench is not None else device.startswith("cuda")
        timed = timed_specs(ns.backend, chosen)
        warming, stop_reason = None, None
        if ns.warmup if ns.warmup is not None else device.startswith("cuda"):
            from .warmup import start_beside
            warming = start_beside(ns, chosen, device, run_dir, env, cache_dir, console, deadline,
                                   _worker_sets(ns, device), lambda jobs: WarmupView(console, jobs, enabled=False),
                                   timed=timed if bench else ())
            if warming.gates:  # the checks of the backends still compiling wait at their gates
                command += ["--jfa-warming", str(warming.gate_dir)]
        if bench and timed:  # its start-up and first calls beside the checks; its timings after them
            timing_session = BenchmarkSession(run_dir, timed, device, env, ns.timeout,
                                              after=warming.wait if warming is not None else None)
        checks_started = time.time()
        try:
            with LiveView(console, enabled=not ns.quiet, flight_dir=run_dir / ".flight",
                          compiling=warming.status if warming is not None and warming.gates else None) as view:
                rc, stop_reason = run_pytest(command, env, run_dir / "pytest.log", records_path, view, deadline, snapshot)
        finally:
            if warming is not None:  # the checks are over (a full run's gates are all open by then): what the
                warming.checks_over.set()  # warm-up has yet to compile for checks (-k left them out) serves nobody,
                if not (bench and rc is not None and stop_reason is None):  # and the rest only timings to come
                    warming.stopping.set()
                elif (left := warming.status()):
                    console.print(f"warm-up: the timings' kernels: {left}", highlight=False, soft_wrap=True)
                warm_summary, warm_info = warming.join()
        checks_wall = time.time() - checks_started
        collected, records, finished = rp.read_record_stream(records_path)
        check_phase = rp.check_phase(records, checks_started, checks_wall, n_workers)
        if rc in (3, 4) and not records and stop_reason is None:
            log_tail = (run_dir / "pytest.log").read_text(errors="replace")[-3000:]
            console.print(log_tail, markup=False)
            console.print(f"[bold red]pytest could not run the spec (exit code {rc}); see {run_dir / 'pytest.log'}[/]")
            (run_dir / "report.json").unlink(missing_ok=True)
            return USAGE_ERROR if rc == 4 else 1
        records = rp.complete_records(
            collected, records, f"never ran: {stop_reason}" if stop_reason else
            "never ran: the run stopped before reaching it (see pytest.log)", stopped=stop_reason is not None)
        timings, bench_status, gaps = [], BENCH_NOT_ASKED, []
        if bench and stop_reason is None:
            timed_names[:] = [info.name for spec, info in chosen if spec in timed and info.available]
        if bench and stop_reason is not None:
            bench_status = f"not run: {stop_reason}"
        elif bench and not timed:
            bench_status = ("not run: no kernel backend to time (the references, and backends an interpreter runs, "
                            "are timed when named with --backend)")
        elif bench:
            timings, bench_status, gaps, timing_phase = timing_session.finish(console, deadline)
    except RunStopped as exc:  # SIGTERM while the benchmarks ran, or outside the checks' own stop handling
        stop_reason, bench_status = str(exc), f"stopped: {exc}"
        if collected is None:  # stopped before the checks' records were read: what they wrote, the rest not run
            collected, records, finished = rp.read_record_stream(records_path)
            records = rp.complete_records(collected, records, f"never ran: {stop_reason}", stopped=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if timing_session is not None:  # a run that ends without its timings: the session leaves
            timing_session.cancel()
    for r in records:
        if r["outcome"] in rp.FAILING and r["outcome"] != "not-run":
            r["replay"] = _replay(run_dir, r, spec_of)
    partial_junit = run_dir / ".junit.xml.partial"
    if partial_junit.exists():
        os.replace(partial_junit, run_dir / "junit.xml")
    complete = rp.verdicts_complete(collected, records, finished)
    report = assemble(records, complete=complete, rc=rc, bench_status=bench_status, timings=timings, gaps=gaps,
                      stop_reason=stop_reason, timing_phase=timing_phase)
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
        check_order.record(check_seconds_file(cache_dir), seconds_kind, report["records"])
    except OSError as exc:
        console.print(f"could not record the checks' seconds in {cache_dir}: {exc}", style="yellow", markup=False)
    if stop_reason:
        console.print(f"[bold yellow]{stop_reason}[/]: the checks that never ran are marked not-run")
    print_summary(console, report, regressions, run_dir)
    return report["run"]["exit_code"]


# -- compare and merge ----------------------------------------------------------------------------------
def _speedups(report: dict, baseline: str | None) -> dict[tuple[str, str, str], float]:
    from .reporting import perf
    return {(name, row.shape, row.direction): cell.speedup for row in perf.rows(report, baseline)
            for name, cell in row.cells.items() if cell.speedup is not None}


def cmd_compare(ns) -> int:
    from rich.table import Table

    from . import report as rp
    from .reporting import perf, triage
    try:
        old, new = rp.load(ns.old), rp.load(ns.new)
    except rp.ReportError as exc:
        raise UsageError(str(exc)) from None
    entries = None
    if ns.triage_file:
        try:
            entries = triage.load_triage_file(ns.triage_file)
        except triage.TriageFileError as exc:
            raise UsageError(f"--triage-file: {exc}") from None
    entries = entries if entries is not None else (new.get("triage") or {}).get("entries")
    diff = rp.compare(old, new, ns.timing_threshold)
    if ns.json:
        print(json.dumps(diff, indent=1))
        return 1 if rp.regressions_of(diff) else 0  # what --baseline gates on
    console = _console()
    console.print(f"[bold]{old['run'].get('name')}[/] -> [bold]{new['run'].get('name')}[/]")
    cause = {r["id"]: g for g in triage.groups(new["records"], entries) for r in g.records}

    def new_failure(f):
        g = cause.get(f["id"])
        text = f"{f['backend']} {f['feature']} {f.get('dtype') or ''}: {f['before']} -> {f['after']} "
        text += (triage.summary(g.records[0]) if g else f.get("reason") or "")
        if g is not None and g.label:
            text += f"  [known: {g.label}" + (f", {g.link}" if g.link else "") + "]"
        return text

    sections = [
        ("New failures", diff["new_failures"], new_failure),
        ("Fixed", diff["fixed"], lambda f: f"{f['backend']} {f['feature']} {f.get('dtype') or ''}: {f['before']} -> {f['after']}"),
        ("Error-budget changes (>= 5 points)", diff["budget_changes"][:25],
         lambda c: f"{c['backend']} {c['feature']} {c.get('dtype') or ''}: {c['before']:.0%} -> {c['after']:.0%}"),
        ("Timings lost (made by the baseline, failed or not made now)", diff["timings_lost"],
         lambda t: f"{t['backend']} {t['shape']} {t['direction']}: {t['before_s'] * 1e3:.3f} ms -> {t['outcome']}: "
                   f"{t['message']}"),
    ]
    for title, rows, fmt in sections:
        console.print(f"\n[bold]{title}[/] ({len(rows)})")
        for row in rows:
            console.print("  " + fmt(row), markup=False)
    changes = diff["timing_changes"]
    console.print(f"\n[bold]Timing changes[/] ({len(changes)})")
    if changes:
        base = perf.baseline_backend(new, ns.baseline_backend)
        before_sp, after_sp = _speedups(old, base), _speedups(new, base)
        old_rows = {rp.timing_key(t): t for t in old.get("timings", [])}
        new_rows = {rp.timing_key(t): t for t in new.get("timings", [])}
        table = Table(show_lines=False, title=f"speedups against {base}" if base else None)
        for column in ("backend", "shape", "direction", "before ms", "after ms", "change", "spread before / after",
                       "TFLOP/s after", f"speedup vs {base}" if base else "speedup", "verdict"):
            table.add_column(column, justify="left" if column in ("backend", "shape", "direction", "verdict") else "right")
        for t in sorted(changes, key=lambda t: (t["shape"], t["direction"], t["backend"])):
            key = (t["backend"], t["shape"], t["direction"])
            o, n = old_rows.get(key, {}), new_rows.get(key, {})
            s0, s1 = before_sp.get(key), after_sp.get(key)
            speed = "" if s0 is None and s1 is None else f"{perf.fmt_speedup(s0) or '-'} -> {perf.fmt_speedup(s1) or '-'}"
            spread = " / ".join(perf.fmt_spread(perf.Cell(r, None, None).spread) or "-" for r in (o, n)) if o and n else ""
            verdict = ("[bold red]REGRESSION[/]" if t["regression"] else
                       "[yellow]slower, within both runs' spread (not gated)[/]" if t["within_spread"] else
                       "[yellow]timed another way (one call / back to back): not compared[/]" if t.get("method_changed")
                       else "[green]faster[/]" if t["change"] < -ns.timing_threshold else "")
            table.add_row(t["backend"], t["shape"], t["direction"], f"{t['before_s'] * 1e3:.3f}", f"{t['after_s'] * 1e3:.3f}",
                          f"{t['change']:+.0%}", spread, f"{n['tflops']:.3g}" if n.get("tflops") is not None else "",
                          speed, verdict)
        console.print(table)
    if diff["only_in_old"] or diff["only_in_new"]:
        console.print(f"\nchecks only in {ns.old}: {len(diff['only_in_old'])}; only in {ns.new}: {len(diff['only_in_new'])}")
    return 1 if rp.regressions_of(diff) else 0  # what --baseline gates on


def cmd_merge(ns) -> int:
    from . import report as rp
    try:
        reports = [rp.load(path) for path in ns.reports]
    except rp.ReportError as exc:
        raise UsageError(str(exc)) from None
    name = ns.name or f"merged-{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}"
    out = Path(ns.output) if ns.output else Path(ns.report_dir) / name
    merged = rp.merge(reports, name=name)
    merged["run"]["exit_code"] = rp.exit_code(merged)
    write_run_dir(out, merged)
    console = _console()
    print_summary(console, merged, [], out)
    return merged["run"]["exit_code"]


# -- delegated subcommands ------------------------------------------------------------------------------
def _delegate(module: str, argv: list[str]) -> int:
    try:
        target = importlib.import_module(f"conformance.{module}")
    except ModuleNotFoundError as exc:
        if exc.name != f"conformance.{module}":
            raise
        print(f"jfa-conformance {module}: not available in this installation (conformance.{module} is missing)",
              file=sys.stderr)
        return USAGE_ERROR
    return int(target.main(argv) or 0)


# -- parser ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jfa-conformance", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("list", help="every known backend, whether it is available here, and its capabilities")
    p.add_argument("--device", help="device to check availability on (default: cuda if available, else cpu)")
    p.add_argument("--backend", action="append", default=[], help="also describe this reference (module:attr, file.py:attr)")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("run", help="run the spec and write a report (default: every available backend, profile ci)")
    p.add_argument("--backend", action="append", default=[], metavar="NAME",
                   help="backend to test (repeatable): a name from `list`, an entry point, module:attr or file.py:attr")
    p.add_argument("--device", help="device to run on (default: cuda if available, else cpu)")
    p.add_argument("--profile", help="hypothesis profile: ci (default), dev, thorough; with --resume, that run's")
    p.add_argument("--dtype", action="append", default=[], help="only these dtypes (repeatable)")
    p.add_argument("--max-examples", type=_positive_int, help="hypothesis examples per check (overrides the profile)")
    p.add_argument("--xfails-file", help="expected failures: node-id substrings, one per line ('# reason' allowed)")
    p.add_argument("--bench", action=argparse.BooleanOptionalAction, default=None,
                   help="time forward and backward with pytest-benchmark (default: on for CUDA, off on CPU)")
    p.add_argument("--report-dir", default="reports", help="parent of the run directory (default: reports)")
    p.add_argument("--name", help="run directory name (default: UTC time and profile)")
    p.add_argument("--baseline", help="an earlier report.json: exit 1 on new failures and timing regressions")
    p.add_argument("--timing-threshold", type=_threshold, default=0.10,
                   help="slowdown counted as a timing regression (default 10%%; '0.1' or '10%%')")
    p.add_argument("--baseline-backend", metavar="NAME",
                   help="backend the report's speedups are measured against (default: the first vendor kernel timed)")
    p.add_argument("--triage-file", type=_triage_file, metavar="PATH",
                   help="JSON (or TOML) file mapping failure signatures to a label and an upstream link, shown in "
                   "the report (format: conformance/reporting/triage.py)")
    p.add_argument("-n", "--workers", type=_positive_int,
                   help="worker processes (default: cores, at most 4, on CPU; on CUDA one per core but one, "
                   "bounded by host and GPU memory)")
    p.add_argument("--gpus", help="pin the workers to GPUs, split evenly: 'all' or indices like 0,1")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help=f"seconds one check may run before it is stopped and reported as a timeout (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--compile-timeout", type=float, default=DEFAULT_COMPILE_TIMEOUT_S, metavar="SECONDS",
                   help="seconds the warm-up may spend compiling one backend's kernel configuration "
                   f"(default {DEFAULT_COMPILE_TIMEOUT_S:g}); the per-check --timeout applies to checks")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                   help="compile every kernel configuration before the checks, in parallel, timed apart "
                   "(default: on for CUDA; off on CPU, where Triton interprets and nothing compiles)")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="compile caches shared by the workers and by later runs (Triton, FA4's CuTe DSL, "
                   "inductor, CUDA); default $JFA_CACHE_DIR, else ~/.cache/jfa-conformance")
    p.add_argument("--max-worker-restart", type=int, default=DEFAULT_MAX_WORKER_RESTART,
                   help=f"crashed workers replaced before the run stops (default {DEFAULT_MAX_WORKER_RESTART})")
    p.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="the run's overall budget: stop after this many seconds and report what ran (the rest is "
                   "not-run, with the reason); default "
                   + ", ".join(f"{s:g} s for {p}" for p, s in DEFAULT_TIME_LIMIT_S.items()) + ", none otherwise; 0: none")
    p.add_argument("--seed", type=int, help="hypothesis seed (ci is derandomized; other profiles draw one at random "
                   "and record it in the report)")
    p.add_argument("-k", help="only checks matching this pytest -k expression")
    p.add_argument("--resume", metavar="REPORT",
                   help="run only the checks an earlier report has no verdict for (not-run: cut off by a time limit "
                   "or a stop), with its backends and profile unless given; then `merge` the two reports")
    p.add_argument("-q", "--quiet", action="store_true", help="no live progress view")

    for command, text in (("compare", "differences between two reports: new and fixed failures, budget and timing changes"),):
        p = sub.add_parser(command, help=text + " (exit 1 when NEW has new failures or timing regressions)")
        p.add_argument("old", help="report.json or its run directory")
        p.add_argument("new", help="report.json or its run directory")
        p.add_argument("--timing-threshold", type=_threshold, default=0.10, help="slowdown counted as a regression")
        p.add_argument("--baseline-backend", metavar="NAME",
                       help="backend the speedups are measured against (default: the first vendor kernel timed)")
        p.add_argument("--triage-file", type=_triage_file, metavar="PATH",
                       help="label new failures by cause (default: the labels the new report holds)")
        p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("merge", help="one report from shards run on several GPUs or machines")
    p.add_argument("reports", nargs="+", help="report.json files or run directories")
    p.add_argument("-o", "--output", help="directory of the merged report (default: <report-dir>/<name>)")
    p.add_argument("--report-dir", default="reports")
    p.add_argument("--name", help="name of the merged run")

    sub.add_parser("selftest", help="run the spec against built-in mutant backends", add_help=False)
    sub.add_parser("replay", help="re-run one failed check from its artifact", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    import torch
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run interpreted
    if argv and argv[0] in ("selftest", "replay"):
        return _delegate(argv[0], argv[1:])
    parser = build_parser()
    ns = parser.parse_args(argv)  # exits 2 on bad usage
    ns.argv = argv
    if ns.command is None:
        parser.print_help()
        return USAGE_ERROR
    handlers = {"list": cmd_list, "run": cmd_run, "compare": cmd_compare, "merge": cmd_merge}
    try:
        return handlers[ns.command](ns)
    except UsageError as exc:
        print(f"jfa-conformance {ns.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
