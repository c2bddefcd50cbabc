"""Failure triage: summaries (escape codes, empty exception headers, oracle disagreements), signatures and
groups, what a group's problems share, the triage file, and the report's use of them."""
from __future__ import annotations

import json
import math

import pytest

from conformance import report as rp
from conformance.problem import Problem
from conformance.reporting import render_html, render_markdown, triage

ILLEGAL_ADDRESS = (
    "conformance.harness.DeviceFault: fa4 forward: AcceleratorError: CUDA error: an illegal memory access was "
    "encountered\nSearch for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/ for more information.\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
DSL_ERROR = ("cutlass.base_dsl.common.DSLRuntimeError: \n\x1b[91m\x1b[1merror\x1b[0m\x1b[1m: expects tile size "
             "divisible by 16, got 40\x1b[0m\n  \x1b[94m-->\x1b[0m flash_fwd.py:211")
MLIR_ERROR = ("cutlass._mlir._mlir_libs._cutlass_ir._mlir.ir.MLIRError: Operation creation failed:\nerror: unknown: "
              "expected top-level shape equivalence between the SMEM layout and the CTA V-map, but got "
              "'((8,16),(64,1))' and '(128,32):(1@0,1@1)'")
GRADIENTS = ("AssertionError: fa4 disagrees with the float64 oracle on Problem(seqlens_q=[17, 4], seqlens_k=[17, 4], "
             "heads_q=6, heads_kv=2, head_dim=40, dtype='float16', causal='bottom_right')\n"
             "  out: ok, observed error 8.997e-04, allowed 1.633e-02 (budget used 6%)\n"
             "  dq: FAIL, observed error 1.855e+00, allowed 2.186e-02 (budget used 84.9x the allowance)\n"
             "  dk: FAIL, observed error 1.586e+00, allowed 2.350e-02 (budget used 67.5x the allowance)\n"
             "  dv: FAIL, observed error 8.069e+00, allowed 3.705e-02 (budget used 218x the allowance)")


def rec(backend="fa4", feature="forward", outcome="fail", message=None, reason=None, problem=None, dtype=None,
        verdicts=(), **extra):
    return {"id": f"spec::test_{feature}[{backend}-{dtype}-{len(str(problem))}]", "backend": backend,
            "test": "test_" + feature.partition(":")[0], "feature": feature, "dtype": dtype, "outcome": outcome,
            "reason": reason, "message": message, "verdicts": list(verdicts), "budget_used": None,
            "problem": problem.summary() if problem else None, "counterexample": repr(problem) if problem else None,
            "problem_source": "running" if outcome == "crash" else "shrunk", **extra}


def report_of(records, **extra):
    backends = {r["backend"]: {"source": f"backends.x:{r['backend']}", "available": True, "reason": None,
                               "capabilities": {}} for r in records}
    return {"schema": rp.SCHEMA, "schema_version": rp.SCHEMA_VERSION,
            "run": {"name": "t", "profile": "dev", "seed": 3, "complete": True, "environment": {"device": "cpu"}},
            "backends": backends, "records": list(records), "timings": [], **extra}


# -- summaries ------------------------------------------------------------------------------------------
def test_escape_codes_are_stripped_including_ones_that_lost_their_escape_byte():
    assert triage.strip_ansi("\x1b[91m\x1b[1merror\x1b[0m: bad") == "error: bad"
    assert triage.strip_ansi("[91m[1merror[0m: bad tile") == "error: bad tile"
    assert triage.strip_ansi("\x1b]8;;http://x\x07link\x1b]8;;\x07 and \x1b[2Kcleared") == "link and cleared"
    # brackets that are not colour codes stay
    assert triage.strip_ansi("seqlens_q=[16, 1] x[0]") == "seqlens_q=[16, 1] x[0]"


@pytest.mark.parametrize("message, expected", [
    (DSL_ERROR, "DSLRuntimeError: expects tile size divisible by 16, got 40"),
    (MLIR_ERROR, "MLIRError: Operation creation failed: expected top-level shape equivalence between the SMEM "
                 "layout and the CTA V-map, but got '((8,16),(64,1))' and '(128,32):(1@0,1@1)'"),
    (ILLEGAL_ADDRESS, "forward: CUDA error: an illegal memory access was encountered"),
    ("Traceback (most recent call last):\n  File \"x.py\", line 3, in f\nRuntimeError: batch size must be positive",
     "RuntimeError: batch size must be positive"),
    ("cutlass.base_dsl.common.DSLRuntimeError: \n\x1b[91minternal error[DSL001]\x1b[0m: failed to build IR for "
     "the tile\n  --> interface.py:88\n   |", "DSLRuntimeError: failed to build IR for the tile"),
    ("torch._inductor.exc.InductorError: LoweringException: NoValidChoicesError: No choices to select.",
     "InductorError: NoValidChoicesError: No choices to select."),
])
def test_a_failure_summary_is_its_first_informative_line(message, expected):
    outcome = "crash" if "DeviceFault" in message else "fail"
    assert triage.summary(rec(message=message, outcome=outcome, reason="device error: CUDA error")) == expected


def test_a_gradient_failure_names_the_quantities_and_by_how_much():
    from_text = rec(feature="edge_case:gqa_ratio_3", message=GRADIENTS)
    assert triage.summary(from_text) == "disagrees with the float64 oracle: dq 85x, dk 67x, dv 218x the allowance"
    verdicts = [{"quantity": "out", "budget_used": 0.05, "ok": True},
                {"quantity": "dk", "budget_used": 8.5, "ok": False}, {"quantity": "dv", "budget_used": math.inf, "ok": False}]
    from_verdicts = rec(message="ExceptionGroup: Hypothesis found 3 distinct failures. (3 sub-exceptions)",
                        verdicts=verdicts)
    text = triage.summary(from_verdicts)
    assert text.startswith("Hypothesis found 3 distinct failures") and "dk 8.5x" in text and "dv inf" in text


def test_timeouts_and_dead_workers_are_summarised_by_their_reason():
    dead = rec(outcome="crash", message="worker 'gw3' crashed while running 'x'",
               reason="the process running the check died (segfault, abort or exit); a fresh one took over")
    assert triage.summary(dead).startswith("the process running the check died")
    hung = rec(outcome="timeout", message="worker 'gw1' crashed while running 'x'",
               reason="no result after 400 s (per-check timeout); the process was stopped")
    assert triage.summary(hung) == "no result after 400 s (per-check timeout); the process was stopped"


def test_long_summaries_are_cut_at_a_word():
    text = triage.summary(rec(message="RuntimeError: " + "word " * 200))
    assert len(text) <= triage.SUMMARY_LIMIT + 2 and text.endswith(" …")


# -- signatures, groups, shared properties --------------------------------------------------------------
def test_failures_with_one_cause_group_together_and_say_what_their_problems_share():
    faulting = [Problem((64,), (64,), head_dim=16, head_dim_v=128, dtype="bfloat16"),
                Problem((16,), (27,), heads_q=4, heads_kv=2, head_dim=40, head_dim_v=128, dtype="float16"),
                Problem((1,), (1,), head_dim=16, head_dim_v=40, dtype="float16"),
                Problem((128, 3), (127, 1), heads_q=3, head_dim=16, head_dim_v=128, dtype="float16",
                        causal="bottom_right")]
    passing = [Problem((5,), (5,), head_dim=d, head_dim_v=dv, dtype="float16")
               for d, dv in ((64, 64), (128, 128), (64, 32), (32, 32), (128, 64), (16, 16))]
    records = [rec(feature=f, outcome="crash", message=ILLEGAL_ADDRESS.replace("forward", "forward"), problem=p)
               for f, p in zip(("forward", "lse", "determinism", "guarded_inputs"), faulting)]
    records += [rec(feature=f"edge_case:c{i}", outcome="pass", problem=p) for i, p in enumerate(passing)]
    records += [rec(feature="metamorphic:key_shift", message="RuntimeError: expected 128 got 64"),
                rec(feature="metamorphic:batch_split", message="RuntimeError: expected 256 got 32"),
                rec(backend="flex", feature="forward", message="RuntimeError: expected 128 got 64")]
    groups = triage.groups(records)
    crash = groups[0]
    assert crash.outcome == "crash" and len(crash.records) == 4
    assert crash.signature == "fa4 crash: forward: CUDA error: an illegal memory access was encountered"
    # head_dim < head_dim_v holds for all four and for none of the passing problems; it implies
    # head_dim_v != head_dim, which is not repeated
    assert crash.shared_text().startswith("all 4: head_dim < head_dim_v (passing problems: 0 of 6)")
    assert "head_dim_v != head_dim" not in crash.shared_text()
    # the same message with other numbers is one cause; another backend's is another
    by_backend = {(g.backend, len(g.records)) for g in groups[1:]}
    assert by_backend == {("fa4", 2), ("flex", 1)}
    assert groups[1].signature == "fa4 fail: RuntimeError: expected N got N"
    assert groups[1].smallest() is None  # no problem recorded to attach
    assert list(crash.smallest()["problem"]["seqlens_q"]) == [1]  # the one to attach to a bug report
    assert triage.signature_id(crash.signature) == crash.id and len(crash.id) == 10


def test_a_property_most_passing_problems_have_is_not_called_shared():
    problems = [Problem((4,), (4,), dtype="float16").summary()] * 2
    passing = [Problem((4,), (4,), dtype="float16").summary()] * 3 + [Problem((4,), (4,), dtype="float32").summary()]
    shared = triage.shared_properties(problems, passing)
    assert all("float16" not in s.text for s in shared)  # 3 of 4 passing problems are float16 too
    assert triage.shared_properties([], passing) == []


def test_a_shared_tensor_layout_is_named_first_among_equally_telling_properties():
    failing = [dict(head_dim=128, head_dim_v=None, heads_q=3, heads_kv=1, offsets_dtype="int64", seqlens_q=[1],
                    seqlens_k=[1]) for _ in range(4)]
    passing = [dict(head_dim=64, head_dim_v=None, heads_q=1, heads_kv=1, seqlens_q=[2], seqlens_k=[2],
                    offsets_dtype="int64" if i < 3 else "int32") for i in range(56)]
    shared = triage.shared_properties(failing, passing)
    # head_dim = 128 is in no passing problem and int64 offsets in 3 of 56: both telling, the layout first
    assert shared[0].text == "offsets_dtype = int64" and "head_dim = 128" in [s.text for s in shared]


def test_oracle_disagreements_group_by_the_quantities_that_failed():
    a = rec(feature="gradients", message=GRADIENTS)
    b = rec(feature="edge_case:gqa_ratio_3", message=GRADIENTS.replace("84.9", "12.8").replace("1.855e+00", "1.1e+00"))
    c = rec(feature="forward", message="AssertionError: fa4 disagrees with the float64 oracle on Problem()\n"
                                      "  out: FAIL, observed error 1.0e+00, allowed 1.0e-02 (budget used 100x)")
    sigs = [g.signature for g in triage.groups([a, b, c])]
    assert sorted(sigs) == ["fa4 fail: disagrees with the float64 oracle: dq, dk, dv",
                            "fa4 fail: disagrees with the float64 oracle: out"]


# -- triage file ----------------------------------------------------------------------------------------
def test_a_triage_file_labels_groups_by_id_or_regex(tmp_path):
    records = [rec(outcome="crash", message=ILLEGAL_ADDRESS, problem=Problem((1,), (1,), head_dim=16, head_dim_v=40)),
               rec(feature="lse", message="RuntimeError: batch size must be positive")]
    groups = triage.groups(records)
    path = tmp_path / "triage.json"
    path.write_text(json.dumps({"entries": [
        {"match": r"fa4 crash: .*illegal memory access", "label": "sm_90 forward faults when head_dim < head_dim_v",
         "link": "https://github.com/Dao-AILab/flash-attention/issues/1"},
        {"signature": groups[1].id, "label": "refuses empty batches", "note": "declared since"}]}))
    entries = triage.load_triage_file(path)
    labelled = {g.signature: (g.label, g.link, g.note) for g in triage.groups(records, entries)}
    assert labelled[groups[0].signature] == ("sm_90 forward faults when head_dim < head_dim_v",
                                             "https://github.com/Dao-AILab/flash-attention/issues/1", None)
    assert labelled[groups[1].signature] == ("refuses empty batches", None, "declared since")
    toml = tmp_path / "triage.toml"
    toml.write_text('[[entries]]\nmatch = "batch size"\nlabel = "empty batch"\n')
    assert triage.load_triage_file(toml) == [{"match": "batch size", "label": "empty batch"}]


@pytest.mark.parametrize("content, field", [
    ({"entries": [{"match": "x"}]}, "'label'"),
    ({"entries": [{"label": "x"}]}, "'signature'"),
    ({"entries": [{"label": "x", "match": "("}]}, "'match'"),
    ({"entries": [{"label": "x", "match": "a", "link": "javascript:alert(1)"}]}, "'link'"),
    ({"entries": {"label": "x"}}, "'entries'"),
    ([], "'entries'"),
])
def test_a_bad_triage_file_is_refused_naming_the_field(tmp_path, content, field):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(content))
    with pytest.raises(triage.TriageFileError, match=field):
        triage.load_triage_file(path)
    with pytest.raises(triage.TriageFileError, match="not valid JSON"):
        (tmp_path / "bad.json").write_text("{")
        triage.load_triage_file(tmp_path / "bad.json")


# -- verdicts -------------------------------------------------------------------------------------------
def test_a_backend_whose_only_gaps_are_not_run_is_incomplete_not_failing():
    only_unrun = report_of([rec(outcome="pass", feature="forward"), rec(outcome="not-run", feature="lse"),
                            rec(backend="b", outcome="pass"), rec(backend="b", feature="lse", outcome="crash",
                                                                  message=ILLEGAL_ADDRESS)])
    verdicts = {n: s["verdict"] for n, s in rp.summarize_backends(only_unrun).items()}
    assert verdicts == {"fa4": "incomplete", "b": "failing"}
    assert rp.exit_code(only_unrun) == 1  # no verdict is not a pass
    md = render_markdown(only_unrun)
    assert "| fa4 | incomplete |" in md and "| b | failing |" in md
    page = render_html(only_unrun)
    assert "class='v-incomplete'>incomplete" in page
    # not run is drawn quieter than a failure: no fill, a dashed outline
    css = page.split("<style>")[1].split("</style>")[0]
    assert "o-not-run{background:#fff" in css and "o-fail{background:#dc2626" in css


def test_a_crash_shows_no_budget_table_and_a_fail_shows_its_failing_quantities():
    crash = rec(outcome="crash", message=ILLEGAL_ADDRESS, problem=Problem((1,), (1,)),
                verdicts=[{"quantity": "out", "observed": 0.0, "allowed": 0.1, "budget_used": 0.0, "ok": True}])
    fail = rec(feature="gradients", message=GRADIENTS, problem=Problem((2,), (2,)),
               verdicts=[{"quantity": "dq", "observed": 1.8, "allowed": 0.02, "budget_used": 85.0, "ok": False},
                         {"quantity": "out", "observed": 1e-3, "allowed": 0.02, "budget_used": 0.05, "ok": True}])
    page = render_html(report_of([crash, fail]))
    crash_card = page.split("signature " + triage.groups([crash])[0].id)[1].split("<div class='cause")[0]
    assert "observed error" not in crash_card
    fail_card = page.split("signature " + triage.groups([fail])[0].id)[1]
    assert "<th>observed error</th>" in fail_card and ">85x<" in fail_card
