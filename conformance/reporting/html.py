"""index.html: one self-contained page (inline CSS, plots as base64 PNG; opens from disk, no network)."""
from __future__ import annotations

import base64
import html
import json

from .. import report as rp
from . import plots
from .markdown import fmt_budget, fmt_spread, run_line

LABEL = {"pass": "pass", "fail": "FAIL", "crash": "CRASH", "timeout": "TIMEOUT", "not-run": "not run",
         "expected-fail": "xfail", "unsupported": "unsupported"}
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1280px;
 padding:0 16px;color:#1d1d1f}
h1{font-size:24px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555} .badge{display:inline-block;padding:2px 10px;border-radius:12px;color:#fff;font-weight:600}
.badge.ok{background:#2e7d32} .badge.bad{background:#c62828}
table{border-collapse:collapse;margin:6px 0} th,td{border:1px solid #d6d6d6;padding:3px 8px;text-align:left}
th{background:#f3f3f3;font-weight:600} td.num{text-align:right;font-variant-numeric:tabular-nums}
.matrix td{text-align:center;min-width:92px;white-space:nowrap} .matrix td.feature,.heat td.feature{text-align:left}
.o-pass{background:#d4edda;color:#14532d} .o-fail{background:#f8c9c9;color:#7f1d1d;font-weight:600}
.o-crash{background:#6b21a8;color:#fff;font-weight:600} .o-timeout{background:#f59e0b;color:#1d1d1f;font-weight:600}
.o-not-run{background:#4b5563;color:#fff} .o-expected-fail{background:#dbeafe;color:#1e3a8a}
.o-unsupported{background:#f1f1f1;color:#777} td[title]{cursor:help}
.legend span{display:inline-block;padding:1px 8px;margin-right:6px;border-radius:3px}
.heat td{text-align:right;min-width:70px;font-variant-numeric:tabular-nums}
pre{background:#f6f8fa;padding:8px;overflow-x:auto;font-size:12px;max-height:320px}
code{background:#f3f3f3;padding:0 3px;border-radius:3px} details{margin:4px 0}
.v-conformant{color:#14532d;font-weight:600} .v-failing{color:#b91c1c;font-weight:600}
.v-supports-nothing{color:#92400e;font-weight:600} img{max-width:100%;border:1px solid #eee}
.note{color:#666;font-size:13px}
"""


def esc(value) -> str:
    return html.escape("" if value is None else str(value))


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


def _record_line(r: dict) -> str:
    bits = [r.get("dtype") or (r.get("problem") or {}).get("dtype") or "", LABEL.get(r["outcome"], r["outcome"])]
    if r.get("budget_used") is not None:
        bits.append(f"budget {fmt_budget(r['budget_used'])} ({r.get('quantity')})")
    if r.get("reason"):
        bits.append(r["reason"])
    return " — ".join(b for b in bits if b)


def _matrix(report) -> list[str]:
    backends, features, cells = rp.matrix(report["records"], report.get("backends", {}))
    if not backends:
        return ["<p>No checks ran.</p>"]
    out = ['<p class="legend">' + "".join(f'<span class="o-{o}">{LABEL[o]}</span>' for o in rp.OUTCOMES) +
           '<span class="note">Hover a cell for each dtype\'s outcome and reason; reasons are also listed below.</span></p>',
           '<table class="matrix"><tr><th>feature</th>' + "".join(f"<th>{esc(b)}</th>" for b in backends) + "</tr>"]
    for feature in features:
        row = [f'<td class="feature">{esc(feature)}</td>']
        for b in backends:
            records = cells.get((b, feature))
            if not records:
                row.append("<td></td>")
                continue
            outcome = rp.cell_outcome(records)
            text = rp.cell_label(records, LABEL)
            title = "\n".join(_record_line(r) for r in records)
            row.append(f'<td class="o-{outcome}" title="{esc(title)}">{esc(text)}</td>')
        out.append("<tr>" + "".join(row) + "</tr>")
    out.append("</table>")
    notes = [(b, f, r) for (b, f), rs in cells.items() for r in rs if r["outcome"] not in ("pass",)]
    if notes:
        out.append(f"<details><summary>Why a cell is not <b>pass</b> ({len(notes)} checks)</summary><table>"
                   "<tr><th>backend</th><th>feature</th><th>dtype</th><th>outcome</th><th>reason</th></tr>")
        for b, f, r in sorted(notes, key=lambda n: (n[0], rp.SEVERITY.get(n[2]["outcome"], 0), n[1])):
            out.append(f'<tr><td>{esc(b)}</td><td>{esc(f)}</td><td>{esc(r.get("dtype"))}</td>'
                       f'<td class="o-{r["outcome"]}">{LABEL[r["outcome"]]}</td><td>{esc(r.get("reason"))}</td></tr>')
        out.append("</table></details>")
    return out


def _heatmap(report) -> list[str]:
    backends, features, cells = rp.matrix(report["records"], report.get("backends", {}))
    if not backends:
        return []
    out = ['<p class="note">Largest share of the allowed error used by any example of the check '
           "(observed error / allowed error; 100% is the edge of the tolerance). Empty: no measured example.</p>",
           '<table class="heat"><tr><th>feature</th>' + "".join(f"<th>{esc(b)}</th>" for b in backends) + "</tr>"]
    for feature in features:
        row = [f'<td class="feature">{esc(feature)}</td>']
        for b in backends:
            budgets = [(r["budget_used"], r) for r in cells.get((b, feature), []) if r.get("budget_used") is not None]
            if not budgets:
                row.append("<td></td>")
                continue
            value, r = max(budgets, key=lambda x: x[0])
            title = f"{r.get('dtype') or ''} {r.get('quantity') or ''}: observed {_sci(r.get('observed_error'))}, " \
                    f"allowed {_sci(r.get('allowed_error'))}"
            row.append(f'<td style="background:{_budget_color(value)}" title="{esc(title)}">{fmt_budget(value)}</td>')
        out.append("<tr>" + "".join(row) + "</tr>")
    out.append("</table>")
    return out


def _img(png: bytes | None, alt: str, missing: str) -> str:
    if not png:
        return f'<p class="note">{esc(missing)}</p>'
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def render_html(report: dict, regressions: list[dict] | None = None) -> str:
    run, summary = report["run"], rp.summarize_backends(report)
    code = rp.exit_code(report, regressions)
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
             f"<title>jfa-conformance {esc(run.get('name'))}</title><style>{CSS}</style></head><body>",
             f"<h1>Jagged flash attention conformance: {esc(run.get('name'))} "
             f"<span class='badge {'ok' if code == 0 else 'bad'}'>{'PASSED' if code == 0 else 'FAILED'}</span></h1>",
             f"<p class='meta'>{esc(run_line(run)).replace('`', '')}</p>"]
    if not run.get("complete", True):
        parts.append("<p class='v-failing'>The run did not finish: checks that never ran are marked “not run”.</p>")
    parts += ["<h2>Backends</h2><table><tr><th>backend</th><th>verdict</th>"
              + "".join(f"<th>{LABEL[o]}</th>" for o in rp.OUTCOMES) + "<th>worst budget</th></tr>"]
    for name, s in summary.items():
        reason = (report.get("backends", {}).get(name) or {}).get("reason")
        verdict = s["verdict"] + (f" ({reason})" if reason and s["verdict"] == "supports nothing" else "")
        parts.append(f"<tr><td>{esc(name)}</td><td class='v-{s['verdict'].replace(' ', '-')}'>{esc(verdict)}</td>"
                     + "".join(f"<td class='num'>{s['counts'][o] or ''}</td>" for o in rp.OUTCOMES)
                     + f"<td class='num'>{fmt_budget(s['worst_budget'])}</td></tr>")
    parts.append("</table>")
    if regressions:
        parts.append("<h2>Regressions against the baseline</h2><ul>")
        parts += [f"<li><b>{esc(r['kind'])}</b>: {esc(r['what'])} — {esc(r['detail'])}</li>" for r in regressions]
        parts.append("</ul>")
    parts.append("<h2>Conformance matrix (feature × backend)</h2>")
    parts += _matrix(report)
    bad = rp.failures(report, unrun=False)
    if bad:
        parts.append(f"<h2>Failures ({len(bad)})</h2>")
        for r in bad:
            parts.append(f"<details><summary><span class='o-{r['outcome']}'>&nbsp;{LABEL[r['outcome']]}&nbsp;</span> "
                         f"<b>{esc(r['backend'])}</b> · {esc(r['feature'])} {esc(r.get('dtype') or '')} — "
                         f"{esc(r.get('reason'))}</summary>")
            if r.get("counterexample"):
                parts.append(f"<p>{rp.problem_label(r).capitalize()}: <code>{esc(r['counterexample'])}</code></p>")
            if (r.get("replay") or {}).get("command"):
                parts.append(f"<p>Replay: <code>{esc(r['replay']['command'])}</code></p>")
            if r.get("verdicts"):
                parts.append("<table><tr><th>quantity</th><th>observed</th><th>allowed</th><th>budget</th></tr>" + "".join(
                    f"<tr><td>{esc(v['quantity'])}</td><td class='num'>{v['observed']:.3e}</td>"
                    f"<td class='num'>{v['allowed']:.3e}</td><td class='num'>{fmt_budget(v['budget_used'])}</td></tr>"
                    for v in r["verdicts"]) + "</table>")
            if r.get("message"):
                parts.append(f"<pre>{esc(r['message'])}</pre>")
            parts.append(f"<p class='note'>check id: <code>{esc(r['id'])}</code></p></details>")
    unrun, reasons = rp.unrun_checks(report)
    if unrun:
        parts.append(f"<h2>Not run ({sum(map(len, unrun.values()))})</h2>")
        parts.append(f"<p class='note'>Reason: {esc('; '.join(reasons))}</p><ul>")
        parts += [f"<li><b>{esc(b)}</b>: {esc(', '.join(labels))}</li>" for b, labels in unrun.items()]
        parts.append("</ul>")
    parts.append("<h2>Error budget heatmap</h2>")
    parts += _heatmap(report)
    parts.append("<h2>Plots</h2>")
    parts.append(_img(plots.budget_by_backend_and_dtype(report["records"]), "error budget by backend and dtype",
                      "No error budgets were measured."))
    parts.append(_img(plots.tflops_vs_skew(report.get("timings", [])), "TFLOP/s vs length skew",
                      "No timings in this run (run with --bench)."))
    parts.append("<h2>Timings</h2>")
    if report.get("timings"):
        parts.append("<p class='note'>Median of pytest-benchmark rounds; IQR: their interquartile range. "
                     "TFLOP/s count useful FLOPs only "
                     "(valid query-key pairs, causal halved; backward 2.5× forward). Padding waste: the share of a "
                     "padded [B, max L] layout's work that would be padding.</p>")
        parts.append("<table><tr><th>backend</th><th>shape</th><th>direction</th><th>median ms</th><th>IQR ms</th>"
                     "<th>TFLOP/s</th>"
                     "<th>padding waste</th><th>skew</th><th>B</th><th>heads</th><th>D</th><th>dtype</th><th>causal</th></tr>")
        for t in sorted(report["timings"], key=lambda t: (t["shape"], t["direction"], t["backend"])):
            p = t.get("problem") or {}
            parts.append(
                f"<tr><td>{esc(t['backend'])}</td><td>{esc(t['shape'])}</td><td>{esc(t['direction'])}</td>"
                f"<td class='num'>{t['median_s'] * 1e3:.3f}</td><td class='num'>{esc(fmt_spread(t))}</td>"
                f"<td class='num'>{t['tflops']:.3g}</td>"
                f"<td class='num'>{t['padding_waste']:.0%}</td><td class='num'>{t['length_skew']:.1f}</td>"
                f"<td class='num'>{esc(p.get('batch'))}</td><td class='num'>{esc(p.get('heads_q'))}</td>"
                f"<td class='num'>{esc(p.get('head_dim'))}</td><td>{esc(p.get('dtype'))}</td><td>{esc(p.get('causal'))}</td></tr>")
        parts.append("</table>")
    else:
        parts.append("<p class='note'>No timings in this run (run with <code>--bench</code>).</p>")
    parts.append("<h2>Run</h2><table>")
    env = run.get("environment", {})
    rows = {k: v for k, v in run.items() if k not in ("environment", "shards")}
    rows.update(env)
    for key, value in rows.items():
        text = json.dumps(value) if isinstance(value, (dict, list)) else value
        parts.append(f"<tr><th>{esc(key)}</th><td>{esc(text)}</td></tr>")
    parts.append("</table>")
    if run.get("shards"):
        parts.append(f"<p class='note'>Merged from {len(run['shards'])} shards: "
                     + ", ".join(esc(s.get("name")) for s in run["shards"]) + "</p>")
    parts.append("</body></html>")
    return "\n".join(parts)
