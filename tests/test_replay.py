"""Replay: a failed check's artifact reruns exactly that check, failing again on the broken backend and
passing on a correct one."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conformance import replay
from conformance.problem import Problem
from conformance.spec.edge_cases import EDGE_CASES

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "conformance" / "spec"


def record(backend: str, check: str, problem: Problem | None, **params) -> dict:
    return {
        "backend": backend,
        "check": check,
        "params": params,
        "problem": None if problem is None else dataclasses.asdict(problem),
        "device": "cpu",
        "nodeid": f"conformance/spec/x.py::{check}[{backend}]",
        "outcome": "failed",  # reporters add keys of their own; they are kept, not required
        "duration_s": 0.25,
    }


def test_artifact_is_small_and_complete(tmp_path):
    problem = EDGE_CASES["queries_without_keys"]
    path = replay.write_artifact(tmp_path, record("conformance.mutants:LseBase2", "test_lse", problem))
    assert path.parent == tmp_path / "failures" and path.suffix == ".pt"
    assert path.stat().st_size < 4096
    data = replay.load_artifact(path)
    assert replay.problem_from_dict(data["problem"]) == problem
    assert data["backend"] == "conformance.mutants:LseBase2" and data["check"] == "test_lse"
    assert data["extra"] == {"outcome": "failed", "duration_s": 0.25}
    assert replay.replay_command(path, "x y") == f"jfa-conformance replay {path} --backend 'x y'"


def test_unreplayable_records_write_nothing(tmp_path):
    assert replay.write_artifact(tmp_path, record("reference", "test_forward", None)) is None
    assert replay.write_artifact(tmp_path, record("reference", "test_something_new", EDGE_CASES["single_token"])) is None
    assert not (tmp_path / "failures").exists()


def test_edge_case_without_problem_is_rebuilt_from_its_parameters(tmp_path):
    rec = record("conformance.mutants:GqaHeadModulo", "test_edge_case", None, case="gqa_ratio_3", dtype="float16")
    path = replay.write_artifact(tmp_path, rec)
    assert replay.problem_from_dict(replay.load_artifact(path)["problem"]) == EDGE_CASES["gqa_ratio_3"].replace(dtype="float16")
    assert replay.main([str(path)]) == 1
    assert replay.main([str(path), "--backend", "reference"]) == 0


@pytest.mark.parametrize(
    "mutant, check, problem, params, failing_line",
    [
        ("LseBase2", "test_lse", EDGE_CASES["causal_more_keys_than_queries"], {}, "lse: FAIL"),
        ("BroadcastQDqFirstSequence", "test_gradients", EDGE_CASES["broadcast_q_with_empty_kv"], {}, "dq: FAIL"),
        ("CrossSequenceLeak", "test_metamorphic", Problem((4, 6, 3), (5, 2, 7), seed=3), {"relation": "batch_split"}, "out: FAIL"),
        ("NondeterministicDq", "test_determinism", Problem((40,), (40,), head_dim=16), {}, "dq: "),
        ("KeyPastEnd", "test_guarded_inputs", Problem((1,), (0,), head_dim=16, broadcast_q=True), {}, "out: FAIL"),
        ("UnwrittenTail", "test_forward", Problem((3, 4), (5, 2)), {}, "out: FAIL"),
    ],
)
def test_failure_replays_and_correct_backend_passes(tmp_path, capsys, mutant, check, problem, params, failing_line):
    path = replay.write_artifact(tmp_path, record(f"conformance.mutants:{mutant}", check, problem, **params))
    assert replay.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL: the check still fails" in out and failing_line in out
    assert replay.main([str(path), "--backend", "conformance.mutants:Unmutated"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_relation_recovered_from_node_id(tmp_path):
    rec = record("conformance.mutants:CrossSequenceLeak", "test_metamorphic", Problem((4, 6, 3), (5, 2, 7), seed=3))
    rec["nodeid"] = "conformance/spec/test_metamorphic.py::test_metamorphic[mutant-cross-sequence-leak-batch_split]"
    data = replay.load_artifact(replay.write_artifact(tmp_path, rec))
    assert data["params"] == {"relation": "batch_split"}


def test_cannot_replay_is_not_a_pass(tmp_path, capsys):
    bad = tmp_path / "not-an-artifact.pt"
    torch.save({"hello": 1}, bad)
    assert replay.main([str(bad)]) == 2
    path = replay.write_artifact(tmp_path, record("reference", "test_forward", EDGE_CASES["single_token"]))
    assert replay.main([str(path), "--device", "cuda:7" if not torch.cuda.is_available() else "meta"]) == 2
    assert "cannot replay" in capsys.readouterr().err


# A stand-in for the run's reporter: on every failed spec check, write the artifact the way a report does.
REPORTER = textwrap.dedent(
    """
    import os
    import pytest
    from conformance.replay import record_for_item, replay_command, write_artifact

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(item, call):
        report = yield
        if report.when == "call" and report.failed:
            record = record_for_item(item)
            path = write_artifact(os.environ["REPORT_DIR"], record)
            print("REPLAY:", replay_command(path, record["backend"]))
        return report
    """
)


def test_spec_failures_replay_to_the_same_failure(tmp_path):
    """End to end: the spec fails a mutant, the failure's artifact (with hypothesis's shrunk problem)
    replays to the same failure; the same artifact passes on a correct backend."""
    (tmp_path / "replay_reporter.py").write_text(REPORTER)
    env = dict(os.environ, REPORT_DIR=str(tmp_path / "report"), PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    command = [
        sys.executable, "-m", "pytest", str(SPEC / "test_oracle_checks.py"), "-q", "-s", "-p", "no:cacheprovider",
        "-p", "conformance.plugin", "-p", "replay_reporter", "--backend", "conformance.mutants:MaxSeqlenOffByOne",
        "-k", "test_forward or test_lse",
    ]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert "2 failed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    artifacts = sorted((tmp_path / "report" / "failures").glob("*.pt"))
    assert len(artifacts) == 2 and proc.stdout.count("REPLAY: jfa-conformance replay") == 2
    for path in artifacts:
        data = replay.load_artifact(path)
        assert data["backend"] == "conformance.mutants:MaxSeqlenOffByOne"
        assert data["check"] in ("test_forward", "test_lse")
        assert replay.main([str(path)]) == 1
        assert replay.main([str(path), "--backend", "reference"]) == 0


def test_every_spec_check_can_be_replayed():
    import re
    from pathlib import Path

    import conformance.spec as spec
    from conformance import replay
    names = {name for path in Path(spec.__file__).parent.glob("test_*.py")
             for name in re.findall(r"^def (test_\w+)\(", path.read_text(), flags=re.M)}
    assert "test_offsets_rewritten_between_calls" in names
    assert names <= set(replay.CHECKS), sorted(names - set(replay.CHECKS))
