"""The report's views for comparing kernels: the performance section (speedups against a baseline backend,
spread, first call, compile times), coverage, the collapsed unsupported list, escaping of everything a
backend or run supplies, the reproducers a report directory holds, `compare`, and the page's layout with
15 backends at 1400 px (headless Chromium, where installed)."""
from __future__ import annotations

import dataclasses
import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import cli, replay
from conformance import report as rp
from conformance.problem import LAYOUTS, OFFSETS_LAYOUTS, Problem, make_inputs, problem_of_args
from conformance.spec.edge_cases import EDGE_CASES
from conformance.reporting import perf, render_html, render_markdown
from conformance.reporting.__main__ import find_browser, scroll_width

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"dense": 1.0, "uniform": 1.9, "pareto": 7.8}


def rec(backend, feature, outcome="pass", dtype="float16", **extra):
    problem = Problem((3, 5), (4, 5), heads_q=2, head_dim=64, dtype=dtype or "float32")
    return {"id": f"conformance/spec/test_x.py::test_{feature}[{backend}-{dtype}]", "backend": backend,
            "test": f"test_{feature}", "feature": feature, "dtype": dtype, "outcome": outcome,
            "reason": extra.pop("reason", None), "message": extra.pop("message", None), "verdicts": [],
            "quantity": "out", "observed_error": 1e-4, "allowed_error": 1e-3, "budget_used": 0.1,
            "problem": problem.summary(), "problem_source": "last example", "counterexample": None,
            "device": "cpu", **extra}


def timing(backend, shape, direction, median, q=0.04, host_share=0.3):
    return {"backend": backend, "shape": shape, "direction": direction, "median_s": median, "min_s": median * 0.95,
            "q1_s": median * (1 - q), "q3_s": median * (1 + q), "rounds": 5, "first_call_s": 2.5,
            "calls_per_round": 20, "latency_s": median * 4, "host_s": median * host_share,
            "host_bound": host_share >= 0.9,
            "useful_flops": 1e12, "tflops": 1.0 / median, "padding_waste": 0.4, "length_skew": SHAPES[shape],
            "problem": {"batch": 64, "heads_q": 8, "heads_kv": 8, "head_dim": 128, "dtype": "bfloat16", "causal": "none"}}


def many_backends(n=15) -> dict:
    """A run with ``n`` backends with long names: timings, coverage, compile times and a few failures."""
    names = ["reference", "triton-jfa"] + [f"vendor-kernel-{i:02d}-long-name" for i in range(n - 2)]
    records, timings = [], []
    features = ["forward", "lse", "gradients", "metamorphic:empty_sequences_inserted",
                "broadcast_q_native_matches_replicated", "edge_case:causal_more_queries_than_keys"]
    for i, name in enumerate(names):
        for feature in features:
            for dtype in ("float32", "float16", "bfloat16"):
                outcome = "unsupported" if dtype == "float32" and i > 2 else "pass"
                if i == 4 and feature == "gradients":
                    outcome = "crash"
                if i == 5 and feature == "lse":
                    outcome = "timeout"
                if i == 6 and feature == "forward":
                    outcome = "not-run"
                records.append(rec(name, feature, outcome, dtype, reason="dtype float32 is not supported"
                                   if outcome == "unsupported" else None,
                                   message="conformance.harness.DeviceFault: x backward: CUDA error: an illegal memory"
                                   " access was encountered" if outcome == "crash" else None))
        for shape in SHAPES:
            for direction in ("forward", "backward"):
                timings.append(timing(name, shape, direction, 1e-3 * (1 + 0.1 * i)))
    backends = {name: {"source": f"backends.x:{name}" if name != "reference" else "conformance.reference:Reference",
                       "available": True, "reason": None, "capabilities": {},
                       "time": {"compile_s": 10.0 + i, "check_s": 100.0 + i,
                                "warmup": [{"key": "bf16-d128", "seconds": 3.0, "outcome": "ok", "message": None}]}}
                for i, name in enumerate(names)}
    coverage = {name: {"head_dim": {"16": 3, "64": 10, "128": 7}, "dtype": {"float16": 9, "bfloat16": 11}}
                for name in names}
    return {"schema": rp.SCHEMA, "schema_version": rp.SCHEMA_VERSION,
            "run": {"name": "wide", "profile": "dev", "seed": 1, "complete": False,
                    "environment": {"device": "cuda", "device_name": "NVIDIA H200", "torch": "x"}},
            "backends": backends, "records": records, "timings": timings, "coverage": coverage}


# -- performance ----------------------------------------------------------------------------------------
def test_speedups_are_against_the_first_vendor_kernel_unless_another_is_chosen():
    report = many_backends(5)
    # reference and triton-jfa are not vendor kernels: the first vendor adapter is the baseline
    assert perf.baseline_backend(report) == "vendor-kernel-00-long-name"
    assert perf.baseline_backend(report, "triton-jfa") == "triton-jfa"
    assert perf.baseline_backend(report, "not-timed") == "vendor-kernel-00-long-name"
    table = perf.rows(report, "vendor-kernel-00-long-name")
    assert [(r.shape, r.direction) for r in table][:3] == [("dense", "forward"), ("uniform", "forward"),
                                                            ("pareto", "forward")]
    cell = table[0].cells["reference"]  # 1.0 ms against the baseline's 1.2 ms
    assert cell.speedup == pytest.approx(1.2) and cell.spread == pytest.approx(0.08)
    assert cell.peak_share == pytest.approx((1 / 1e-3) / 989.4)  # bf16 on an H200
    geo = perf.geomean_speedups(table)
    assert geo["reference", "forward"] == (pytest.approx(1.2), 3)
    report["run"]["baseline_backend"] = "reference"
    assert perf.baseline_backend(report) == "reference"


def test_peak_is_only_claimed_for_known_devices_and_16_bit_inputs():
    assert perf.peak_tflops({"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"}, "float16") == 989.4
    assert perf.peak_tflops({"device": "cuda", "device_name": "NVIDIA H200"}, "float32") is None
    assert perf.peak_tflops({"device": "cpu", "device_name": "x86_64"}, "bfloat16") is None
    assert perf.peak_tflops({"device": "cuda", "device_name": "Some Future GPU"}, "bfloat16") is None


def test_the_performance_section_compile_times_and_coverage_render():
    report = many_backends(4)
    page, md = render_html(report), render_markdown(report)
    assert "Performance" in page and "speedup against <b>vendor-kernel-00-long-name</b>" in page
    assert "1.20x" in page and "geometric mean" in page and "first call 2.5 s" in page
    assert "compile s" in page and ">12.0<" in page and ">102.0<" in page  # vendor-kernel-00: index 2
    assert "head_dim = 128" in page and "Coverage" in page
    assert "| reference | dense | forward | 1.000 | 0.960–1.040 | 5 x 20 | 1e+03 | 101% | 1.20x | 4.000 | 300 | 2.5 s |" in md
    assert "· *host-bound*" not in md and "class='bound'" not in page and "(bound)" not in md


def test_host_bound_timings_are_marked_where_they_are_read():
    report = many_backends(4)
    report["timings"] = [dict(t, host_bound=True, host_s=t["median_s"]) if t["backend"] == "triton-jfa" else t
                         for t in report["timings"]]
    n = sum(t["backend"] == "triton-jfa" for t in report["timings"])
    page, md = render_html(report), render_markdown(report)
    assert f"triton-jfa: host-bound in {n} of its {n} timings" in md and f"host-bound in {n} of its {n}" in page
    assert "· *host-bound*" in md and "class='bound'>host-bound<" in page
    assert "(bound)" in md and "(bound)" in page  # the every-timing tables' host column
    assert "compile s | check s |" in md and "| 12.0 | 102.0 |" in md
    assert "| head_dim = 16 | 3 | 3 | 3 | 3 |" in md


def test_backends_the_timings_never_reached_are_named_with_the_reason():
    report = many_backends(4)
    report["timings"] = [t for t in report["timings"] if t["backend"] != "triton-jfa"]
    report["run"].update(timed_backends=["reference", "triton-jfa", "vendor-kernel-00-long-name"],
                         benchmarks="stopped: the run reached its --time-limit; the timings finished before it are kept")
    line = "not timed: triton-jfa (benchmarks: stopped: the run reached its --time-limit"
    assert line in render_html(report) and line in render_markdown(report)
    report["run"]["benchmarks"] = "ok"
    assert "no timing for triton-jfa: each declares every timed shape unsupported" in render_markdown(report)
    report["run"]["timed_backends"] = None  # reports written before the field: nothing claimed
    assert "not timed:" not in render_markdown(report)


def test_the_coverage_columns_follow_the_backend_table_not_the_finishing_order():
    report = many_backends(4)
    report["coverage"] = dict(reversed(list(report["coverage"].items())))
    assert rp.coverage_columns(report) == list(report["backends"])
    md = render_markdown(report)
    header = next(line for line in md.splitlines() if line.startswith("| axis = value |"))
    assert header.index("reference") < header.index("triton-jfa") < header.index("vendor-kernel-00")


def test_a_backend_an_interpreter_runs_is_untimed_or_its_times_are_marked():
    from conformance import pytest_session, registry
    # an interpreter's times are not a kernel's: left out of the timed set unless named with --backend
    sdpa = registry.describe("sdpa", "cpu")
    interpreted = dataclasses.replace(sdpa, name="interp", capabilities={**sdpa.capabilities,
                                                                       "interpreted_by": "Triton's interpreter"})
    chosen = [("sdpa", sdpa), ("x.py:interp", interpreted)]
    assert pytest_session.timed_specs([], chosen) == ["sdpa"]
    assert pytest_session.timed_specs(["sdpa", "x.py:interp"], chosen) == ["sdpa", "x.py:interp"]
    report = many_backends(4)
    report["backends"]["triton-jfa"]["capabilities"] = {"interpreted_by": "Triton's interpreter"}
    slow = [dict(t, median_s=0.6, tflops=1 / 0.6) for t in report["timings"] if t["backend"] == "triton-jfa"]
    report["timings"] = [t for t in report["timings"] if t["backend"] != "triton-jfa"] + slow
    page, md = render_html(report), render_markdown(report)
    note = "triton-jfa: run by Triton's interpreter here, so its times measure the interpreter, not a kernel"
    assert html.escape(note) in page and note in md
    assert "0.002x" in page and "0.00x" not in page  # 1.2 ms against 600 ms: two significant digits
    # untimed: said so, with how to time it anyway
    report["timings"] = [t for t in report["timings"] if t["backend"] != "triton-jfa"]
    assert html.escape("triton-jfa: not timed, since Triton's interpreter runs it here") in render_html(report)
    report["timings"], report["run"]["benchmarks"] = [], "not run: no kernel backend to time"
    page = render_html(report)
    assert "No timings: not run: no kernel backend to time." in page and "triton-jfa: not timed" in page
    report["run"]["benchmarks"] = perf.BENCH_NOT_ASKED
    assert "run with <code>--bench</code>" in render_html(report) and "not timed" not in render_html(report)


def test_speedups_keep_two_significant_digits_below_a_tenth():
    assert [perf.fmt_speedup(x) for x in (None, 0.0, 0.0017, 0.0999, 0.1, 1.234, 12.0)] == \
        ["", "0.00x", "0.0017x", "0.1x", "0.10x", "1.23x", "12.00x"]


def test_unsupported_checks_collapse_to_one_line_per_backend_and_reason():
    records = [rec("a", f, "unsupported", d, reason="dtype float32 is not supported; causal mode 'top_left' is not "
                   "supported") for f in ("forward", "lse") for d in ("float32",)]
    records += [rec("a", "determinism", "unsupported", reason="not declared deterministic: largest difference "
                    "4.8e-07 (on Problem(seqlens_q=[1], seqlens_k=[2]))")]
    report = {**many_backends(3), "records": records, "timings": []}
    md = render_markdown(report)
    assert "- a: dtype float32 is not supported — 2 checks (forward [float32], lse [float32])" in md
    assert "- a: causal mode 'top_left' is not supported — 2 checks" in md
    assert "on Problem" not in md.split("Unsupported checks")[1]


# -- escaping -------------------------------------------------------------------------------------------
HOSTILE = "<script>alert(1)</script>"


def test_every_text_a_backend_or_run_supplies_is_escaped():
    report = many_backends(3)
    name = "x" + HOSTILE
    report["backends"][name] = {"source": HOSTILE, "available": True, "reason": HOSTILE, "capabilities": {},
                                "time": {"compile_s": 1.0, "check_s": 1.0, "warmup": [
                                    {"key": HOSTILE, "seconds": 1.0, "outcome": "error", "message": HOSTILE}]}}
    bad = rec(name, "forward" + HOSTILE, "fail", dtype="float16", reason=HOSTILE,
              message=f"RuntimeError: {HOSTILE}\n\x1b[91mmore {HOSTILE}\x1b[0m", counterexample=HOSTILE,
              replay={"script": f"failures/{HOSTILE}.py", "command": HOSTILE, "pytest": HOSTILE})
    report["records"] += [bad, rec(name, "lse", "unsupported", reason=HOSTILE),
                          rec(name, "gradients", "expected-fail", reason=HOSTILE)]
    report["timings"].append(timing(name, "dense", "forward", 1e-3))
    report["timings"][-1]["shape"] = HOSTILE
    report["coverage"][name] = {HOSTILE: {HOSTILE: 1}}
    report["triage"] = {"file": HOSTILE, "entries": [{"match": "RuntimeError", "label": HOSTILE,
                                                      "link": "https://example.org/\"><script>x</script>"}]}
    report["run"]["name"] = HOSTILE
    report["run"]["environment"]["device_name"] = HOSTILE
    page = render_html(report, [{"kind": HOSTILE, "what": HOSTILE, "detail": HOSTILE}])
    assert "<script>" not in page and "\x1b" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'href="https://example.org/&quot;&gt;&lt;script&gt;x&lt;/script&gt;"' in page
    md = render_markdown(report)
    outside_code = re.sub(r"(`+).*?\1", "", md)  # inside a code span the text is shown, never run
    assert "\x1b" not in md and "<script>" not in outside_code and "&lt;script>" in outside_code


# -- reproducers in the report directory ----------------------------------------------------------------
def _failing_report(tmp_path) -> tuple[Path, dict]:
    problem = Problem((3, 4), (5, 2), heads_q=2, head_dim=16)
    record = rec("conformance.mutants:LseBase2", "lse", "fail", dtype=None,
                 message="AssertionError: disagrees with the float64 oracle\n  lse: FAIL, observed error 1.0e+00, "
                         "allowed 1.0e-02 (budget used 100x)")
    record.update(id="conformance/spec/test_oracle_checks.py::test_lse[lse-base-2]", problem=problem.summary(),
                  problem_source="shrunk", counterexample=repr(problem), params={})
    # an artifact written where the run started, as older runs stored it
    elsewhere = tmp_path / "elsewhere"
    path = replay.write_artifact(elsewhere, replay.artifact_record(record, "conformance.mutants:LseBase2"))
    record["replay"] = {"artifact": str(path), "command": f"jfa-conformance replay {path}"}
    report = {**many_backends(3), "records": [record], "timings": []}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return run_dir, report


def test_reproducers_live_in_the_report_with_relative_paths_and_survive_a_move(tmp_path):
    run_dir, report = _failing_report(tmp_path)
    cli.write_run_dir(run_dir, report)
    (record,) = report["records"]
    entry = record["replay"]
    assert entry["artifact"].startswith("failures/") and entry["script"].startswith("failures/")
    assert entry["command"] == f"jfa-conformance replay {entry['artifact']} --backend conformance.mutants:LseBase2"
    assert entry["pytest"].startswith("python -m pytest 'conformance/spec/test_oracle_checks.py::test_lse[lse-base-2]'")
    assert "--hypothesis-seed=1" in entry["pytest"]
    saved = json.loads((run_dir / "report.json").read_text())
    assert saved["records"][0]["replay"] == entry and saved["causes"][0]["checks"] == [record["id"]]
    assert str(tmp_path) not in (run_dir / "report.json").read_text()
    # the report moved elsewhere: its replay command still runs, from the report directory
    moved = tmp_path / "moved"
    run_dir.rename(moved)
    proc = subprocess.run([sys.executable, "-m", "conformance.cli", "replay", entry["artifact"]], cwd=moved,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1 and "still fails" in proc.stdout, proc.stdout + proc.stderr


def test_a_reproducer_script_stands_alone(tmp_path):
    run_dir, report = _failing_report(tmp_path)
    cli.write_run_dir(run_dir, report)
    script = run_dir / report["records"][0]["replay"]["script"]
    text = script.read_text()
    assert "Reproducer: conformance.mutants:LseBase2 · lse (fail)" in text and "Problem(seqlens_q=[3, 4]" in text
    lone = tmp_path / "attached.py"  # copied out of the report, as one attaches it to a bug report
    lone.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(lone)], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout and "lse: FAIL" in proc.stdout, proc.stdout + proc.stderr
    assert "cu_seqlens_q: [0, 3, 7]" in proc.stdout
    proc = subprocess.run([sys.executable, str(lone), "--backend", "reference"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stdout + proc.stderr


def test_a_crash_reproducer_calls_the_backend_on_the_problem_it_was_running(tmp_path):
    record = rec("conformance.mutants:LseBase2", "metamorphic:key_shift", "crash", dtype=None,
                 message="conformance.harness.DeviceFault: lse-base-2 forward: AcceleratorError: CUDA error: "
                         "an illegal memory access was encountered")
    record.update(problem=Problem((2,), (3,), head_dim=16).summary(), problem_source="running",
                  test="test_metamorphic", params={"relation": "key_shift"})
    mode, gradients = replay.reproducer_mode(record)
    assert (mode, gradients) == ("call", False)
    entry = replay.write_reproducer(tmp_path, record)
    spec = {"backend": "reference", "device": "cpu", "problem": record["problem"], "mode": "call",
            "gradients": True, "check": "test_metamorphic", "params": {}}
    assert replay.reproduce(spec).ok  # the reference gets that problem right
    assert not replay.reproduce({**spec, "backend": "conformance.mutants:LseBase2"}).ok
    assert "mode': 'call'" in (tmp_path / entry["script"]).read_text()


@pytest.mark.parametrize("offsets_layout", OFFSETS_LAYOUTS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_problem_of_a_call_keeps_how_its_tensors_are_laid_out(layout, offsets_layout):
    problem = Problem((5, 0, 17), (7, 3, 17), heads_q=2, heads_kv=2, head_dim=16, dtype="float16",
                      layout=layout, offsets_layout=offsets_layout)
    seen = problem_of_args(make_inputs(problem))
    assert (seen.layout, seen.offsets_layout) == (layout, offsets_layout)
    one_head = problem_of_args(make_inputs(problem.replace(heads_q=1, heads_kv=1)))
    # one head: head-strided views are rows of a wider buffer, which a reproducer rebuilds as such
    assert one_head.layout == {"head_strided": "row_strided"}.get(layout, layout)


def test_a_crash_reproducer_passes_the_views_the_dead_call_was_given():
    # What a process that died in the misaligned_views edge case records: the call's own problem, which a
    # reproducer must rebuild with the same unaligned bases, or a kernel that faults on them passes.
    case = EDGE_CASES["misaligned_views"].replace(dtype="float16")
    running = problem_of_args(make_inputs(case))
    spec = {"backend": "reference", "device": "cpu", "problem": dataclasses.asdict(running), "mode": "call",
            "gradients": False, "check": "test_edge_case", "params": {"case": "misaligned_views"}}
    assert running.layout == "offset_view" and replay.reproduce(spec).ok
    assert not replay.reproduce({**spec, "backend": "conformance.mutants:MisalignedBaseRoundedDown"}).ok


def test_an_edge_case_crash_reruns_the_edge_case_with_its_own_inputs(tmp_path):
    # A record of a process that died in misaligned_views, as reports made before crashed calls kept their
    # layouts have it: the running problem with packed tensors. The edge case's problem is fixed, so the
    # reproducer reruns the edge case itself, unaligned views included.
    running = EDGE_CASES["misaligned_views"].replace(dtype="float16", layout="packed", seed=0)
    record = rec("conformance.mutants:MisalignedBaseRoundedDown", "edge_case:misaligned_views", "crash",
                 dtype="float16", message="worker 'gw3' crashed while running 'x'")
    record.update(id="conformance/spec/test_edge_cases.py::test_edge_case[x-misaligned_views-float16]",
                  test="test_edge_case", params={"case": "misaligned_views"}, problem=running.summary(),
                  problem_source="running")
    assert replay.reproducer_mode(record) == ("check", False)
    entry = replay.write_reproducer(tmp_path, record)
    text = (tmp_path / entry["script"]).read_text()
    assert "'layout': 'offset_view'" in text and "'mode': 'check'" in text
    spec = {"backend": "conformance.mutants:MisalignedBaseRoundedDown", "device": "cpu", "check": "test_edge_case",
            "params": {"case": "misaligned_views", "dtype": "float16"}, "mode": "check",
            "problem": dataclasses.asdict(EDGE_CASES["misaligned_views"].replace(dtype="float16"))}
    assert not replay.reproduce(spec).ok and replay.reproduce({**spec, "backend": "reference"}).ok


def test_render_command_rewrites_a_moved_report(tmp_path, capsys):
    from conformance.reporting.__main__ import main
    run_dir, report = _failing_report(tmp_path)
    rp.write_json(run_dir / "report.json", report)
    assert main(["render", str(run_dir), "--baseline-backend", "reference"]) == 0
    saved = rp.load(run_dir)
    assert saved["run"]["baseline_backend"] == "reference" and saved["records"][0]["replay"]["artifact"].startswith("failures/")
    assert (run_dir / "index.html").exists() and (run_dir / "summary.md").exists()
    bad = tmp_path / "t.json"
    bad.write_text('{"entries": [{"match": "x"}]}')
    assert main(["render", str(run_dir), "--triage-file", str(bad)]) == 2
    assert "'label'" in capsys.readouterr().err


# -- compare ----------------------------------------------------------------------------------------------
def test_compare_shows_speed_changes_with_speedups_against_the_baseline(tmp_path, capsys):
    old = many_backends(3)
    new = json.loads(json.dumps(old))
    for t in new["timings"]:
        if t["backend"] == "triton-jfa":
            t.update(median_s=t["median_s"] * 0.5, q1_s=t["q1_s"] * 0.5, q3_s=t["q3_s"] * 0.5, tflops=t["tflops"] * 2)
    rp.write_json(tmp_path / "old.json", old)
    rp.write_json(tmp_path / "new.json", new)
    assert cli.main(["compare", str(tmp_path / "old.json"), str(tmp_path / "new.json"),
                     "--baseline-backend", "vendor-kernel-00-long-name"]) == 0
    out = capsys.readouterr().out
    assert "speedups against vendor-kernel-00-long-name" in out
    row = next(line for line in out.splitlines() if "triton-jfa" in line and "dense" in line and "forward" in line)
    assert "-50%" in row and "1.09x -> 2.18x" in row and "faster" in row


# -- layout -----------------------------------------------------------------------------------------------
@pytest.mark.skipif(find_browser() is None, reason="needs Chromium (Debian: apt-get install chromium)")
def test_fifteen_backends_fit_a_1400_px_page(tmp_path):
    page = tmp_path / "index.html"
    page.write_text(render_html(many_backends(15)), encoding="utf-8")
    assert scroll_width(page, 1400) <= 1400
    # the same page with the layout's compact cells taken out overflows: the measurement can fail
    loose = re.sub(r"\.grid[^{]*\{[^}]*\}", "", page.read_text(encoding="utf-8"))
    wide = tmp_path / "loose.html"
    wide.write_text(loose.replace(".scroll{overflow-x:auto;max-width:100%}", ""), encoding="utf-8")
    assert scroll_width(wide, 1400) > 1400


def test_the_committed_example_carries_its_reproducers():
    example = ROOT / "reports" / "examples" / "h200"
    report = rp.load(example)
    failing = [r for r in report["records"] if r["outcome"] in ("fail", "crash", "timeout")]
    assert failing and all(r.get("replay") for r in failing)
    for r in failing:
        entry = r["replay"]
        assert entry["artifact"].startswith("failures/") and (example / entry["artifact"]).is_file()
        assert (example / entry["script"]).is_file() and entry["command"].startswith("jfa-conformance replay failures/")
    causes = {c["id"]: c for c in report["causes"]}
    # the causes say what their problems share, computed from the problems (FINDINGS.md explains them)
    compile_error = next(c for c in causes.values() if c["backend"] == "fa4" and "compile" in (c.get("label") or ""))
    assert compile_error["count"] == 2 and compile_error["shared"][0]["property"] == "head_dim > head_dim_v"
    crash = next(c for c in causes.values() if c["outcome"] == "crash")
    assert crash["backend"] == "flashinfer-cudnn" and crash["shared"][0]["property"] == "every query length 0"
    strided = [c for c in causes.values() if c["backend"] == "flashinfer-fa2" and c["outcome"] == "fail"]
    assert strided and all(c["shared"][0]["property"] == "offsets_layout = strided" for c in strided)


def test_the_check_timeline_draws_each_worker_and_the_warm_up_ends():
    from conformance.reporting import plots
    records = [{"worker": "gw0", "backend": "sdpa", "started_at": 101.0, "duration_s": 4.0},
               {"worker": "gw1", "backend": "fa4", "started_at": 130.0, "duration_s": 9.0},
               {"worker": "gw10", "backend": "fa4", "started_at": 131.0, "duration_s": 2.0},
               {"worker": None, "backend": "fa4", "outcome": "not-run"}]
    phase = {"started_at": 100.0, "wall_s": 45.0}
    svg = plots.check_timeline(records, phase, {"fa4": 29.5})
    assert svg and svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert all(label in svg for label in ("gw0", "gw1", "gw10", "sdpa", "fa4"))  # workers and backends, as text
    assert svg == plots.check_timeline(records, phase, {"fa4": 29.5})  # the same figure, the same bytes
    assert plots.check_timeline(records, None) is None and plots.check_timeline([], phase) is None


def test_a_backend_without_backward_timings_has_no_empty_backward_column():
    report = many_backends(4)
    report["timings"] = [t for t in report["timings"] if not (t["backend"] == "triton-jfa" and t["direction"] == "backward")]
    page, md = render_html(report), render_markdown(report)
    forward_md = md[md.index("**Forward**"):md.index("**Backward**")]
    backward_md = md[md.index("**Backward**"):md.index("<details><summary>Every timing")]
    assert "triton-jfa" in forward_md.splitlines()[2] and "No forward timing" not in forward_md
    assert "No backward timing: triton-jfa." in backward_md and "triton-jfa |" not in backward_md.split("\n| shape |")[1].splitlines()[0]
    assert "No backward timing: triton-jfa." in page


def test_the_performance_note_says_how_the_times_were_taken():
    report = many_backends(4)
    assert "calls back to back (the host's work overlapping" in render_markdown(report)
    for t in report["timings"]:
        del t["calls_per_round"]
    md, page = render_markdown(report), render_html(report)
    assert "one call and a wait for the device per round" in md and "one call and a wait for the device" in page
