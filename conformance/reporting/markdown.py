"""summary.md: the report as Markdown (CI job summaries, pull-request comments)."""
from __future__ import annotations

from .. import report as rp

SYMBOL = {"pass": "✅ pass", "fail": "❌ FAIL", "crash": "💥 CRASH", "timeout": "⏱ TIMEOUT", "not-run": "⛔ not run",
          "expected-fail": "➖ xfail", "unsupported": "· unsupported"}


def fmt_budget(value) -> str:
    if value is None:
        return ""
    return "inf" if value == float("inf") else f"{value:.0%}"


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


def render_markdown(report: dict, regressions: list[dict] | None = None) -> str:
    run, summary = report["run"], rp.summarize_backends(report)
    code = rp.exit_code(report, regressions)
    lines = [f"# Conformance run `{run.get('name')}`: {'PASSED' if code == 0 else 'FAILED'}", "", run_line(run), ""]
    if run.get("shards"):
        lines += ["Merged from " + ", ".join(f"`{sh.get('name')}` ({sh.get('checks')} checks, profile "
                                          f"{sh.get('profile')}, seed {sh.get('seed')})" for sh in run["shards"]) + ".", ""]
    if not run.get("complete", True):
        lines += ["**The run did not finish: checks that never ran are marked not run.**", ""]
    lines += ["| backend | verdict | pass | fail | crash | timeout | not run | xfail | unsupported | worst budget |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in summary.items():
        c = s["counts"]
        lines.append(f"| {name} | {s['verdict']} | {c['pass']} | {c['fail']} | {c['crash']} | {c['timeout']} | "
                     f"{c['not-run']} | {c['expected-fail']} | {c['unsupported']} | {fmt_budget(s['worst_budget'])} |")
    backends, features, cells = rp.matrix(report["records"], report.get("backends", {}))
    if backends:
        lines += ["", "## Conformance matrix", "", "| feature | " + " | ".join(backends) + " |",
                  "|---|" + "---|" * len(backends)]
        for feature in features:
            row = [cell_text(cells[b, feature]) if (b, feature) in cells else "" for b in backends]
            lines.append(f"| {feature} | " + " | ".join(row) + " |")
    if regressions:
        lines += ["", "## Regressions against the baseline", ""]
        lines += [f"- **{r['kind']}**: {r['what']} — {r['detail']}" for r in regressions]
    bad = rp.failures(report, unrun=False)
    if bad:
        lines += ["", f"## Failures ({len(bad)})", ""]
        for r in bad:
            lines.append(f"- **{describe_check(r)}**: {r['outcome']} — {r.get('reason') or ''}")
            if r.get("counterexample"):
                lines.append(f"  - {rp.problem_label(r)}: `{r['counterexample']}`")
            if (r.get("replay") or {}).get("command"):
                lines.append(f"  - replay: `{r['replay']['command']}`")
    unrun, reasons = rp.unrun_checks(report)
    if unrun:
        lines += ["", f"## Not run ({sum(map(len, unrun.values()))})", "", "Reason: " + "; ".join(reasons), ""]
        lines += [f"- **{backend}**: " + ", ".join(labels) for backend, labels in unrun.items()]
    if report.get("timings"):
        lines += ["", "## Timings (median)", "",
                  "| backend | shape | direction | median ms | IQR ms | TFLOP/s | padding waste | skew |",
                  "|---|---|---|---:|---:|---:|---:|---:|"]
        for t in report["timings"]:
            lines.append(f"| {t['backend']} | {t['shape']} | {t['direction']} | {t['median_s'] * 1e3:.3f} | "
                         f"{fmt_spread(t)} | {t['tflops']:.3g} | {t['padding_waste']:.0%} | {t['length_skew']:.1f} |")
    unsupported = sorted({(r["backend"], r.get("reason") or "") for r in report["records"] if r["outcome"] == "unsupported"})
    if unsupported:
        lines += ["", "<details><summary>Unsupported checks and why</summary>", ""]
        lines += [f"- {b}: {why}" for b, why in unsupported]
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"
