"""index.html: one self-contained page (inline CSS, plots as inline SVG; opens from disk, no network).

Laid out for many backends at 1400 px: compact matrix cells, rotated backend names, the feature column
sticky while the wide tables scroll. Every text a backend or a run supplies goes through :func:`esc`.
"""
from __future__ import annotations

import html
import json
import re

from .. import report as rp
from . import perf, plots, triage
from .markdown import fmt_budget, fmt_spread, run_line, unsupported_lines

LABEL = {"pass": "pass", "fail": "FAIL", "crash": "CRASH", "timeout": "TIMEOUT", "not-run": "not run",
         "expected-fail": "xfail", "unsupported": "–"}
LEGEND = {"pass": "pass", "fail": "FAIL", "crash": "CRASH", "timeout": "TIMEOUT", "not-run": "not run (no verdict)",
          "expected-fail": "expected failure", "unsupported": "– unsupported (declared)"}
TITLE = {**LABEL, "unsupported": "unsupported", "expected-fail": "expected failure"}
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:20px auto;max-width:1400px;
 padding:0 16px;color:#1d1d1f;box-sizing:border-box}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:26px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:0}
.meta{color:#555} .badge{display:inline-block;padding:2px 10px;border-radius:12px;color:#fff;font-weight:600}
.badge.ok{background:#2e7d32} .badge.bad{background:#c62828}
table{border-collapse:collapse;margin:6px 0} th,td{border:1px solid #d6d6d6;padding:3px 7px;text-align:left}
th{background:#f3f3f3;font-weight:600} td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.scroll{overflow-x:auto;max-width:100%}
.grid{font-size:12px} .grid td{text-align:center;white-space:nowrap;padding:2px 3px;min-width:52px;line-height:1.2}
.grid th.rot{vertical-align:bottom;padding:4px 2px;height:150px;min-width:48px}
.grid th.rot>div{writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap;margin:0 auto;
 max-height:148px;overflow:hidden;text-overflow:ellipsis}
.grid td.first,.grid th.first{position:sticky;left:0;z-index:1;text-align:left;background:#fff;min-width:190px;
 max-width:280px;white-space:normal}
.grid th.first{background:#f3f3f3}
.grid small{font-weight:400;font-size:10px;opacity:.85}
.o-pass{background:#dcfce7;color:#166534} .o-fail{background:#dc2626;color:#fff;font-weight:700}
.o-crash{background:#7f1d1d;color:#fff;font-weight:700} .o-timeout{background:#f59e0b;color:#1d1d1f;font-weight:700}
.o-not-run{background:#fff;color:#6b7280;outline:1px dashed #9ca3af;outline-offset:-3px}
.o-expected-fail{background:#dbeafe;color:#1e3a8a} .o-unsupported{background:#f7f7f7;color:#9ca3af}
td[title]{cursor:help}
.legend span{display:inline-block;padding:1px 8px;margin:0 6px 4px 0;border-radius:3px;font-size:12px}
.heat td{font-variant-numeric:tabular-nums}
pre{background:#f6f8fa;padding:8px;overflow-x:auto;font-size:12px;max-height:300px;white-space:pre-wrap;
 word-break:break-word}
code{background:#f3f3f3;padding:0 3px;border-radius:3px;font-size:12.5px;word-break:break-all}
details{margin:4px 0} summary{cursor:pointer}
.v-conformant{color:#166534;font-weight:600} .v-failing{color:#fff;background:#dc2626;font-weight:700}
.v-incomplete{color:#374151;font-weight:600} .v-supports-nothing{color:#92400e;font-weight:600}
.plot{margin:0}.plot svg{display:block;box-sizing:border-box;border:1px solid #eee}
.note{color:#666;font-size:13px}
.caveat{color:#8a4b00;background:#fff6e5;border-left:3px solid #e0a030;padding:4px 8px;font-size:13px}
.gap{color:#8a4b00;background:#fff6e5}
.cause{border:1px solid #d6d6d6;border-left:6px solid #dc2626;border-radius:4px;padding:8px 12px;margin:10px 0}
.cause.crash{border-left-color:#7f1d1d} .cause.timeout{border-left-color:#f59e0b}
.cause .what{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:13px;margin:4px 0;word-break:break-word}
.cause .shared{margin:4px 0} .cause table{font-size:12.5px}
.tag{display:inline-block;padding:0 7px;border-radius:3px;font-size:12px;font-weight:700;margin-right:4px}
.label{background:#fef3c7;color:#78350f;padding:1px 6px;border-radius:3px;font-weight:600}
.perf td{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
.perf td .sp{font-weight:700;font-size:13px} .perf td.base{outline:2px solid #111;outline-offset:-2px}
.faster{background:#dcfce7} .slower{background:#fee2e2} .much-slower{background:#fecaca}
.bound{color:#9a3412;font-weight:600}
"""


def esc(value) -> str:
    return html.escape("" if value is None else str(value))


def _num(value, spec: str) -> str:
    """``value`` formatted, or '' when there is none."""
    return "" if value is None else format(value, spec)


def _sci(value) -> str:
    return "?" if value is None else f"{value:.3e}"


def _budget_color(budget) -> str:
    """White (0) through yellow (0.5) to red (>= 1, over the allowance)."""
    if budget is None:
        return "#fff"
    b = min(max(budget, 0.0), 1.0) if budget == budget else 1.0
    if b < 0.5:
        r, g, bl = 255, 255, int(255 - 255 * b * 2 * 0.6)
    else:
        r, g, bl = 255, int(255 - (b - 0.5) * 2 * 150), int(102 - (b - 0.5) * 2 * 60)
    if budget >= 1.0:
        r, g, bl = 220, 60, 60
    return f"rgb({r},{g},{bl})"


def _link(url: str | None, text: str) -> str:
    """A link only for http(s) URLs (a triage file is data, not markup)."""
    if url and re.match(r"https?://", url):
        return f'<a href="{esc(url)}">{esc(text)}</a>'
    return esc(text)


def _record_line(r: dict) -> str:
    bits = [r.get("dtype") or (r.get("problem") or {}).get("dtype") or "", TITLE.get(r["outcome"], r["outcome"])]
    if r.get("budget_used") is not None and r["outcome"] not in ("crash", "timeout", "not-run"):
        bits.append(f"budget {fmt_budget(r['budget_used'])} ({r.get('quantity')})")
    if r["outcome"] in triage.FAILING:
        bits.append(triage.summary(r))
    elif r.get("reason"):
        bits.append(r["reason"])
    return " — ".join(b for b in bits if b)


def _rot_header(first: str, names) -> str:
    return (f'<tr><th class="first">{esc(first)}</th>'
            + "".join(f'<th class="rot" title="{esc(n)}"><div>{esc(n)}</div></th>' for n in names) + "</tr>")


def _matrix(report) -> list[str]:
    backends, features, cells = rp.matrix(report["records"], report.get("backends", {}))
    if not backends:
        return ["<p>No checks ran.</p>"]
    out = ['<p class="legend">' + "".join(f'<span class="o-{o}">{esc(LEGEND[o])}</span>' for o in rp.OUTCOMES)
           + '<br><span class="note">A cell shows the worst outcome of the check (over its dtypes), with how many '
           "of them have it; hover for each dtype's outcome and reason.</span></p>",
           '<div class="scroll"><table class="grid matrix">', _rot_header("feature", backends)]
    for feature in features:
        row = [f'<td class="first">{esc(feature)}</td>']
        for b in backends:
            records = cells.get((b, feature))
            if not records:
                row.append("<td></td>")
                continue
            outcome = rp.cell_outcome(records)
            count = sum(r["outcome"] == outcome for r in records)
            text = esc(LABEL[outcome])
            if count < len(records) or (len(records) > 1 and outcome in rp.FAILING):
                text += f"<br><small>{count}/{len(records)}</small>"
            title = "\n".join(_record_line(r) for r in records)
            row.append(f'<td class="o-{outcome}" title="{esc(title)}">{text}</td>')
        out.append("<tr>" + "".join(row) + "</tr>")
    out.append("</table></div>")
    return out


def _heatmap(report) -> list[str]:
    backends, features, cells = rp.matrix(report["records"], report.get("backends", {}))
    if not backends:
        return []
    out = ['<p class="note">Largest share of the allowed error used by any example of the check '
           "(observed error / allowed error; 100% is the edge of the tolerance). Empty: no measured example; "
           "crashes and timeouts are left out (their numbers are of examples that ran before the process died).</p>",
           '<div class="scroll"><table class="grid heat">', _rot_header("feature", backends)]
    for feature in features:
        row = [f'<td class="first">{esc(feature)}</td>']
        for b in backends:
            budgets = [(r["budget_used"], r) for r in cells.get((b, feature), [])
                       if r.get("budget_used") is not None and r["outcome"] not in ("crash", "timeout")]
            if not budgets:
                row.append("<td></td>")
                continue
            value, r = max(budgets, key=lambda x: x[0])
            title = f"{r.get('dtype') or ''} {r.get('quantity') or ''}: observed {_sci(r.get('observed_error'))}, " \
                    f"allowed {_sci(r.get('allowed_error'))}"
            row.append(f'<td style="background:{_budget_color(value)}" title="{esc(title)}">{fmt_budget(value)}</td>')
        out.append("<tr>" + "".join(row) + "</tr>")
    out.append("</table></div>")
    return out


def _img(svg: str | None, alt: str, missing: str) -> str:
    if not svg:
        return f'<p class="note">{esc(missing)}</p>'
    return f'<figure class="plot" role="img" aria-label="{esc(alt)}">{svg}</figure>'


def _verdict_table(r: dict) -> str:
    """A failure's verdicts, the failing ones first; only for fails with a verdict out of tolerance (a crash's
    verdicts are of examples that ran before it and would read as if the crash had been within tolerance)."""
    verdicts = sorted(r.get("verdicts") or [], key=lambda v: bool(v.get("ok")))
    if r["outcome"] != "fail" or all(v.get("ok") for v in verdicts):
        return ""  # an exception, not a number out of tolerance: the message says it
    rows = "".join(
        f"<tr class='{'' if v.get('ok') else 'o-fail'}'><td>{esc(v['quantity'])}</td>"
        f"<td class='num'>{_sci(v.get('observed'))}</td><td class='num'>{_sci(v.get('allowed'))}</td>"
        f"<td class='num'>{esc(triage.fmt_times(v.get('budget_used')) if not v.get('ok') else fmt_budget(v.get('budget_used')))}</td></tr>"
        for v in verdicts)
    return ("<table><tr><th>quantity</th><th>observed error</th><th>allowed</th><th>of the allowance</th></tr>"
            + rows + "</table>")


def _reproduce(r: dict) -> str:
    replay = r.get("replay") or {}
    lines = []
    if replay.get("script"):
        lines.append(f"<code>python {esc(replay['script'])}</code>")
    if replay.get("command"):
        lines.append(f"<code>{esc(replay['command'])}</code>")
    if replay.get("error"):
        lines.append(f"<span class='note'>no reproducer: {esc(replay['error'])}</span>")
    return "<br>".join(lines) if lines else "<span class='note'>no problem recorded to rebuild</span>"


def _causes(report, groups) -> list[str]:
    if not groups:
        return []
    checks = sum(len(g.records) for g in groups)
    out = [f"<h2 id='causes'>Failures by cause ({len(groups)} cause{'s' if len(groups) != 1 else ''}, "
           f"{checks} check{'s' if checks != 1 else ''})</h2>",
           "<p class='note'>Failures with one signature (backend, outcome and message, numbers left out) form a "
           "cause. “Shared” lists what every problem of the cause has and few of the backend's passing problems "
           "have: computed from the problems. Reproduce from the report directory: <code>python failures/&lt;id&gt;.py"
           "</code> is standalone (attach it to a bug report), <code>jfa-conformance replay</code> reruns the check; "
           "the pytest node id runs from a jfa-conformance checkout.</p>"]
    for g in groups:
        first = g.smallest() or g.records[0]
        label = (f" <span class='label'>{_link(g.link, g.label)}</span>" if g.label else "")
        out.append(f"<div class='cause {esc(g.outcome)}' id='cause-{esc(g.id)}'>"
                   f"<h3><span class='tag o-{esc(g.outcome)}'>{esc(LABEL.get(g.outcome, g.outcome))}</span>"
                   f"{esc(g.backend)} · {len(g.records)} check{'s' if len(g.records) != 1 else ''}{label}"
                   f" <span class='note'>signature {esc(g.id)}</span></h3>")
        out.append(f"<div class='what'>{esc(g.summary)}</div>")
        if len(g.summaries) > 1:
            out.append("<div class='note'>also: " + "; ".join(esc(s) for s in g.summaries[1:4]) + "</div>")
        if g.note:
            out.append(f"<div class='note'>{esc(g.note)}</div>")
        shared = g.shared_text()
        if shared:
            out.append(f"<div class='shared'><b>Shared</b>: {esc(shared)}</div>")
        if first.get("counterexample"):
            out.append(f"<div>Smallest problem ({esc(rp.problem_label(first))}): <code>{esc(first['counterexample'])}</code></div>")
        out.append(_verdict_table(first))
        out.append("<details><summary>checks, problems and reproducers</summary><table>"
                   "<tr><th>check</th><th>dtype</th><th>problem</th><th>reproduce (from the report directory)</th></tr>")
        for r in g.records:
            pytest_cmd = (r.get("replay") or {}).get("pytest")
            out.append(f"<tr><td>{esc(r.get('feature'))}<br><span class='note'>{esc(r.get('id'))}</span></td>"
                       f"<td>{esc(r.get('dtype') or '')}</td>"
                       f"<td><code>{esc(r.get('counterexample') or '')}</code></td>"
                       f"<td>{_reproduce(r)}" + (f"<br><code>{esc(pytest_cmd)}</code>" if pytest_cmd else "")
                       + "</td></tr>")
        out.append("</table></details>")
        message = triage.strip_ansi(first.get("message") or "")
        if message:
            out.append(f"<details><summary>message</summary><pre>{esc(message)}</pre></details>")
        out.append("</div>")
    return out


def _backend_table(report, summary) -> list[str]:
    times = perf.backend_times(report)
    time_keys = perf.time_columns(times)
    out = ["<div class='scroll'><table><tr><th>backend</th><th>verdict</th>"
           + "".join(f"<th class='num'>{esc(LABEL[o] if o != 'unsupported' else 'unsupported')}</th>" for o in rp.OUTCOMES)
           + "<th class='num'>worst budget</th>"
           + "".join(f"<th class='num'>{perf.TIME_LABELS[k]}</th>" for k in time_keys) + "</tr>"]
    for name, s in summary.items():
        reason = (report.get("backends", {}).get(name) or {}).get("reason")
        verdict = s["verdict"] + (f" ({reason})" if reason and s["verdict"] == "supports nothing" else "")
        row = (f"<tr><td>{esc(name)}</td><td class='v-{s['verdict'].replace(' ', '-')}'>{esc(verdict)}</td>"
               + "".join(f"<td class='num{' o-' + o if s['counts'][o] and o in ('fail', 'crash', 'timeout') else ''}'>"
                         f"{s['counts'][o] or ''}</td>" for o in rp.OUTCOMES)
               + f"<td class='num'>{fmt_budget(s['worst_budget'])}</td>")
        if times:
            t = times.get(name) or {}
            row += "".join(f"<td class='num'>{_num(t.get(k), '.1f')}</td>" for k in time_keys)
        out.append(row + "</tr>")
    out.append("</table></div>")
    if times:
        out.append("<p class='note'>compile s: seconds of each backend's first call per compile configuration; "
                   "check s: seconds its checks ran"
                   + ("; compiling in checks s: of those, seconds spent inside checks compiling Triton kernels "
                      "(or loading them from its cache: milliseconds each), torch.compile graphs and the builds a "
                      "backend reports (FlashInfer's JIT modules), which the "
                      "warm-up exists to take out of the checks" if "check_jit_s" in time_keys else "")
                   + ".</p>")
        run = report.get("run") or {}
        phase = rp.check_phase_text(run.get("checks"))
        if phase:
            out.append(f"<p class='note'>{esc(phase)}.</p>")
            timeline = plots.check_timeline(report["records"], run.get("checks"), (run.get("warmup") or {}).get("ready_s"))
            if timeline:
                out.append("<details><summary>checks over time, per worker</summary>"
                           + _img(timeline, "checks over time per worker", "") + "</details>")
        timing_phase = rp.timing_phase_text(run.get("timing_phase"))
        if timing_phase:
            out.append(f"<p class='note'>{esc(timing_phase[0].upper() + timing_phase[1:])}.</p>")
        built = perf.jit_in_checks(report)
        if built:
            out.append(f"<details><summary>checks that compiled ({len(built)} shown)</summary><table>"
                       "<tr><th>check</th><th class='num'>seconds</th><th class='num'>builds</th><th>what</th></tr>")
            out += [f"<tr><td>{esc(b['id'])}</td><td class='num'>{_num(b['seconds'], '.2f')}</td>"
                    f"<td class='num'>{b['builds']}</td><td>{esc(', '.join(b['what']))}</td></tr>" for b in built]
            out.append("</table></details>")
        warm = [(name, w) for name, t in times.items() for w in t.get("warmup") or []]
        if warm:
            out.append(f"<details><summary>warm-up calls ({len(warm)})</summary><table>"
                       "<tr><th>backend</th><th>configuration</th><th class='num'>seconds</th><th>outcome</th>"
                       "<th>message</th></tr>")
            out += [f"<tr><td>{esc(name)}</td><td>{esc(w.get('key'))}</td><td class='num'>"
                    f"{_num(w.get('seconds'), '.2f')}</td>"
                    f"<td class='{'o-fail' if w.get('outcome') in ('error', 'timeout') else ''}'>{esc(w.get('outcome'))}</td>"
                    f"<td>{esc(triage.strip_ansi(w.get('message') or ''))}</td></tr>" for name, w in warm]
            out.append("</table></details>")
    return out


def _perf(report) -> list[str]:
    caveats = [f"<p class='caveat'>{esc(line)}</p>" for line in perf.timing_notes(report)]
    if not report.get("timings"):
        status = (report.get("run") or {}).get("benchmarks")
        if status in (None, perf.BENCH_NOT_ASKED):
            return ["<h2 id='performance'>Performance</h2>",
                    "<p class='note'>No timings in this run (run with <code>--bench</code>).</p>"]
        return ["<h2 id='performance'>Performance</h2>", f"<p class='note'>No timings: {esc(status)}.</p>"] + caveats
    base = perf.baseline_backend(report)
    backends = perf.timed_backends(report)
    table = perf.rows(report, base)
    out = ["<h2 id='performance'>Performance</h2>",
           f"<p class='note'>Each cell: speedup against <b>{esc(base)}</b> (its median time over this backend's; "
           "above 1 is faster; <code>--baseline-backend</code> picks another), the median time per call with "
           f"{esc(perf.per_call_words(report))} (<i>host-bound</i> where the host's time per call is the time per "
           "call), then TFLOP/s on "
           "useful FLOPs (valid query-key pairs only, causal counted as visible pairs; backward 2.5× forward) and "
           "the rounds' interquartile range as ± half its share of the median. Hover for rounds, first call and "
           "share of the device's peak.</p>"] + caveats
    geo = perf.geomean_speedups(table)
    for direction in ("forward", "backward"):
        shown = [r for r in table if r.direction == direction]
        if not shown:
            continue
        columns, untimed = perf.direction_columns(table, backends, direction)
        out.append(f"<h3>{direction.capitalize()}</h3>")
        if untimed:
            out.append(f"<p class='note'>No {direction} timing: {esc(', '.join(untimed))}.</p>")
        out.append("<div class='scroll'><table class='grid perf'>" + _rot_header("shape", columns))
        for row in shown:
            cells = [f"<td class='first'><b>{esc(row.shape)}</b><br><span class='note'>{esc(perf.shape_text(row))}"
                     "</span></td>"]
            for name in columns:
                cell = row.cells.get(name)
                gap = row.gaps.get(name)
                if cell is None and gap is not None:
                    cells.append(f"<td class='gap' title='{esc(gap['message'])}'><i>{esc(gap['outcome'])}</i></td>")
                    continue
                if cell is None:
                    cells.append("<td></td>")
                    continue
                sp = cell.speedup
                cls = "" if sp is None or name == base else "faster" if sp >= 1.05 else \
                    "much-slower" if sp < 0.5 else "slower" if sp < 0.95 else ""
                cls += " base" if name == base else ""
                title = (f"{name} {row.shape} {direction}: median {cell.median_ms:.4f} ms, "
                         f"IQR {fmt_spread(cell.row)} ms, {cell.row.get('rounds')} rounds, "
                         f"min {cell.row['min_s'] * 1e3:.4f} ms" if cell.row.get("min_s") is not None else
                         f"{name} {row.shape} {direction}: median {cell.median_ms:.4f} ms")
                if cell.row.get("latency_s") is not None:
                    title += f", one lone call {perf.fmt_ms(cell.row['latency_s'])} ms"
                if cell.row.get("host_s") is not None:
                    title += f", host {perf.fmt_us(cell.row['host_s'])} us per call"
                if cell.row.get("first_call_s") is not None:
                    title += f", first call {perf.fmt_seconds(cell.row['first_call_s'])}"
                if cell.peak_share is not None:
                    title += f", {cell.peak_share:.0%} of the device's dense 16-bit peak"
                cells.append(f"<td class='{cls.strip()}' title='{esc(title)}'><span class='sp'>{perf.fmt_speedup(sp)}"
                             f"</span><br>{cell.median_ms:.3f} ms<br><small>{perf.fmt_tflops(cell.row['tflops'])} "
                             f"{perf.fmt_spread(cell.spread)}</small>"
                             + ("<br><small class='bound'>host-bound</small>" if cell.row.get("host_bound") else "")
                             + "</td>")
            out.append("<tr>" + "".join(cells) + "</tr>")
        geo_cells = []
        for name in columns:
            g = geo.get((name, direction))
            geo_cells.append(f"<td><span class='sp'>{perf.fmt_speedup(g[0])}</span><br><small>{g[1]} shapes</small></td>"
                             if g else "<td></td>")
        out.append("<tr><td class='first'><b>geometric mean</b></td>" + "".join(geo_cells) + "</tr>")
        out.append("</table></div>")
    out.append(_img(plots.throughput_by_shape(table, backends, base), "TFLOP/s per shape and backend", ""))
    out.append("<details><summary>every timing (median, spread, rounds, one call's latency, host time per call, first call, share of peak)</summary>"
               "<div class='scroll'><table><tr><th>backend</th><th>shape</th><th>direction</th>"
               "<th class='num'>median ms</th><th class='num'>IQR ms</th><th class='num'>rounds x calls</th>"
               "<th class='num'>TFLOP/s</th><th class='num'>of peak</th><th class='num'>speedup</th>"
               "<th class='num'>one call ms</th><th class='num'>host us/call</th>"
               "<th class='num'>first call</th><th class='num'>padding waste</th><th class='num'>skew</th>"
               "<th>problem</th></tr>")
    for row in table:
        for name in backends:
            cell = row.cells.get(name)
            if cell is None:
                continue
            t = cell.row
            out.append(
                f"<tr><td>{esc(name)}</td><td>{esc(row.shape)}</td><td>{esc(row.direction)}</td>"
                f"<td class='num'>{cell.median_ms:.3f}</td><td class='num'>{esc(fmt_spread(t))}</td>"
                f"<td class='num'>{esc(t.get('rounds') or '')} x {esc(t.get('calls_per_round') or 1)}</td>"
                f"<td class='num'>{t['tflops']:.3g}</td>"
                f"<td class='num'>{_num(cell.peak_share, '.0%')}</td>"
                f"<td class='num'>{perf.fmt_speedup(cell.speedup)}</td>"
                f"<td class='num'>{perf.fmt_ms(t.get('latency_s'))}</td>"
                f"<td class='num'>{perf.fmt_us(t.get('host_s'))}{' (bound)' if t.get('host_bound') else ''}</td>"
                f"<td class='num'>{esc(perf.fmt_seconds(t.get('first_call_s')))}</td>"
                f"<td class='num'>{_num(t.get('padding_waste'), '.0%')}</td>"
                f"<td class='num'>{_num(t.get('length_skew'), '.1f')}</td>"
                f"<td>{esc(perf.shape_text(row))}</td></tr>")
    out.append("</table></div></details>")
    return out


def _coverage(report) -> list[str]:
    coverage = report.get("coverage")
    if not isinstance(coverage, dict) or not coverage:
        return []
    backends = rp.coverage_columns(report)
    axes: dict[str, dict[str, None]] = {}
    for per_backend in coverage.values():
        for axis, values in (per_backend or {}).items():
            axes.setdefault(axis, {}).update(dict.fromkeys(values or {}))
    out = ["<h2 id='coverage'>Coverage</h2>",
           "<p class='note'>How many problems each backend ran with each value of each axis (blank: none).</p>",
           "<div class='scroll'><table class='grid'>", _rot_header("axis = value", backends)]
    for axis, values in axes.items():
        for value in sorted(values, key=_natural):
            cells = []
            for b in backends:
                n = ((coverage.get(b) or {}).get(axis) or {}).get(value)
                cells.append(f"<td class='num'>{esc(n) if n else ''}</td>")
            out.append(f"<tr><td class='first'>{esc(axis)} = {esc(value)}</td>{''.join(cells)}</tr>")
    out.append("</table></div>")
    return out


def _natural(value: str):
    try:
        return 0, float(value), ""
    except (TypeError, ValueError):
        return 1, 0.0, str(value)


def render_html(report: dict, regressions: list[dict] | None = None) -> str:
    run, summary = report["run"], rp.summarize_backends(report)
    code = rp.exit_code(report, regressions)
    groups = triage.groups(report["records"], (report.get("triage") or {}).get("entries"))
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
             "<meta name='viewport' content='width=device-width, initial-scale=1'>",
             f"<title>jfa-conformance {esc(run.get('name'))}</title><style>{CSS}</style></head><body>",
             f"<h1>Jagged flash attention conformance: {esc(run.get('name'))} "
             f"<span class='badge {'ok' if code == 0 else 'bad'}'>{'PASSED' if code == 0 else 'FAILED'}</span></h1>",
             f"<p class='meta'>{esc(run_line(run)).replace('`', '')}</p>"]
    if not run.get("complete", True):
        parts.append("<p class='v-incomplete'>The run did not finish: checks that never ran are marked “not run”.</p>")
    elif run.get("stopped"):
        parts.append(f"<p class='note'>The run stopped ({esc(run['stopped'])}) after every check had its verdict.</p>")
    parts += ["<h2>Backends</h2>", *_backend_table(report, summary)]
    if any(s["verdict"] == "incomplete" for s in summary.values()):
        parts.append("<p class='note'>incomplete: no check failed, but some never ran (see “Not run”).</p>")
    if regressions:
        parts.append("<h2>Regressions against the baseline</h2><ul>")
        parts += [f"<li><b>{esc(r['kind'])}</b>: {esc(r['what'])} — {esc(r['detail'])}</li>" for r in regressions]
        parts.append("</ul>")
    parts += _causes(report, groups)
    parts.append("<h2 id='matrix'>Conformance matrix (feature × backend)</h2>")
    parts += _matrix(report)
    parts += _perf(report)
    unrun, reasons = rp.unrun_checks(report)
    if unrun:
        parts.append(f"<h2>Not run ({sum(map(len, unrun.values()))})</h2>")
        parts.append(f"<p class='note'>No verdict: these say nothing about the backend. Reason: {esc('; '.join(reasons))}</p><ul>")
        parts += [f"<li><b>{esc(b)}</b>: {esc(', '.join(labels))}</li>" for b, labels in unrun.items()]
        parts.append("</ul>")
    xfails = [r for r in report["records"] if r["outcome"] == "expected-fail"]
    if xfails:
        parts.append(f"<h2>Expected failures ({len(xfails)})</h2><ul>")
        parts += [f"<li><b>{esc(r['backend'])}</b> {esc(r['feature'])} {esc(r.get('dtype') or '')}: {esc(r.get('reason'))}</li>"
                  for r in xfails]
        parts.append("</ul>")
    lines = unsupported_lines(report)
    if lines:
        total = sum(n for _, _, n, _ in lines)
        parts.append(f"<h2>Unsupported (declared)</h2><details><summary>{total} checks, {len(lines)} reasons "
                     "(one line per backend and reason)</summary><div class='scroll'><table>"
                     "<tr><th>backend</th><th>reason</th><th class='num'>checks</th><th>features</th></tr>")
        parts += [f"<tr><td>{esc(b)}</td><td>{esc(why)}</td><td class='num'>{n}</td><td>{esc(features)}</td></tr>"
                  for b, why, n, features in lines]
        parts.append("</table></div></details>")
    parts += _coverage(report)
    parts.append("<h2>Error budget heatmap</h2>")
    parts += _heatmap(report)
    parts.append(_img(plots.budget_by_backend_and_dtype(report["records"], list(report.get("backends", {}))),
                      "error budget by backend and dtype", "No error budgets were measured."))
    parts.append("<h2>Run</h2><div class='scroll'><table>")
    env = run.get("environment", {})
    rows = {k: v for k, v in run.items() if k not in ("environment", "shards")}
    rows.update(env)
    for key, value in rows.items():
        text = json.dumps(value) if isinstance(value, (dict, list)) else value
        parts.append(f"<tr><th>{esc(key)}</th><td>{esc(text)}</td></tr>")
    parts.append("</table></div>")
    if report.get("triage"):
        parts.append(f"<p class='note'>Triage labels from {esc(report['triage'].get('file'))} "
                     f"({len(report['triage'].get('entries') or [])} entries).</p>")
    if run.get("shards"):
        parts.append(f"<p class='note'>Merged from {len(run['shards'])} shards: "
                     + ", ".join(esc(s.get("name")) for s in run["shards"]) + "</p>")
    parts.append("</body></html>")
    return "\n".join(parts)
