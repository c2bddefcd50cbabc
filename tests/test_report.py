"""Report model, gating, compare, merge, rendering and atomic writes, on small hand-made reports."""
from __future__ import annotations

import json
import math
import os
import re

import pytest
import torch

from conformance import benchmarks
from conformance import report as rp
from conformance.problem import Problem
from conformance.recorder import check_identity, problem_from_repr, split_params
from conformance.reporting import render_html, render_markdown


def record(backend, feature, outcome, dtype="float32", budget=0.2, reason=None, **extra):
    return {"id": f"spec::test_{feature}[{backend}-{dtype}]", "backend": backend, "test": f"test_{feature}",
            "feature": feature, "dtype": dtype, "outcome": outcome, "reason": reason, "message": None,
            "verdicts": [], "quantity": "out", "observed_error": None if budget is None else budget * 1e-3,
            "allowed_error": 1e-3,
            "budget_used": budget, "problem": Problem((3, 1), (4, 2), dtype=dtype).summary(),
            "counterexample": None, **extra}


def make_report(records, timings=(), name="r", complete=True):
    backends = {r["backend"]: {"source": r["backend"], "available": True, "reason": None, "capabilities": {}}
                for r in records}
    return {"schema": rp.SCHEMA, "schema_version": rp.SCHEMA_VERSION,
            "run": {"name": name, "profile": "ci", "seed": "derandomized", "complete": complete,
                    "environment": {"torch": "x", "device": "cpu"}},
            "backends": backends, "records": list(records), "timings": list(timings)}


def timing(backend, shape, direction, median):
    return {"backend": backend, "shape": shape, "direction": direction, "median_s": median, "tflops": 1e-3 / median,
            "padding_waste": 0.5, "length_skew": 3.0, "useful_flops": 1e9, "problem": {}}


# -- exit codes -----------------------------------------------------------------------------------------
def test_exit_code_zero_when_every_check_passes_or_is_declared():
    report = make_report([record("a", "forward", "pass"), record("a", "lse", "unsupported", reason="no LSE"),
                          record("a", "gradients", "expected-fail", reason="known bug")])
    assert rp.exit_code(report) == 0


@pytest.mark.parametrize("outcome", ["fail", "crash", "timeout", "not-run"])
def test_exit_code_one_on_any_failure(outcome):
    report = make_report([record("a", "forward", "pass"), record("a", "lse", outcome)])
    assert rp.exit_code(report) == 1


def test_exit_code_one_for_a_backend_that_supports_nothing():
    report = make_report([record("a", "forward", "pass"), record("b", "forward", "unsupported", reason="no")])
    assert rp.summarize_backends(report)["b"]["verdict"] == "supports nothing"
    assert rp.exit_code(report) == 1


def test_exit_code_one_for_an_incomplete_run_or_regressions():
    assert rp.exit_code(make_report([record("a", "forward", "pass")], complete=False)) == 1
    assert rp.exit_code(make_report([record("a", "forward", "pass")]), [{"kind": "timing regression"}]) == 1


# -- compare, baseline gating, merge --------------------------------------------------------------------
def test_compare_lists_new_and_fixed_failures_budget_and_timing_changes():
    old = make_report([record("a", "forward", "pass", budget=0.1), record("a", "lse", "fail")],
                      [timing("a", "dense", "forward", 1.0), timing("a", "dense", "backward", 1.0)])
    new = make_report([record("a", "forward", "crash", budget=0.1), record("a", "lse", "pass", budget=0.5)],
                      [timing("a", "dense", "forward", 1.05), timing("a", "dense", "backward", 1.25)])
    diff = rp.compare(old, new, threshold=0.10)
    assert [(f["feature"], f["before"], f["after"]) for f in diff["new_failures"]] == [("forward", "pass", "crash")]
    assert [(f["feature"], f["after"]) for f in diff["fixed"]] == [("lse", "pass")]
    # 5% slower is inside the 10% threshold; 25% slower is a regression.
    assert [(t["direction"], round(t["change"], 2)) for t in diff["timing_regressions"]] == [("backward", 0.25)]
    assert len(diff["timing_changes"]) == 2
    rows = rp.regressions_of(diff)
    assert [r["kind"] for r in rows] == ["new failure", "timing regression"]
    assert "+25%" in rows[1]["detail"] and "threshold 10%" in rows[1]["detail"]
    assert rp.compare(old, new, threshold=0.30)["timing_regressions"] == []


def spread(row, q1, q3):
    return dict(row, q1_s=q1, q3_s=q3)


def test_a_slowdown_inside_both_runs_spread_is_not_a_regression():
    old = make_report([], [spread(timing("a", "dense", "forward", 1.0), 0.8, 1.3)])
    noisy = make_report([], [spread(timing("a", "dense", "forward", 1.2), 1.1, 1.4)])
    (row,) = rp.compare(old, noisy)["timing_changes"]
    assert not row["regression"] and row["within_spread"] and rp.compare(old, noisy)["timing_regressions"] == []
    # the same median with its rounds clear of the baseline's: a regression
    apart = make_report([], [spread(timing("a", "dense", "forward", 1.2), 1.31, 1.4)])
    (row,) = rp.compare(old, apart)["timing_regressions"]
    assert row["regression"] and not row["within_spread"]
    # rounds apart but inside the threshold: a change only
    assert rp.compare(old, apart, threshold=0.25)["timing_regressions"] == []
    # a baseline without quartiles (older report): the median alone decides
    bare = make_report([], [timing("a", "dense", "forward", 1.0)])
    assert len(rp.compare(bare, noisy)["timing_regressions"]) == 1


def test_timings_keep_the_quartiles_the_gate_needs():
    bench = {"benchmarks": [{"extra_info": {"backend": "a", "shape": "dense", "direction": "forward",
                                            "useful_flops": 1e12, "padding_waste": 0.0, "length_skew": 1.0,
                                            "problem": {}},
                             "stats": {"median": 0.5, "min": 0.4, "q1": 0.45, "q3": 0.55, "rounds": 5}}]}
    (row,) = rp.timings_from_benchmark(bench)
    assert (row["q1_s"], row["q3_s"], row["min_s"], row["rounds"]) == (0.45, 0.55, 0.4, 5)


def test_a_round_of_calls_back_to_back_gives_times_per_call_and_says_where_the_host_bounds_them():
    info = {"backend": "a", "shape": "dense", "direction": "forward", "useful_flops": 1e12, "padding_waste": 0.0,
            "length_skew": 1.0, "problem": {}, "calls_per_round": 20, "latency_s": 0.004}
    stats = {"median": 0.02, "min": 0.018, "q1": 0.019, "q3": 0.021, "rounds": 5}  # a round: 20 calls
    (row,) = rp.timings_from_benchmark({"benchmarks": [{"extra_info": dict(info, host_s=0.0004), "stats": stats}]})
    assert row["median_s"] == pytest.approx(0.001) and row["tflops"] == pytest.approx(1000.0)
    assert (row["min_s"], row["q1_s"], row["q3_s"]) == pytest.approx((0.0009, 0.00095, 0.00105))
    assert row["latency_s"] == 0.004 and row["calls_per_round"] == 20 and not row["host_bound"]
    (row,) = rp.timings_from_benchmark({"benchmarks": [{"extra_info": dict(info, host_s=0.00095), "stats": stats}]})
    assert row["host_bound"]  # the host's 0.95 ms per call is the time per call
    # an older benchmark file (one call per round, no host figure): taken as it is
    old = {k: v for k, v in info.items() if k not in ("calls_per_round", "latency_s")}
    (row,) = rp.timings_from_benchmark({"benchmarks": [{"extra_info": old, "stats": stats}]})
    assert row["median_s"] == 0.02 and row["host_bound"] is False and row["latency_s"] is None


def test_paths_under_home_are_written_from_home(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    assert rp.home_relative("run --report-dir /home/someone/out/r") == "run --report-dir ~/out/r"
    assert rp.home_relative("/home/someoneelse/x") == "/home/someoneelse/x"


def test_a_timing_the_baseline_made_and_this_run_lost_is_gated():
    old = make_report([], [timing("a", "dense", "forward", 1.0), timing("a", "one_long", "forward", 1.0)])
    new = make_report([], [timing("a", "dense", "forward", 1.0)])
    new["timing_gaps"] = [dict(backend="a", shape="one_long", direction="forward", outcome="not timed",
                               message="out of memory on this device (x)"),
                          dict(backend="a", shape="pareto", direction="forward", outcome="failed", message="boom")]
    (lost,) = rp.compare(old, new)["timings_lost"]  # pareto: the baseline has no timing of it to lose
    assert (lost["shape"], lost["outcome"]) == ("one_long", "not timed")
    (row,) = rp.regressions_of(rp.compare(old, new))
    assert row["kind"] == "timing lost" and row["what"] == "a one_long forward"
    assert row["detail"] == "median 1000.000 ms -> not timed: out of memory on this device (x)"
    assert rp.regressions_of(rp.compare(old, make_report([], old["timings"]))) == []


def test_a_timing_taken_another_way_is_not_gated():
    # a report from before rounds held several calls (one call and a wait) against one with calls back to
    # back: the host's share differs, not the backend's speed
    old = make_report([], [timing("a", "dense", "forward", 1.0)])
    new = make_report([], [dict(timing("a", "dense", "forward", 2.0), calls_per_round=20)])
    (row,) = rp.compare(old, new)["timing_changes"]
    assert row["method_changed"] and not row["regression"] and not row["within_spread"]
    assert rp.compare(old, new)["timing_regressions"] == []
    same = make_report([], [dict(timing("a", "dense", "forward", 1.0), calls_per_round=19)])
    (row,) = rp.compare(same, new)["timing_changes"]
    assert not row["method_changed"] and row["regression"]  # both back to back (19 and 20 calls): gated


def test_a_gpu_round_holds_about_twenty_milliseconds_of_calls():
    assert benchmarks.calls_per_round(0.001, "cuda") == 20
    assert benchmarks.calls_per_round(0.00001, "cuda:1") == benchmarks.MAX_CALLS
    assert benchmarks.calls_per_round(0.5, "cuda") == 1
    assert benchmarks.calls_per_round(0.001, "cpu") == 1  # a CPU call returns when its work is done


def test_merge_keeps_every_shard_and_the_worst_outcome_of_a_repeated_check():
    shard_a = make_report([record("a", "forward", "pass"), record("a", "lse", "pass")], name="gpu0")
    shard_b = make_report([record("b", "forward", "pass"), record("a", "lse", "timeout")],
                          [timing("b", "dense", "forward", 0.1)], name="gpu1")
    merged = rp.merge([shard_a, shard_b], name="all")
    outcomes = {(r["backend"], r["feature"]): r["outcome"] for r in merged["records"]}
    assert outcomes == {("a", "forward"): "pass", ("a", "lse"): "timeout", ("b", "forward"): "pass"}
    assert [s["name"] for s in merged["run"]["shards"]] == ["gpu0", "gpu1"]
    assert "Merged from `gpu0`" in render_markdown(merged) and "`gpu1`" in render_markdown(merged)
    assert set(merged["backends"]) == {"a", "b"} and len(merged["timings"]) == 1
    assert rp.exit_code(merged) == 1
    # the shards' common seed is the merged run's; shards drawn from other seeds say so
    assert merged["run"]["seed"] == "derandomized" and "seed `derandomized`" in render_markdown(merged)
    shard_b["run"]["seed"] = 7
    assert rp.merge([shard_a, shard_b])["run"]["seed"] == "mixed"
    # a timing one shard could not make stays a gap only where no other shard made it
    gap = dict(backend="b", shape="dense", direction="forward", outcome="not timed", message="out of memory (x)")
    other = dict(gap, shape="one_long")
    shard_a["timing_gaps"] = [gap, other]
    assert rp.merge([shard_a, shard_b])["timing_gaps"] == [other]


def test_merge_completes_a_cut_short_shard_with_a_rerun():
    cut_short = make_report([record("a", "forward", "pass"), record("a", "lse", "not-run"),
                             record("a", "gradients", "not-run")], name="first")
    rerun = make_report([record("a", "forward", "fail"), record("a", "lse", "pass"),
                         record("a", "gradients", "not-run")], name="rerun")
    merged = rp.merge([cut_short, rerun])
    outcomes = {r["feature"]: r["outcome"] for r in merged["records"]}
    # a check that ran outranks not-run; among shards that ran it, the worst outcome stays
    assert outcomes == {"forward": "fail", "lse": "pass", "gradients": "not-run"}
    assert not merged["run"]["complete"]
    finished = make_report([record("a", "gradients", "pass")], name="last")
    assert rp.merge([cut_short, rerun, finished])["run"]["complete"]


def test_load_rejects_files_that_are_not_reports(tmp_path):
    (tmp_path / "x.json").write_text("{\"hello\": 1}")
    with pytest.raises(rp.ReportError, match="schema"):
        rp.load(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("{not json")
    with pytest.raises(rp.ReportError, match="not valid JSON"):
        rp.load(tmp_path / "y.json")
    with pytest.raises(rp.ReportError, match="no such report"):
        rp.load(tmp_path / "missing.json")


# -- streams and timings --------------------------------------------------------------------------------
def test_record_stream_ignores_a_torn_last_line_and_completes_missing_checks(tmp_path):
    path = tmp_path / "records.jsonl"
    collected = [{"id": "t::f[a]", "backend": "a", "feature": "forward"}, {"id": "t::g[a]", "backend": "a", "feature": "lse"}]
    lines = [json.dumps({"kind": "collected", "checks": collected}),
             json.dumps({"kind": "record", **record("a", "forward", "pass", id="t::f[a]")})]
    path.write_text("\n".join(lines) + '\n{"kind": "record", "id": "t::g[a]", "outc')
    checks, records, finished = rp.read_record_stream(path)
    assert len(checks) == 2 and len(records) == 1 and not finished
    completed = rp.complete_records(checks, records, "never ran: interrupted")
    assert [r["outcome"] for r in completed] == ["pass", "not-run"]


def test_a_run_stopped_after_its_last_verdict_is_complete_and_says_it_stopped():
    collected = [{"id": "t::f[a]", "backend": "a", "feature": "forward"}]
    judged = rp.complete_records(collected, [record("a", "forward", "pass", id="t::f[a]")], "never ran: x", stopped=True)
    unjudged = rp.complete_records(collected, [], "never ran: the run reached its --time-limit", stopped=True)
    # pytest had not closed its session (no "finished" line) when the time limit came, after the last verdict
    assert rp.verdicts_complete(collected, judged, finished=False)
    assert not rp.verdicts_complete(collected, unjudged, finished=False)
    assert not rp.verdicts_complete([], [], finished=False)  # nothing collected, nothing known
    report = make_report(judged)
    report["run"]["stopped"] = "the run reached its --time-limit"
    text = render_markdown(report)
    assert "did not finish" not in text and "after every check had its verdict" in text
    assert rp.exit_code(report) == 0
    report["run"]["complete"] = False
    assert "did not finish" in render_markdown(report) and rp.exit_code(report) == 1


def test_timings_count_useful_flops_only():
    causal = Problem((4, 2), (4, 2), heads_q=2, heads_kv=2, head_dim=8, causal="bottom_right")
    # visible pairs: 4+3+2+1 = 10 and 2+1 = 3 -> 13; forward = 4 * 13 * D * Hq
    assert benchmarks.useful_flops(causal, "forward") == 4 * 13 * 8 * 2
    assert benchmarks.useful_flops(causal, "backward") == 2.5 * 4 * 13 * 8 * 2
    # padded [2, 4] causal layout: 2 * 10 pairs, 13 of them useful
    assert benchmarks.padding_waste(causal) == pytest.approx(1 - 13 / 20)
    assert benchmarks.length_skew(Problem((1, 1, 1, 5), (1, 1, 1, 5))) == pytest.approx(2.5)
    bench = {"benchmarks": [{"extra_info": {"backend": "a", "shape": "s", "direction": "forward", "useful_flops": 2e12,
                                            "padding_waste": 0.1, "length_skew": 1.0, "problem": {}},
                             "stats": {"median": 0.5, "min": 0.4, "rounds": 3}}]}
    (row,) = rp.timings_from_benchmark(bench)
    assert row["tflops"] == pytest.approx(4.0) and row["median_s"] == 0.5


# -- parsing helpers of the recorder --------------------------------------------------------------------
def test_counterexample_problem_round_trips_through_its_repr():
    problem = Problem((3, 0), (5, 2), heads_q=4, heads_kv=2, head_dim=32, dtype="bfloat16", causal="bottom_right",
                      scale=0.25, seed=11, length_law="pareto")
    assert problem_from_repr(repr(problem)) == problem
    printed = "Problem(seqlens_q=(1,),\n seqlens_k=(1,),\n head_dim=16,\n dtype='float32',\n causal='none')"
    assert problem_from_repr(printed) == Problem((1,), (1,), head_dim=16)
    assert problem_from_repr("os.system('x')") is None


def test_node_ids_split_into_backend_and_feature_even_with_dashed_names():
    assert split_params("reference-online-tile_edges-float16", {"reference", "reference-online"}) == \
        ("reference-online", "tile_edges-float16")
    ident = check_identity("conformance/spec/test_edge_cases.py::test_edge_case[reference-online-tile_edges-bfloat16]",
                           {"reference", "reference-online"})
    assert ident == {"backend": "reference-online", "test": "test_edge_case", "feature": "edge_case:tile_edges",
                     "dtype": "bfloat16"}


# -- rendering ------------------------------------------------------------------------------------------
def test_html_is_self_contained_and_shows_matrix_reasons_failures_and_plots():
    failing = record("b", "forward", "fail", budget=math.inf, reason="out: observed error inf",
                     counterexample="Problem(seqlens_q=[1], seqlens_k=[1], dtype='float32', causal='none')",
                     replay={"artifact": "f/1.pt", "command": "jfa-conformance replay f/1.pt --backend b"})
    report = make_report([record("a", "forward", "pass"), record("a", "lse", "unsupported", budget=None, reason="no LSE here"),
                          failing, record("b", "lse", "crash", reason="device error: CUDA error")],
                         [spread(timing("a", "dense", "forward", 0.01), 0.009, 0.0125),
                          timing("a", "skewed", "forward", 0.02)])
    page = render_html(report)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "the page must not load anything from the network"
    assert page.count('<figure class="plot" role="img"') == 2 and page.count("<svg") == 2
    assert "base64" not in page  # the plots are inline SVG: no encoded binary in the page
    assert 'title="float32 — unsupported — no LSE here"' in page
    assert "FAILED" in page and "jfa-conformance replay f/1.pt --backend b" in page
    assert "Problem(seqlens_q=[1]" in page and "class=\"o-crash\"" in page
    md = render_markdown(report)
    assert "❌ FAIL" in md and "replay: `jfa-conformance replay f/1.pt --backend b`" in md
    assert "| b | failing |" in md
    # the rounds' spread beside the median (the baseline gate compares it); '-' where a row has none
    assert "| a | dense | forward | 10.000 | 9.000–12.500 |" in md and "| a | skewed | forward | 20.000 | - |" in md
    assert "9.000–12.500" in page


# -- atomic writes --------------------------------------------------------------------------------------
def test_a_write_interrupted_before_the_rename_leaves_the_old_report_intact(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    rp.write_json(path, {"version": "old"})

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # what a Ctrl-C or a kill between write and rename looks like to Python

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        rp.write_json(path, {"version": "new", "records": ["x"] * 10000})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"version": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"], "no temporary file is left behind"
    rp.write_json(path, {"version": "new"})
    assert json.loads(path.read_text()) == {"version": "new"}
    assert oct(path.stat().st_mode & 0o777) != oct(0o600)


def test_matrix_cells_show_the_worst_outcome_and_partial_support():
    labels = {o: o for o in rp.OUTCOMES}
    mixed = [record("a", "edge", "pass", dtype="float32"), record("a", "edge", "unsupported", dtype="bfloat16")]
    assert rp.cell_label(mixed, labels) == "pass 1/2"
    failing = [record("a", "edge", "pass"), record("a", "edge", "crash"), record("a", "edge", "crash")]
    assert rp.cell_label(failing, labels) == "crash 2/3"
    assert rp.cell_label([record("a", "edge", "fail")] * 3, labels) == "fail 3/3"
    assert rp.cell_label([record("a", "edge", "unsupported")] * 3, labels) == "unsupported"
    assert rp.cell_label([record("a", "edge", "pass")] * 3, labels) == "pass"


def test_unrun_checks_are_listed_apart_from_the_failures():
    report = make_report([record("a", "forward", "fail", reason="wrong"),
                          record("a", "lse", "not-run", reason="never ran: the run reached its --time-limit"),
                          {**record("b", "gradients", "not-run", reason="never ran: the run reached its --time-limit"),
                           "dtype": None}],
                         complete=False)
    md = render_markdown(report)
    failures_part, unrun_part = md.split("## Failures (1)")[1].split("## Not run (2)")
    assert "forward" in failures_part and "lse" not in failures_part and "gradients" not in failures_part
    assert "- **a**: lse [float32]" in unrun_part and "- **b**: gradients" in unrun_part
    assert "--time-limit" in unrun_part
    page = render_html(report)
    assert "Failures by cause (1 cause, 1 check)" in page and "Not run (2)" in page


def test_the_summary_says_when_the_code_that_ran_was_not_its_commit():
    rep = make_report([record("a", "forward", "pass")])
    rep["run"]["environment"].update(git_commit="0123456789abcdef", git_dirty=False)
    assert "commit `0123456789ab`" in render_markdown(rep) and "uncommitted" not in render_markdown(rep)
    rep["run"]["environment"]["git_dirty"] = True
    assert "commit `0123456789ab` with uncommitted changes" in render_markdown(rep)



def test_the_check_phase_says_where_its_wall_time_went():
    records = [{"worker": "gw0", "started_at": 105.0, "duration_s": 20.0},
               {"worker": "gw1", "started_at": 110.0, "duration_s": 30.0},
               {"worker": "gw2", "started_at": 150.0, "duration_s": 10.0},  # a replacement worker
               {"worker": None, "outcome": "not-run"}]
    phase = rp.check_phase(records, started_at=100.0, wall_s=100.0, workers=2)
    assert phase == {"started_at": 100.0, "wall_s": 100.0, "workers": 2, "busy_s": 60.0, "busy_share": 0.3, "worker_processes": 3,
                     "before_first_check_s": 5.0, "after_last_check_s": 40.0}
    text = rp.check_phase_text(phase)
    assert "30% of it busy" in text and "after 5 s" in text and "3 worker processes" in text
    assert rp.check_phase_text(None) is None and rp.check_phase([], 0.0, 0.0, 4)["busy_share"] is None


def test_node_ids_of_a_backend_given_by_file_parse_to_its_own_name(tmp_path):
    from conformance.recorder import _known_backend_names, check_identity
    path = tmp_path / "mine.py"
    path.write_text("from conformance.reference import Reference\n\n"
                    "class Mine(Reference):\n    name = 'my-kernel'\n")

    class Config:
        def getoption(self, name, default=None):
            return [f"{path}:Mine"] if name == "backend" else default
    names = _known_backend_names(Config())
    assert "my-kernel" in names
    identity = check_identity("conformance/spec/test_edge_cases.py::test_edge_case[my-kernel-single_token-float16]",
                              names)
    assert identity == {"backend": "my-kernel", "test": "test_edge_case", "feature": "edge_case:single_token",
                        "dtype": "float16"}


def test_timings_run_shape_by_shape_so_a_stopped_session_keeps_whole_rows():
    import subprocess
    import sys
    bench = os.path.join(os.path.dirname(benchmarks.__file__), "benchmarks.py")
    proc = subprocess.run([sys.executable, "-m", "pytest", bench, "-p", "conformance.plugin", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "--device", "cpu", "--backend", "sdpa", "--backend", "reference"],
                          capture_output=True, text=True, timeout=300)
    ids = [line.split("[", 1)[1].rstrip("]") for line in proc.stdout.splitlines() if "test_timing[" in line]
    assert len(ids) == 2 * 2 * len(benchmarks.SHAPES), proc.stdout + proc.stderr
    rows = [tuple(i.split("-", 1)[1].rsplit("-", 1)) for i in ids]  # (shape, direction), backend dropped
    assert rows[:4] == [("dense", "forward")] * 2 + [("dense", "backward")] * 2
    assert [r[0] for r in rows[::4]] == list(benchmarks.SHAPES)
    assert [i.split("-", 1)[0] for i in ids[:2]] == ["sdpa", "reference"]  # the order the backends were named


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_timings_prelude_meets_every_kernel_configuration_the_timings_use(device):
    from conformance.configs import KernelConfig
    timed = {KernelConfig.of(p) for p in benchmarks.shapes(device).values()}
    assert {KernelConfig.of(p) for p in benchmarks.prelude_shapes(device)} == timed
    assert len(benchmarks.prelude_shapes(device)) == len(timed) < len(benchmarks.shapes(device))


def test_timings_draw_each_shape_once_and_hand_every_backend_its_own_copy():
    from conformance.problem import make_grad_out, make_inputs
    problem = benchmarks.shapes("cpu")["uniform"]
    benchmarks._drawn.cache_clear()
    (a, ga), (b, gb) = benchmarks.fresh_inputs(problem, "cpu"), benchmarks.fresh_inputs(problem, "cpu")
    assert benchmarks._drawn.cache_info().misses == 1  # drawn once, not per backend and direction
    want, want_g = make_inputs(problem, "cpu"), make_grad_out(problem, "cpu")
    for name in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"):
        x, y = getattr(a, name), getattr(b, name)
        assert torch.equal(x, getattr(want, name)) and x.data_ptr() != y.data_ptr()  # the same numbers, apart
    assert torch.equal(ga, want_g) and ga.data_ptr() != gb.data_ptr()
    a.q.add_(1)  # a backend writing into its inputs reaches no other timing
    assert torch.equal(benchmarks.fresh_inputs(problem, "cpu")[0].q, want.q)
    assert (a.max_seqlen_q, a.causal, a.softmax_scale) == (want.max_seqlen_q, want.causal, want.softmax_scale)


def test_a_run_whose_every_timing_is_a_gap_still_says_why():
    report = make_report([record("a", "forward", "pass")])
    report["run"].update(benchmarks="ok", timed_backends=["a"])
    report["timing_gaps"] = [dict(backend="a", shape="one_long", direction="forward", outcome="not timed",
                                  message="out of memory on this device (x)")]
    text = render_markdown(report)
    assert "## Performance" in text and "a: not timed on one_long forward: out of memory on this device (x)" in text
