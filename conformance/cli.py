"""``jfa-conformance``: list backends, run the spec and report, compare and merge reports.

This module reads the command line and runs the command: ``list``, ``compare`` and ``merge`` here, ``run`` in
run.py (the spec in a pytest child process, then ``reports/<run-name>/``: report.json, summary.md,
index.html, junit.xml, failures/ and, with ``--bench``, the timings), ``selftest`` and ``replay`` in their
modules; cli_common.py holds what they share (the run directory's files, the printed summary).

Exit codes: 0 every check passed or was declared unsupported / an expected failure; 1 any failure, crash,
timeout or check that never ran, a backend that supports nothing, or (with ``--baseline``) a new failure
or a timing regression; 2 usage error.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import sys
from pathlib import Path

from .cli_common import USAGE_ERROR, UsageError, load_report, make_console as _console, print_summary, write_run_dir
from .run import (DEFAULT_COMPILE_TIMEOUT_S, DEFAULT_MAX_WORKER_RESTART, DEFAULT_TIME_LIMIT_S, DEFAULT_TIMEOUT_S,
                  cmd_run)


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


# -- argument types -------------------------------------------------------------------------------------
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


# -- compare and merge ----------------------------------------------------------------------------------
def _speedups(report: dict, baseline: str | None) -> dict[tuple[str, str, str], float]:
    from .reporting import perf
    return {(name, row.shape, row.direction): cell.speedup for row in perf.rows(report, baseline)
            for name, cell in row.cells.items() if cell.speedup is not None}


def cmd_compare(ns) -> int:
    from rich.table import Table

    from . import report as rp
    from .reporting import perf, triage
    old, new = load_report(ns.old), load_report(ns.new)
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
    reports = [load_report(path) for path in ns.reports]
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
