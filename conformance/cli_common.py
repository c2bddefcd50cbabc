"""What the ``jfa-conformance`` commands share: the usage error, the console, and what a run leaves behind:
its run directory's files (``write_run_dir``) and the summary printed at its end (``print_summary``), which
``run`` writes for a run and ``merge`` for merged shards."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

USAGE_ERROR = 2


class UsageError(Exception):
    """Bad command-line input; the message names the option."""


def load_report(path, option: str | None = None) -> dict:
    """A report (report.json or its run directory) named on the command line; a UsageError naming ``option``
    (or the report's own message) where it cannot be read."""
    from . import report as rp
    try:
        return rp.load(path)
    except rp.ReportError as exc:
        raise UsageError(f"{option}: {exc}" if option else str(exc)) from None


def make_console():
    from rich.console import Console
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 140)  # CI logs: do not fold tables into 80 columns
    return console


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
