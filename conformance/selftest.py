"""``jfa-conformance selftest``: run the spec against every built-in mutant and show which checks catch it.

Each mutant (see :mod:`conformance.mutants`; the bug class it renders is cataloged in
``conformance/BUGS.md``) runs in its own pytest process, several at a time, so a mutant that crashes
cannot hide the others. The processes are forked from a server that has imported torch, hypothesis and the
spec's plugin once (multiprocessing's forkserver): a fresh interpreter per mutant spent about 3 s of its
4 s importing them. The control (the mutants' computation with no bug) runs
too: it must pass, or the spec rejects correct kernels. The self-test fails when a mutant survives,
when the control fails, or when a run ends in an error instead of a failed check.

Hypothesis draws the same examples as under the chosen profile but does not shrink them (shrinking
only makes a counterexample smaller; it cannot change whether a mutant is caught), which keeps the
self-test fast. By default each mutant stops at its first failed check (``-x``), which is all a verdict
needs; ``--all-checks`` runs every check and the table shows everything that catches each mutant (about
five times longer).
"""
from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import sys
import tempfile
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import Phase, settings

from . import configs, mutants, profiles
from .strategies import declared_values

SPEC_DIR = Path(__file__).resolve().parent / "spec"
NO_SHRINK_SUFFIX = "-noshrink"
SEEDED_SUFFIX = "-seeded"  # the same profile drawn from --hypothesis-seed instead of its own fixed draws
# Cheap checks first, so that --first-failure stops a mutant early; any other spec module runs after.
CHEAP_FIRST = ("test_edge_cases.py", "test_oracle_checks.py", "test_metamorphic.py")
CONTROL = "Unmutated"


def _register_no_shrink_profiles() -> None:
    # Runs when pytest imports this module through ``-p conformance.selftest``, i.e. before hypothesis's
    # plugin loads --hypothesis-profile, so the derived names exist by then.
    kept = tuple(p for p in Phase if p not in (Phase.shrink, Phase.explain))
    for name in profiles.PROFILES:
        base = settings(settings.get_profile(name), phases=kept)
        settings.register_profile(name + NO_SHRINK_SUFFIX, base)
        # a derandomized profile ignores --hypothesis-seed: the seeded variant draws from it
        settings.register_profile(name + NO_SHRINK_SUFFIX + SEEDED_SUFFIX, settings(base, derandomize=False, database=None))


_register_no_shrink_profiles()


@dataclass
class MutantResult:
    class_name: str
    name: str
    bug: str
    catalog_id: str | None = None
    caught_by: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    returncode: int = 0
    output: str = ""
    coverage: dict[str, dict[str, int]] = field(default_factory=dict)  # the control's: axis -> value -> examples

    @property
    def is_control(self) -> bool:
        return self.class_name == CONTROL

    @property
    def ok(self) -> bool:
        """A mutant is caught by at least one check; the control passes every check."""
        if self.errors or self.returncode not in (0, 1):
            return False
        return not self.caught_by if self.is_control else bool(self.caught_by)


def _check_label(testcase: ET.Element, backend_name: str) -> str:
    """``test_edge_case[queries_without_keys-float32]`` from the test name, without the backend id."""
    name = testcase.get("name", "?")
    head, bracket, params = name.partition("[")
    if not bracket:
        return name
    params = params.rstrip("]")
    params = params.replace(backend_name, "", 1).strip("-")
    return f"{head}[{params}]" if params else head


def _read_junit(path: Path, result: MutantResult) -> None:
    for testcase in ET.parse(path).getroot().iter("testcase"):
        label = _check_label(testcase, result.name)
        if testcase.find("failure") is not None:
            result.caught_by.append(label)
        elif testcase.find("error") is not None:
            result.errors.append(label)
        elif testcase.find("skipped") is not None:
            result.skipped.append(label)
        else:
            result.passed.append(label)


def spec_files() -> list[str]:
    def rank(path: Path):
        return (CHEAP_FIRST.index(path.name) if path.name in CHEAP_FIRST else len(CHEAP_FIRST), path.name)

    return [str(p) for p in sorted(SPEC_DIR.glob("test_*.py"), key=rank)]


def spec_command(class_name: str, profile: str, junit: Path, *, first_failure: bool, device: str | None,
                 records: Path | None = None, seed: int | None = None) -> list[str]:
    command = [
        sys.executable, "-m", "pytest", *spec_files(), "-q", "-p", "no:cacheprovider",
        "-p", "conformance.plugin", "-p", "conformance.selftest",
        "--backend", mutants.backend_spec(class_name),
        "--hypothesis-profile", profile + NO_SHRINK_SUFFIX + (SEEDED_SUFFIX if seed is not None else ""),
        f"--junitxml={junit}", "-o", "junit_family=xunit1",
    ]
    if records is not None:
        command.append(f"--jfa-records={records}")
    if seed is not None:  # other draws (and other kernel configurations) than the profile's own
        command.append(f"--hypothesis-seed={seed}")
    if first_failure:
        command.append("--maxfail=1")
    if device:
        command += ["--device", device]
    return command


# What every mutant's pytest session imports; the fork server imports it once.
PRELOAD = ["torch", "hypothesis", "pytest", "conformance.plugin", "conformance.selftest"]


@functools.cache
def _context():
    """The forkserver context, its preload set once per process (the server starts at the first mutant)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def _pytest_in_child(args: list[str], log: str, threads: int | None) -> None:
    """A fork server's child: ``pytest.main(args)`` with stdout and stderr in ``log``, its exit status the
    process's; ``threads``: torch's CPU threads (the cores shared among the mutants running at once)."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import pytest
    import torch
    if threads:
        torch.set_num_threads(threads)
    status = pytest.main(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(status))


def run_pytest(command: list[str], log: Path, timeout: float | None, threads: int | None = None) -> int | None:
    """Run ``command`` (``python -m pytest ...``, as :func:`spec_command` builds it) in a process forked
    from the fork server; its exit status, or None when it ran past ``timeout`` (it is killed)."""
    assert command[1:3] == ["-m", "pytest"], command
    process = _context().Process(target=_pytest_in_child, args=(command[3:], str(log), threads), daemon=True)
    process.start()
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()
        return None
    return process.exitcode


def run_one(class_name: str, profile: str = profiles.DEFAULT, *, first_failure: bool = False,
            device: str | None = None, timeout: float | None = None, seed: int | None = None,
            threads: int | None = None) -> MutantResult:
    cls = getattr(mutants, class_name)
    result = MutantResult(class_name, cls.name, cls.bug, cls.catalog_id)
    with tempfile.TemporaryDirectory() as tmp:
        junit, log = Path(tmp) / "junit.xml", Path(tmp) / "pytest.log"
        # the control runs every check (it passes them): its records say which values the run exercised
        records = Path(tmp) / "records.jsonl" if class_name == CONTROL else None
        command = spec_command(class_name, profile, junit, first_failure=first_failure, device=device,
                               records=records, seed=seed)
        returncode = run_pytest(command, log, timeout, threads)
        if returncode is None:
            result.returncode, result.errors = -1, [f"timed out after {timeout} s"]
            return result
        result.returncode = returncode
        result.output = log.read_text(errors="replace") if log.exists() else ""
        if junit.exists():
            _read_junit(junit, result)
        if records is not None and records.exists():
            lines = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
            result.coverage = configs.coverage_of(lines).get(cls.name, {})
        elif returncode not in (0, 1):
            result.errors.append(f"pytest exited with status {returncode}")
    return result


def run_selftest(class_names: list[str] | None = None, profile: str = profiles.DEFAULT, *, first_failure: bool = False,
                 jobs: int | None = None, device: str | None = None, control: bool = True,
                 timeout: float | None = None, seed: int | None = None) -> list[MutantResult]:
    """Results for the control (first, unless ``control`` is False) and each named mutant (default: every
    built-in one, :data:`mutants.MUTANTS`; pending ones run only when named)."""
    names = list(class_names or mutants.MUTANTS)
    if control and CONTROL not in names:
        names.insert(0, CONTROL)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    jobs = jobs or cores
    # torch's CPU threads per mutant: the cores shared out (two mutants each on every core ran slower
    # together than one after the other)
    threads = max(1, cores // min(jobs, len(names)))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_one, n, profile, first_failure=first_failure, device=device, timeout=timeout,
                               seed=seed, threads=threads) for n in names]
        return [f.result() for f in futures]


def _summarise(labels: list[str], limit: int = 4) -> str:
    """One line per test function, with its distinct parameters (an edge case's dtypes folded together):
    ``test_edge_case: queries_without_keys, gqa_ratio_3``."""
    groups: dict[str, list[str]] = {}
    for label in labels:
        head, _, params = label.partition("[")
        params = params.rstrip("]")
        if head == "test_edge_case":
            params = params.rsplit("-", 1)[0]  # the dtype
        values = groups.setdefault(head, [])
        if params and params not in values:
            values.append(params)
    lines = []
    for head, values in groups.items():
        shown = ", ".join(values[:limit]) + (f" (+{len(values) - limit} more)" if len(values) > limit else "")
        lines.append(f"{head}: {shown}" if values else head)
    return "\n".join(lines)


def print_table(results: list[MutantResult], first_failure: bool, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    title = "Mutants and the checks that catch them" + (" (each stopped at its first failure)" if first_failure else "")
    table = Table(title=title, show_lines=True)
    table.add_column("mutant [catalog class]: its bug", ratio=2)
    table.add_column("caught by", ratio=3)
    table.add_column("verdict", no_wrap=True)
    for r in results:
        if r.is_control:
            verdict = "[green]passes[/]" if r.ok else "[red]FAILS[/]"
            detail = _summarise(r.caught_by) or f"nothing: {len(r.passed)} checks passed, {len(r.skipped)} skipped"
        else:
            verdict = "[green]caught[/]" if r.ok else "[red]SURVIVED[/]" if not r.errors else "[red]ERROR[/]"
            detail = _summarise(r.caught_by) or "nothing"
        if r.errors:
            detail += "\nerrors: " + _summarise(r.errors)
        label = f"[bold]{r.name}[/]" + (f" \\[{r.catalog_id}]" if r.catalog_id else "")
        table.add_row(f"{label}\n[dim]{r.bug}[/]", detail, verdict)
    console.print(table)


def print_coverage(control: MutantResult, console=None) -> list[str]:
    """The values the control's run exercised on each axis (every mutant meets the same draws up to its
    first failure). Returns the declared values it left unexercised, as ``axis=value``."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    declared = declared_values(mutants.Unmutated.capabilities)
    table = Table(title="What the run exercised (the control's examples per value)", show_lines=False)
    table.add_column("axis", no_wrap=True)
    table.add_column("values exercised (examples)")
    table.add_column("declared, not exercised")
    missing = []
    for axis in dict.fromkeys([*declared, *control.coverage]):
        seen = control.coverage.get(axis, {})
        gaps = [v for v in declared.get(axis, []) if v not in seen]
        missing += [f"{axis}={v}" for v in gaps]
        table.add_row(axis, ", ".join(f"{v} ({n})" for v, n in seen.items()), f"[red]{', '.join(gaps)}[/]" if gaps else "")
    console.print(table)
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jfa-conformance selftest", description="Run the spec against every built-in mutant backend and show which checks catch it.")
    parser.add_argument("--profile", default=profiles.DEFAULT, choices=sorted(profiles.PROFILES),
                        help="hypothesis profile whose examples are drawn (default: %(default)s)")
    parser.add_argument("--mutant", action="append", choices=sorted({**mutants.MUTANTS, **mutants.PENDING}),
                        metavar="CLASS",
                        help="run only this mutant (repeatable; default: every built-in one; a pending one "
                        "(conformance/BUGS.md) runs only when named)")
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("-x", "--first-failure", dest="first_failure", action="store_true", default=True,
                      help="stop each mutant at the first check that catches it (the default; what CI runs)")
    stop.add_argument("--all-checks", dest="first_failure", action="store_false",
                      help="run every check on every mutant and show all that catch it (slow)")
    parser.add_argument("-j", "--jobs", type=int, default=None, help="mutants run at once (default: CPU count)")
    parser.add_argument("--device", default=None, help="device passed to the spec (default: the spec's default)")
    parser.add_argument("--seed", type=int, default=None,
                        help="hypothesis seed: other draws and kernel configurations than the profile's own (does "
                        "the spec's power hold beyond the ci profile's fixed draws?)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per mutant (default: %(default)s)")
    parser.add_argument("--show-output", action="store_true", help="print pytest's output for mutants that are not ok")
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")

    results = run_selftest(args.mutant, args.profile, first_failure=args.first_failure, jobs=args.jobs,
                           device=args.device, timeout=args.timeout, seed=args.seed)
    print_table(results, args.first_failure)
    control = next((r for r in results if r.is_control), None)
    if control is not None and control.coverage:
        missing = print_coverage(control)
        if missing:
            print(f"the run left {len(missing)} declared value(s) unexercised: {', '.join(missing)}")
    bad = [r for r in results if not r.ok]
    if args.show_output:
        for r in bad:
            print(f"----- {r.name} (pytest exit status {r.returncode}) -----\n{r.output}")
    survivors = [r.name for r in bad if not r.is_control and not r.errors]
    if survivors:
        print(f"{len(survivors)} mutant(s) survived: {', '.join(survivors)}")
    if any(r.is_control for r in bad):
        print("the control failed: the spec rejects a correct backend (run with --show-output)")
    if any(r.errors for r in bad):
        print("some runs ended in errors, not failed checks (run with --show-output)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
