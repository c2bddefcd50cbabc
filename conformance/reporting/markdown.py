"""summary.md: the report as Markdown (CI job summaries, pull-request comments, bug reports)."""
from __future__ import annotations

import re
from urllib.parse import quote

from .. import report as rp
from . import perf, triage

SYMBOL = {"pass": "✅ pass", "fail": "❌ FAIL", "crash": "💥 CRASH", "timeout": "⏱ TIMEOUT", "not-run": "◌ not run",
          "expected-fail": "➖ xfail", "unsupported": "·"}
UNSUPPORTED_FEATURES_SHOWN = 6


def fmt_budget(value) -> str:
    """A budget (observed / allowed error) as a share of the allowance, or a multiple past 10x."""
    if value is None:
        return ""
    if value == float("inf") or value != value:
        return "inf"
    return f"{value:.0f}x" if value >= 10 else f"{value:.0%}"


def fmt_spread(timing: dict) -> str:
    """The rounds' interquartile range in ms (what the baseline gate compares), or '-' where not kept."""
    if timing.get("q1_s") is None or timing.get("q3_s") is None:
        return "-"
    return f"{timing['q1_s'] * 1e3:.3f}–{timing['q3_s'] * 1e3:.3f}"


def describe_check(record: dict) -> str:
    return f"{record['backend']} · {record['feature']}" + (f" · {record['dtype']}" if record.get("dtype") else "")


def cell_text(records) -> str:
    return rp.cell_label(records, SYMBOL)


def run_line(run: dict) -> str:
    env = run.get("environment", {})
    bits = [f"profile `{run.get('profile')}`", f"seed `{run.get('seed')}`", f"device `{env.get('device_name') or env.get('device')}`"]
    if env.get("compute_capability"):
        bits.append(f"compute capability {env['compute_capability']}")
    commit = f"commit `{(env.get('git_commit') or '?')[:12]}`"
    if env.get("git_dirty"):  # the code that ran is not the commit's: say so where the commit is read
        commit += " with uncommitted changes"
    bits += [f"torch {env.get('torch')}", f"triton {env.get('triton')}", commit]
    if run.get("duration_s") is not None:
        bits.append(f"{run['duration_s']:.0f} s")
    return " · ".join(bits)


def _md(text) -> str:
    """Backend-supplied text inside a Markdown table cell or list item: one line, no table breaks, no
    inline HTML (GitHub renders some tags in Markdown)."""
    text = triage.strip_ansi("" if text is None else str(text))
    # "<" opens a tag only before a letter, "/", "!" or "?": "head_dim < head_dim_v" stays readable
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", " ".join(text.split()).replace("|", "\\|"))


def _url(url: str) -> str:
    """A link target that cannot end the Markdown link or open HTML."""
    return quote(url, safe=":/?#[]@!$&'*+,;=%~-._")


def _code(text) -> str:
    """``text`` as inline code, whatever backticks it holds."""
    text = " ".join(str(text).split())
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def unsupported_lines(report: dict) -> list[tuple[str, str, int, str]]:
    """The declared-unsupported checks as ``(backend, reason, checks, features)``, one per backend and
    reason: a combined reason (``a; b``) counts under each of its parts, the problem a reason names is left
    out so that one limitation is one line."""
    grouped: dict[tuple[str, str], list[str]] = {}
    order = {name: i for i, name in enumerate(report.get("backends", {}))}
    for r in report["records"]:
        if r["outcome"] != "unsupported":
            continue
        reason = re.sub(r"\s*\(on Problem\(.*\)\)\s*$", "", triage.strip_ansi(r.get("reason") or "no reason given"))
        for part in dict.fromkeys(p.strip() for p in reason.split("; ") if p.strip()):
            grouped.setdefault((r["backend"], part), []).append(r["feature"] + (f" [{r['dtype']}]" if r.get("dtype") else ""))
    lines = []
    for (backend, reason), features in grouped.items():
        names = list(dict.fromkeys(features))
        shown = ", ".join(names[:UNSUPPORTED_FEATURES_SHOWN]) + (
            f", … ({len(names) - UNSUPPORTED_FEATURES_SHOWN} more)" if len(names) > UNSUPPORTED_FEATURES_SHOWN else "")
        lines.append((backend, reason, len(features), shown))
    return sorted(lines, key=lambda x: (order.get(x[0], len(order)), x[0], -x[2], x[1]))


def _causes(groups) -> list[str]:
    if not groups:
        return []
    checks = sum(len(g.records) for g in groups)
    lines = ["", f"## Failures by cause ({len(groups)} causes, {checks} checks)", "",
             "A cause is a set of failures with one signature (backend, outcome, message without its numbers). "
             "Reproducers are relative to this report's directory: `python failures/<id>.py` is standalone.", ""]
    for g in groups:
        label = f" — **{_md(g.label)}**" + (f" ([upstream]({_url(g.link)}))" if g.link else "") if g.label else ""
        lines.append(f"### {SYMBOL.get(g.outcome, g.outcome)} {_md(g.backend)}: {len(g.records)} check"
                     f"{'s' if len(g.records) != 1 else ''}{label}")
        lines += ["", f"{_code(g.summary)} (signature `{g.id}`)", ""]
        if g.note:
            lines += [_md(g.note), ""]
        shared = g.shared_text()
        if shared:
            lines += [f"Shared: {_md(shared)}", ""]
        first = g.smallest() or g.records[0]
        if first.get("counterexample"):
            lines.append(f"- smallest problem ({rp.problem_label(first)}): {_code(first['counterexample'])}")
        replay = first.get("replay") or {}
        if replay.get("script"):
            lines.append(f"- reproduce: {_code('python ' + replay['script'])}")
        if replay.get("command"):
            lines.append(f"- replay the check: {_code(replay['command'])}")
        if replay.get("pytest"):
            lines.append(f"- pytest: {_code(replay['pytest'])}")
        checks = ", ".join(f"{r['feature']}" + (f" [{r['dtype']}]" if r.get("dtype") else "")
                           + (f" (`{(r.get('replay') or {}).get('script')}`)" if (r.get("replay") or {}).get("script")
                              and r is not first else "") for r in g.records)
        lines += [f"- checks: {_md(checks)}", ""]
    return lines


def _perf(report) -> list[str]:
    if not report.get("timings"):
        if not report.get("timing_gaps"):
            return []
        # every timing failed or was not made: the section stays, to say why
        return ["", "## Performance", "", "No timings.", ""] + [f"> {_md(line)}" for line in perf.timing_notes(report)]
    base = perf.baseline_backend(report)
    backends = perf.timed_backends(report)
    table = perf.rows(report, base)
    geo = perf.geomean_speedups(table)
    lines = ["", "## Performance", "",
             f"Speedup against {_code(base)} (its median over the backend's; above 1 is faster), median ms per call "
             f"with {perf.per_call_words(report)}, TFLOP/s on useful FLOPs; *host-bound* where the host's time per call is the time per call. Every number, with "
             "spread, rounds, one lone call's latency, the host's time per call and first-call time, is in the "
             "table below.", ""]
    notes = perf.timing_notes(report)
    lines += [f"> {_md(line)}" for line in notes] + [""] * bool(notes)
    for direction in ("forward", "backward"):
        shown = [r for r in table if r.direction == direction]
        if not shown:
            continue
        columns, untimed = perf.direction_columns(table, backends, direction)
        lines += [f"**{direction.capitalize()}**", ""]
        if untimed:
            lines += [f"No {direction} timing: {_md(', '.join(untimed))}.", ""]
        lines += ["| shape | " + " | ".join(map(_md, columns)) + " |", "|---|" + "---:|" * len(columns)]
        for row in shown:
            cells = []
            for name in columns:
                cell = row.cells.get(name)
                gap = row.gaps.get(name)
                if cell is None and gap is not None:
                    cells.append(f"*{gap['outcome']}*")
                    continue
                cells.append("" if cell is None else
                             f"{perf.fmt_speedup(cell.speedup)} · {cell.median_ms:.3f} ms · {cell.row['tflops']:.3g} TF/s"
                             + (" · *host-bound*" if cell.row.get("host_bound") else ""))
            text = perf.shape_text(row)
            lines.append(f"| {_md(row.shape)}{f' ({text})' if text else ''} | " + " | ".join(cells) + " |")
        lines.append("| geometric mean | " + " | ".join(
            f"{perf.fmt_speedup(geo[name, direction][0])}" if (name, direction) in geo else "" for name in columns) + " |")
        lines.append("")
    lines += ["<details><summary>Every timing</summary>", "",
              "| backend | shape | direction | median ms | IQR ms | rounds x calls | TFLOP/s | of peak | speedup "
              "| one call ms | host us/call | first call | padding waste | skew |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in table:
        for name in backends:
            cell = row.cells.get(name)
            if cell is None:
                continue
            t = cell.row
            lines.append(
                f"| {_md(name)} | {_md(row.shape)} | {row.direction} | {cell.median_ms:.3f} | {fmt_spread(t)} | "
                f"{t.get('rounds') or ''} x {t.get('calls_per_round') or 1} | {t['tflops']:.3g} | "
                f"{'' if cell.peak_share is None else format(cell.peak_share, '.0%')} | {perf.fmt_speedup(cell.speedup)} | "
                f"{perf.fmt_ms(t.get('latency_s'))} | {perf.fmt_us(t.get('host_s'))}{' (bound)' if t.get('host_bound') else ''} | "
                f"{perf.fmt_seconds(t.get('first_call_s'))} | "
                f"{'' if t.get('padding_waste') is None else format(t['padding_waste'], '.0%')} | "
                f"{'' if t.get('length_skew') is None else format(t['length_skew'], '.1f')} |")
    lines += ["", "</details>"]
    return lines


def _coverage(report) -> list[str]:
    coverage = report.get("coverage")
    if not isinstance(coverage, dict) or not coverage:
        return []
    backends = rp.coverage_columns(report)
    lines = ["", "<details><summary>Coverage: problems per axis value</summary>", "",
             "| axis = value | " + " | ".join(map(_md, backends)) + " |", "|---|" + "---:|" * len(backends)]
    axes: dict[str, dict[str, None]] = {}
    for per_backend in coverage.values():
        for axis, values in (per_backend or {}).items():
            axes.setdefault(axis, {}).update(dict.fromkeys(values or {}))
    for axis, values in axes.items():
        for value in sorted(values, key=_natural):
            counts = [((coverage.get(b) or {}).get(axis) or {}).get(value) for b in backends]
            lines.append(f"| {_md(axis)} = {_md(value)} | " + " | ".join(str(n) if n else "" for n in counts) + " |")
    lines += ["", "</details>"]
    return lines


def _natural(value: str):
    try:
        return 0, float(value), ""
    except (TypeError, ValueError):
        return 1, 0.0, str(value)


def render_markdown(report: dict, regressions: list[dict] | None = None) -> str:
    run, summary = report["run"], rp.summarize_backends(report)
    code = rp.exit_code(report, regressions)
    groups = triage.groups(report["records"], (report.get("triage") or {}).get("entries"))
    lines = [f"# Conformance run {_code(run.get('name'))}: {'PASSED' if code == 0 else 'FAILED'}", "", _md(run_line(run)), ""]
    if run.get("shards"):
        lines += ["Merged from " + ", ".join(f"{_code(sh.get('name'))} ({sh.get('checks')} checks, profile "
                                          f"{sh.get('profile')}, seed {sh.get('seed')})" for sh in run["shards"]) + ".", ""]
    if not run.get("complete", True):
        lines += ["**The run did not finish: checks that never ran are marked not run.**", ""]
    elif run.get("stopped"):
        lines += [f"The run stopped ({_md(run['stopped'])}) after every check had its verdict.", ""]
    times = perf.backend_times(report)
    time_keys = perf.time_columns(times)
    lines += ["| backend | verdict | pass | fail | crash | timeout | not run | xfail | unsupported | worst budget |"
              + "".join(f" {perf.TIME_LABELS[k]} |" for k in time_keys),
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(time_keys)]
    for name, s in summary.items():
        c = s["counts"]
        row = (f"| {_md(name)} | {s['verdict']} | {c['pass']} | {c['fail']} | {c['crash']} | {c['timeout']} | "
               f"{c['not-run']} | {c['expected-fail']} | {c['unsupported']} | {fmt_budget(s['worst_budget'])} |")
        if times:
            t = times.get(name) or {}
            row += "".join(f" {'' if t.get(k) is None else format(t[k], '.1f')} |" for k in time_keys)
        lines.append(row)
    for phase in (rp.check_phase_text(run.get("checks")), rp.timing_phase_text(run.get("timing_phase"))):
        if phase:
            lines += ["", _md(phase[0].upper() + phase[1:]) + "."]
    built = perf.jit_in_checks(report)
    if built:
        lines += ["", "Checks that compiled (Triton kernels, compiled or loaded from the cache; torch.compile graphs; "
                  "builds a backend reports, such as FlashInfer's JIT modules):",
                  ""]
        lines += [f"- `{_md(b['id'])}`: {b['seconds']:.2f} s, {b['builds']} build(s): " + _md(", ".join(b["what"]))
                  for b in built]
    if any(s["verdict"] == "incomplete" for s in summary.values()):
        lines += ["", "*incomplete*: no check failed, but some never ran (listed under “Not run”)."]
    if regressions:
        lines += ["", "## Regressions against the baseline", ""]
        lines += [f"- **{r['kind']}**: {_md(r['what'])} — {_md(r['detail'])}" for r in regressions]
    lines += _causes(groups)
    backends, features, cells = rp.matrix(report["records"], report.get("backends", {}))
    if backends:
        lines += ["", "## Conformance matrix", "", "| feature | " + " | ".join(map(_md, backends)) + " |",
                  "|---|" + "---|" * len(backends)]
        for feature in features:
            row = [cell_text(cells[b, feature]) if (b, feature) in cells else "" for b in backends]
            lines.append(f"| {_md(feature)} | " + " | ".join(row) + " |")
    bad = rp.failures(report, unrun=False)
    if bad:
        lines += ["", f"## Failures ({len(bad)})", ""]
        for r in bad:
            lines.append(f"- **{_md(describe_check(r))}**: {r['outcome']} — {_md(triage.summary(r))}")
            if r.get("counterexample"):
                lines.append(f"  - {rp.problem_label(r)}: {_code(r['counterexample'])}")
            if (r.get("replay") or {}).get("script"):
                lines.append(f"  - reproduce: {_code('python ' + r['replay']['script'])}")
            if (r.get("replay") or {}).get("command"):
                lines.append(f"  - replay: {_code(r['replay']['command'])}")
    unrun, reasons = rp.unrun_checks(report)
    if unrun:
        lines += ["", f"## Not run ({sum(map(len, unrun.values()))})", "",
                  "No verdict: these say nothing about the backend. Reason: " + _md("; ".join(reasons)), ""]
        lines += [f"- **{_md(backend)}**: " + _md(", ".join(labels)) for backend, labels in unrun.items()]
    lines += _perf(report)
    xfails = [r for r in report["records"] if r["outcome"] == "expected-fail"]
    if xfails:
        lines += ["", f"## Expected failures ({len(xfails)})", ""]
        lines += [f"- {_md(describe_check(r))}: {_md(r.get('reason'))}" for r in xfails]
    unsupported = unsupported_lines(report)
    if unsupported:
        total = sum(n for _, _, n, _ in unsupported)
        lines += ["", f"<details><summary>Unsupported checks and why ({total} checks, one line per backend and reason)"
                      "</summary>", ""]
        lines += [f"- {_md(b)}: {_md(why)} — {n} check{'s' if n != 1 else ''} ({_md(features)})"
                  for b, why, n, features in unsupported]
        lines += ["", "</details>"]
    lines += _coverage(report)
    return "\n".join(lines) + "\n"
