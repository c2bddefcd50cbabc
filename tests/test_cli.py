"""`jfa-conformance`: list, run (report files, exit codes, --baseline, --bench, --gpus pinning), compare,
merge, and the delegated selftest/replay commands. Runs are kept tiny (-k, --max-examples 1)."""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from conformance import registry
from conformance import cli
from conformance import pytest_session
from conformance import report as rp

TOY_BACKENDS = textwrap.dedent('''
    import os
    import torch
    from conformance.reference import Reference
    from conformance.problem import Output

    class BreakableReference(Reference):
        """The oracle, or NaN everywhere when JFA_TEST_BREAK=1 (the child pytest inherits the variable)."""
        name = "breakable"
        def forward(self, args):
            result = super().forward(args)
            if os.environ.get("JFA_TEST_BREAK") == "1":
                return Output(torch.full_like(result.out, float("nan")), result.lse)
            return result

    class SupportsNothing(Reference):
        name = "supports-nothing"
        def not_supported_reasons(self, problem):
            return ["this toy backend supports no problem at all"]
''')
QUICK = ["--max-examples", "1", "-q", "-n", "1"]


@pytest.fixture
def toy(tmp_path):
    path = tmp_path / "toy_backends.py"
    path.write_text(TOY_BACKENDS)
    return path


def run(tmp_path, *args) -> tuple[int, dict | None]:
    code = cli.main(["run", "--report-dir", str(tmp_path / "reports"), *QUICK, *args])
    name = args[args.index("--name") + 1]
    path = tmp_path / "reports" / name / "report.json"
    return code, (json.loads(path.read_text()) if path.exists() else None)


# -- list -----------------------------------------------------------------------------------------------
def test_list_shows_every_known_backend_with_availability_capabilities_and_reasons(monkeypatch, capsys):
    entry_point = importlib.metadata.EntryPoint(name="plugin-reference", value="conformance.reference:Reference",
                                                group=registry.ENTRY_POINT_GROUP)
    installed = registry._entry_points()
    monkeypatch.setattr(registry, "_entry_points", lambda: {**installed, "plugin-reference": entry_point})
    assert cli.main(["list", "--device", "cpu", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(registry.BUILTIN) <= set(rows)
    assert rows["plugin-reference"]["available"] and rows["plugin-reference"]["source"] == "conformance.reference:Reference"
    assert rows["reference"]["available"] and "float16" in rows["reference"]["capabilities"]["dtypes"]
    unavailable = [row for row in rows.values() if not row["available"]]
    assert unavailable and all(row["reason"] for row in unavailable)
    assert cli.main(["list", "--device", "cpu"]) == 0
    table = capsys.readouterr().out
    assert "plugin-reference" in table and "runs on cuda, not on cpu" in table


def test_python_dash_m_conformance_is_the_same_command():
    result = subprocess.run([sys.executable, "-m", "conformance", "list", "--device", "cpu", "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "reference" in {row["name"] for row in json.loads(result.stdout)}


# -- usage errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, field", [
    (["run", "--backend", "no-such-backend"], "--backend"),
    (["run", "--backend", "missing_file.py:attention"], "--backend"),
    (["run", "--backend", "no_such_package.module:attention"], "--backend"),
    (["run", "--dtype", "float8"], "--dtype"),
    (["run", "--profile", "no-such-profile"], "--profile"),
    (["run", "--baseline", "no/such/report.json"], "--baseline"),
    (["run", "--xfails-file", "no/such/file"], "--xfails-file"),
    (["run", "--gpus", "first"], "--gpus"),
    (["compare", "no/such/a.json", "no/such/b.json"], "no such report"),
])
def test_usage_errors_exit_2_and_name_the_option(args, field, capsys, tmp_path):
    assert cli.main([*args, "--report-dir", str(tmp_path)] if args[0] == "run" else args) == 2
    assert field in capsys.readouterr().err


def test_argparse_errors_and_no_command_exit_2():
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--max-examples", "zero"])
    assert exc.value.code == 2
    assert cli.main([]) == 2


# -- run ------------------------------------------------------------------------------------------------
def test_run_writes_the_report_files_and_exits_0_when_everything_passes(tmp_path):
    code, report = run(tmp_path, "--backend", "reference", "-k", "test_forward or empty_batch", "--name", "ok")
    assert code == 0
    run_dir = tmp_path / "reports" / "ok"
    assert {"report.json", "summary.md", "index.html", "junit.xml"} <= {p.name for p in run_dir.iterdir()}
    assert report["schema"] == rp.SCHEMA and report["schema_version"] == rp.SCHEMA_VERSION
    assert report["run"]["profile"] == "ci" and report["run"]["complete"]
    assert report["run"]["command"].startswith("jfa-conformance run ")
    env = report["run"]["environment"]
    assert env["torch"] and env["device"] == "cpu" and "hostname" not in json.dumps(report["run"]).lower()
    by_feature = {(r["feature"], r["dtype"]): r for r in report["records"]}
    assert {r["outcome"] for r in report["records"]} == {"pass"}
    forward = by_feature["forward", None]
    assert forward["budget_used"] < 1 and forward["observed_error"] <= forward["allowed_error"]
    for key in ("batch", "length_law", "Lq_max", "Lk_mean", "heads_q", "head_dim", "dtype", "causal", "broadcast_q"):
        assert key in forward["problem"]
    assert ("edge_case:empty_batch", "bfloat16") in by_feature
    assert "<testsuite" in (run_dir / "junit.xml").read_text()


def test_run_exits_1_on_a_failure_and_lists_it_with_its_counterexample(tmp_path, toy, capsys, monkeypatch):
    monkeypatch.setenv("JFA_TEST_BREAK", "1")
    code, report = run(tmp_path, "--backend", f"{toy}:BreakableReference", "-k", "test_forward", "--name", "nan",
                       "--max-examples", "3")
    # (run() passes --max-examples 1 first; the later value wins in argparse)
    assert code == 1
    (failure,) = rp.failures(report)
    assert failure["backend"] == "breakable" and failure["outcome"] == "fail"
    assert failure["counterexample"].startswith("Problem(") and failure["budget_used"] == float("inf")
    out = capsys.readouterr().out
    assert "FAIL" in out and "counterexample: Problem(" in out
    assert "❌ FAIL" in (tmp_path / "reports" / "nan" / "summary.md").read_text()


@pytest.fixture(autouse=True)
def _no_break(monkeypatch):
    monkeypatch.delenv("JFA_TEST_BREAK", raising=False)


def test_run_exits_1_for_a_backend_that_supports_nothing(tmp_path, toy):
    code, report = run(tmp_path, "--backend", f"{toy}:SupportsNothing", "--backend", "reference",
                       "-k", "test_forward or empty_batch", "--name", "nothing")
    assert code == 1
    summary = report["summary"]
    assert summary["supports-nothing"]["verdict"] == "supports nothing"
    assert summary["reference"]["verdict"] == "conformant"
    reasons = {r["reason"] for r in report["records"] if r["backend"] == "supports-nothing"}
    assert any("supports no problem at all" in reason for reason in reasons)


def test_baseline_gating_lists_new_failures(tmp_path, toy, monkeypatch):
    args = ["--backend", f"{toy}:BreakableReference", "-k", "test_lse or single_token"]
    code, _ = run(tmp_path, *args, "--name", "before")
    assert code == 0
    monkeypatch.setenv("JFA_TEST_BREAK", "1")
    baseline = str(tmp_path / "reports" / "before" / "report.json")
    code, report = run(tmp_path, *args, "--name", "after", "--baseline", baseline)
    assert code == 1
    regressions = report["baseline"]["regressions"]
    assert regressions and {r["kind"] for r in regressions} == {"new failure"}
    assert any("single_token" in r["what"] for r in regressions)
    assert "Regressions against the baseline" in (tmp_path / "reports" / "after" / "summary.md").read_text()


def test_bench_times_forward_and_backward_and_gates_timing_regressions(tmp_path):
    code, report = run(tmp_path, "--backend", "reference", "-k", "empty_batch and float32", "--bench", "--name", "b1")
    assert code == 0
    timings = report["timings"]
    assert {t["direction"] for t in timings} == {"forward", "backward"}
    assert all(t["median_s"] > 0 and t["tflops"] > 0 and 0 <= t["padding_waste"] < 1 for t in timings)
    assert all(t["min_s"] <= t["q1_s"] <= t["median_s"] <= t["q3_s"] for t in timings)  # what the gate compares
    # on the CPU a round is one call; its latency and host time are measured beside it
    assert all(t["calls_per_round"] == 1 and t["latency_s"] > 0 and t["host_s"] > 0 for t in timings)
    assert (tmp_path / "reports" / "b1" / "benchmark.json").exists()
    assert report["run"]["timed_backends"] == ["reference"]  # what the report's "not timed" note is read against
    # A baseline whose every round took half this run's fastest one (so the rounds lie apart, however
    # noisy this run was): every timing is a regression beyond the 10% threshold.
    faster = dict(report, timings=[dict(t, **dict.fromkeys(("median_s", "min_s", "q1_s", "q3_s"), t["min_s"] / 2))
                                   for t in timings])
    rp.write_json(tmp_path / "fast.json", faster)
    assert cli.main(["compare", str(tmp_path / "fast.json"), str(tmp_path / "reports" / "b1")]) == 1
    assert cli.main(["compare", str(tmp_path / "reports" / "b1"), str(tmp_path / "reports" / "b1")]) == 0
    regressions = rp.regressions_of(rp.compare(faster, report, threshold=0.10))
    assert len(regressions) == len(timings) and all(r["kind"] == "timing regression" for r in regressions)


def test_list_says_why_only_the_references_are_known(monkeypatch, capsys):
    assert registry.registration_note() is None  # this project is installed: its adapters are registered
    monkeypatch.setattr(registry, "_entry_points", lambda: {})
    assert cli.main(["list", "--device", "cpu"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "reference" in out and "no installed package registers a backend" in out and "pip install -e ." in out


def test_benchmarks_keep_to_the_time_limit_and_time_kernels_not_oracles(tmp_path):
    from rich.console import Console
    ns = cli.build_parser().parse_args(["run", "--bench"])
    chosen = [(name, registry.describe(name, "cpu")) for name in ("reference", "sdpa")]
    assert pytest_session.timed_specs(ns.backend, chosen) == ["sdpa"]  # references: oracles, timed when named
    named = cli.build_parser().parse_args(["run", "--bench", "--backend", "reference", "--backend", "sdpa"])
    assert pytest_session.timed_specs(named.backend, chosen) == ["reference", "sdpa"]
    # past the run's deadline the benchmark session is stopped, and the status says so
    import threading
    warm_up_over = threading.Event()
    session = pytest_session.BenchmarkSession(tmp_path, ["reference"], "cpu", dict(os.environ), 60,
                                              after=warm_up_over.wait)
    threading.Timer(0.2, warm_up_over.set).start()
    timings, status, gaps, phase = session.finish(Console(quiet=True), deadline=time.monotonic() - 1)
    assert session.proc is None  # cancelled before it started
    assert timings == [] and gaps == [] and phase is None and "stopped: the run reached its --time-limit" in status


def test_a_timing_the_device_cannot_hold_is_named_with_its_reason_and_the_others_are_kept(tmp_path, misbehaving):
    # out of device memory on the two causal shapes (both directions): those four are not timed, each named in
    # the report with the reason, the backend's other timings kept, and the session is not a failure
    code, report = run(tmp_path, "--backend", f"{misbehaving}:OutOfMemoryOnLong", "-k", "empty_batch and float32",
                       "--bench", "--name", "oom")
    assert code == 0, report and report["run"]
    assert report["run"]["benchmarks"] == "ok"
    gaps = report["timing_gaps"]
    assert {(g["shape"], g["direction"]) for g in gaps} == {(s, d) for s in ("uniform_causal", "one_long")
                                                           for d in ("forward", "backward")}
    assert all(g["backend"] == "oom-on-long" and g["outcome"] == "not timed" for g in gaps)
    assert all(g["message"].startswith("out of memory on this device (CUDA out of memory. Tried to allocate 32.00 GiB")
               and "Including" not in g["message"] for g in gaps)
    assert {(t["shape"], t["direction"]) for t in report["timings"]} == {
        (s, d) for s in ("dense", "uniform", "pareto") for d in ("forward", "backward")}
    summary = " ".join((tmp_path / "reports" / "oom" / "summary.md").read_text().split())
    assert "oom-on-long: not timed on uniform_causal forward, uniform_causal backward, one_long forward, one_long" \
           " backward: out of memory on this device" in summary
    # the tables' cells say so too, not blank; the page gives the reason on the cell
    assert summary.count("| *not timed* |") == 4  # one_long and uniform_causal, each direction: its one column
    page = (tmp_path / "reports" / "oom" / "index.html").read_text()
    assert page.count("<td class='gap' title='out of memory on this device (CUDA out of memory.") == 4
    # the timing phase says where its time went, in the report, the summary and the page; its session started
    # beside the checks and made each backend's first call there
    phase = report["run"]["timing_phase"]
    assert phase["timings"] == 10 and 0 < phase["timings_s"] <= phase["wall_s"]
    assert "Timings: " in summary and "outside them" in summary and "Timings: " in page
    beside = phase["beside_checks"]
    assert set(beside["prelude_s"]) == {"oom-on-long"} and beside["ready_s"] > 0 and beside["waited_s"] >= 0
    assert "started beside the checks" in summary
    assert not list((tmp_path / "reports" / "oom").glob(".timings-*"))


def test_a_backend_that_hangs_in_the_timings_prelude_costs_one_timeout(tmp_path, misbehaving):
    # the prelude's first call hangs: the session ends after --timeout, as a timing that hangs ends it, and the
    # run reports that the timings did not complete; the log names the call
    started = time.monotonic()
    code, report = run(tmp_path, "--backend", f"{misbehaving}:Hangs", "--bench", "--timeout", "5",
                       "-k", "single_token and float32", "--name", "hung")
    assert time.monotonic() - started < 90
    assert report["timings"] == [] and report["run"]["benchmarks"].startswith("benchmarks did not complete")
    assert "prelude: hangs on dense lengths" in (tmp_path / "reports" / "hung" / "benchmarks.log").read_text()


def test_the_timing_session_waits_for_the_warm_up_and_runs_without_the_checks_memory_share(tmp_path):
    import threading
    from conformance.containment import MEMORY_SHARE_ENV
    warm_up_over = threading.Event()
    session = pytest_session.BenchmarkSession(tmp_path, ["reference"], "cpu", {MEMORY_SHARE_ENV: "0.2", "KEEP": "1"},
                                              10, after=warm_up_over.wait)
    assert MEMORY_SHARE_ENV not in session.env and session.env["KEEP"] == "1"
    time.sleep(0.3)
    assert session.proc is None  # nothing starts before the warm-up has ended
    threading.Timer(0.2, warm_up_over.set).start()
    session.cancel()  # the run ended meanwhile: the session never starts, and leaves nothing behind
    assert session.proc is None and not list(tmp_path.glob(".timings-*"))


def test_timing_gaps_are_failures_and_reasoned_skips_not_unsupported_shapes(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="b" name="test_timing[sdpa-cudnn-one_long-backward]" time="1">'
        '<failure message="RuntimeError: cuDNN error&#10;second line">trace</failure></testcase>'
        '<testcase classname="b" name="test_timing[sdpa-one_long-forward]" time="1">'
        '<skipped type="pytest.skip" message="not timed: out of memory on this device (x)">s</skipped></testcase>'
        '<testcase classname="b" name="test_timing[fa4-pareto-forward]" time="1">'
        '<skipped type="pytest.skip" message="unsupported: head dim">s</skipped></testcase>'
        '<testcase classname="b" name="test_timing[fa4-dense-forward]" time="1"/>'
        '</testsuite></testsuites>')
    assert pytest_session.timing_gaps(junit) == [
        {"backend": "sdpa-cudnn", "shape": "one_long", "direction": "backward", "outcome": "failed",
         "message": "RuntimeError: cuDNN error"},
        {"backend": "sdpa", "shape": "one_long", "direction": "forward", "outcome": "not timed",
         "message": "out of memory on this device (x)"}]
    assert pytest_session.timing_gaps(tmp_path / "missing.xml") == []
    # where the session's time went: its timings' seconds, the rest outside them, the slowest named
    phase = pytest_session.timing_phase(junit, 10.0)
    assert phase["timings"] == 4 and phase["timings_s"] == 4.0 and phase["outside_timings_s"] == 6.0
    assert len(phase["slowest"]) == 4 and {t["backend"] for t in phase["slowest"]} == {"sdpa-cudnn", "sdpa", "fa4"}
    text = rp.timing_phase_text(phase)
    assert text.startswith("timings: 10 s wall, 4 s of it in 4 timings") and "6 s outside them" in text
    assert rp.timing_phase_text(None) is None


def test_gpus_pins_one_worker_per_device_and_records_the_index(tmp_path):
    # CPU stand-in for a 2-GPU host: the device stays cpu, the pinning (one xdist worker per listed index,
    # kept across worker restarts) is what is tested.
    code, report = run(tmp_path, "--backend", "reference", "--device", "cpu", "--gpus", "0,1",
                       "-k", "empty_batch or single_token or test_forward", "--name", "pinned")
    assert code == 0
    assert report["run"]["workers"] == 2
    assert {r["device_index"] for r in report["records"]} == {0, 1}


# -- compare and merge ----------------------------------------------------------------------------------
def _shard(tmp_path, name, backend, outcome):
    rec = {"id": f"t::test_forward[{backend}]", "backend": backend, "feature": "forward", "dtype": None,
           "outcome": outcome, "reason": None, "budget_used": 0.3, "verdicts": [], "problem": None,
           "counterexample": None}
    report = {"schema": rp.SCHEMA, "schema_version": rp.SCHEMA_VERSION,
              "run": {"name": name, "profile": "ci", "complete": True, "environment": {}},
              "backends": {backend: {"source": backend, "available": True, "reason": None, "capabilities": {}}},
              "records": [rec], "timings": []}
    path = tmp_path / f"{name}.json"
    rp.write_json(path, report)
    return path


def test_merge_makes_one_report_from_shards(tmp_path, capsys):
    a, b = _shard(tmp_path, "gpu0", "x", "pass"), _shard(tmp_path, "gpu1", "y", "pass")
    assert cli.main(["merge", str(a), str(b), "-o", str(tmp_path / "merged"), "--name", "all"]) == 0
    merged = rp.load(tmp_path / "merged")
    assert {r["backend"] for r in merged["records"]} == {"x", "y"}
    assert [s["name"] for s in merged["run"]["shards"]] == ["gpu0", "gpu1"]
    assert (tmp_path / "merged" / "index.html").exists()
    c = _shard(tmp_path, "gpu2", "z", "crash")
    assert cli.main(["merge", str(a), str(c), "-o", str(tmp_path / "merged2")]) == 1
    assert cli.main(["merge", str(a), str(tmp_path / "nothing.json")]) == 2


def test_compare_prints_new_failures_and_exits_1(tmp_path, capsys):
    old, new = _shard(tmp_path, "old", "x", "pass"), _shard(tmp_path, "new", "x", "timeout")
    assert cli.main(["compare", str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert "New failures (1)" in out and "x forward" in out and "pass -> timeout" in out
    assert cli.main(["compare", str(new), str(old), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fixed"][0]["after"] == "pass"


def test_compare_gates_a_timing_the_new_run_lost(tmp_path, capsys):
    old, new = _shard(tmp_path, "old", "x", "pass"), _shard(tmp_path, "new", "x", "pass")
    made = {"backend": "x", "shape": "one_long", "direction": "forward", "median_s": 0.002, "tflops": 1.0}
    rp.write_json(old, dict(rp.load(old), timings=[made]))
    gap = {"backend": "x", "shape": "one_long", "direction": "forward", "outcome": "failed", "message": "boom"}
    rp.write_json(new, dict(rp.load(new), timing_gaps=[gap]))
    assert cli.main(["compare", str(old), str(new)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "Timings lost (made by the baseline, failed or not made now) (1)" in out
    assert "x one_long forward: 2.000 ms -> failed: boom" in out
    assert cli.main(["compare", str(old), str(new), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["timings_lost"][0]["outcome"] == "failed"


# -- delegated commands ---------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["selftest", "replay"])
def test_selftest_and_replay_delegate_to_their_modules(command, monkeypatch):
    seen = []
    fake = types.ModuleType(f"conformance.{command}")
    fake.main = lambda argv: seen.append(argv) or 5
    monkeypatch.setitem(sys.modules, f"conformance.{command}", fake)
    assert cli.main([command, "x.pt", "--backend", "sdpa"]) == 5
    assert seen == [["x.pt", "--backend", "sdpa"]]


def test_a_missing_delegate_module_is_a_clear_usage_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "conformance.replay", None)  # makes the import fail as if absent
    assert cli.main(["replay", "x.pt"]) == 2
    assert "conformance.replay is missing" in capsys.readouterr().err


def test_module_path_is_where_the_spec_lives():
    assert (Path(cli.__file__).parent / "spec").is_dir()


def test_dtype_option_restricts_what_is_drawn_and_which_edge_cases_run(tmp_path):
    code, report = run(tmp_path, "--backend", "reference", "--dtype", "bfloat16", "-k", "test_forward or single_token",
                       "--max-examples", "3", "--name", "bf16")
    assert code == 0
    dtypes = {(r["feature"], r["dtype"] or r["problem"]["dtype"]) for r in report["records"]}
    assert dtypes == {("forward", "bfloat16"), ("edge_case:single_token", "bfloat16")}


def test_a_run_stopped_by_its_time_limit_still_writes_a_complete_report(tmp_path):
    code, report = run(tmp_path, "--backend", "reference", "--time-limit", "0.5", "--name", "stopped")
    assert code == 1
    assert report["run"]["complete"] is False and "--time-limit" in report["run"]["stopped"]
    assert {r["outcome"] for r in report["records"]} <= {"pass", "not-run", "unsupported"}
    # every unrun check says the time limit stopped it, not a generic "interrupted or crashed"
    assert all("--time-limit" in r["reason"] for r in report["records"] if r["outcome"] == "not-run")
    assert (tmp_path / "reports" / "stopped" / "index.html").exists()


def test_the_timing_session_starts_beside_the_checks_and_leaves_when_the_run_ends_without_timings(tmp_path):
    # a run cut by its time limit: the benchmark session it started beside the checks leaves at its gate;
    # no process of it stays behind, no gate file, no timings
    code, report = run(tmp_path, "--backend", "reference", "--bench", "--time-limit", "0.5", "--name", "cut")
    assert report["run"]["stopped"] and report["timings"] == [] and report["run"]["benchmarks"].startswith("not run: ")
    run_dir = tmp_path / "reports" / "cut"
    assert not list(run_dir.glob(".timings-*")) and not (run_dir / ".benchmark.json.partial").exists()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(run_dir / ".timings-gate") not in ps


def test_resume_runs_only_the_unrun_checks_and_merge_completes_the_report(tmp_path, capsys):
    code, first = run(tmp_path, "--backend", "reference", "-k", "test_forward or test_lse or single_token and float32",
                      "--name", "cut")
    assert code == 0 and len(first["records"]) == 3
    # as if a time limit had cut the run after its first check
    for r in first["records"][1:]:
        r.update(outcome="not-run", reason="never ran: the run reached its --time-limit", verdicts=[])
    first["run"]["complete"] = False
    (tmp_path / "reports" / "cut" / "report.json").write_text(json.dumps(first))
    unrun = {r["id"] for r in first["records"][1:]}
    code, second = run(tmp_path, "--resume", str(tmp_path / "reports" / "cut"), "--name", "rest")
    assert {r["id"] for r in second["records"]} == unrun, "exactly the checks without a verdict, nothing else"
    assert second["run"]["resumed_from"] and second["run"]["profile"] == first["run"]["profile"]
    assert code == 0 and second["run"]["complete"]
    assert cli.main(["merge", str(tmp_path / "reports" / "cut"), str(tmp_path / "reports" / "rest"),
                     "-o", str(tmp_path / "merged")]) == 0
    merged = json.loads((tmp_path / "merged" / "report.json").read_text())
    assert merged["run"]["complete"] and len(merged["records"]) == len(first["records"])
    # a report with a verdict for every check leaves nothing to resume
    assert cli.main(["run", "--resume", str(tmp_path / "merged")]) == 0
    assert "nothing to resume" in capsys.readouterr().out


def test_a_random_profile_run_records_the_seed_that_reproduces_it(tmp_path):
    args = ("--backend", "reference", "--profile", "dev", "-k", "test_forward")
    _, first = run(tmp_path, *args, "--name", "random")
    seed = first["run"]["seed"]
    assert isinstance(seed, int)
    _, again = run(tmp_path, *args, "--seed", str(seed), "--name", "again")
    problems = [[r["problem"] for r in rep["records"]] for rep in (first, again)]
    assert problems[0] == problems[1] and again["run"]["seed"] == seed


@pytest.mark.parametrize("signals", [1, 2], ids=["once", "twice"])
def test_sigterm_stops_the_run_and_leaves_a_report(tmp_path, signals):
    import signal
    import time
    # a backend that takes half a second a call: the checks left when SIGTERM arrives cannot all finish in
    # the seconds the run gives pytest to stop (with the reference backend a fast machine sometimes could).
    # "twice": a second SIGTERM while the run is stopping (a runner repeating it) still leaves the report
    example = Path(__file__).resolve().parent.parent / "examples" / "plain_callable.py"
    slow = tmp_path / "slow_backend.py"
    slow.write_text("import runpy\nimport time\n\n"
                    f"attention = runpy.run_path({str(example)!r})['attention']\n\n\n"
                    "def slow_attention(*args, **kwargs):\n"
                    "    time.sleep(0.5)\n"
                    "    return attention(*args, **kwargs)\n")
    command = [sys.executable, "-m", "conformance", "run", "--backend", f"{slow}:slow_attention", "-q", "-n", "1",
               "--report-dir", str(tmp_path), "--name", "terminated"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    records = tmp_path / "terminated" / ".records.jsonl"
    for _ in range(240):  # until the checks are collected and the first ones have reported
        if records.exists() and records.read_text().count("\n") >= 2:
            break
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    for _ in range(signals - 1):
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    report = rp.load(tmp_path / "terminated")
    assert report["run"]["complete"] is False and "SIGTERM" in report["run"]["stopped"]
    assert any(r["outcome"] == "not-run" for r in report["records"])
