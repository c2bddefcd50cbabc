"""The self-test: every built-in mutant is caught by the spec under the ``ci`` profile, by a check its
catalog class (conformance/BUGS.md) lists; the control (the mutants' computation without a bug) passes
it; and ``selftest`` fails when either goes wrong."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from conformance.reference import Reference
from conformance import bugs, mutants, selftest


def test_mutants_declare_themselves_like_the_reference():
    classes = [mutants.Unmutated, *mutants.MUTANTS.values(), *mutants.PENDING.values()]
    assert len({cls.name for cls in classes}) == len(classes)
    assert len({cls.__name__ for cls in classes}) == len(classes)
    for cls in classes:
        assert cls().capabilities == Reference.capabilities, cls.__name__
        assert cls.bug and cls.name.startswith("mutant-")
        assert {**mutants.MUTANTS, **mutants.PENDING}.get(cls.__name__, mutants.Unmutated) is cls


def test_the_documented_bug_classes_are_all_there():
    assert len(mutants.MUTANTS) >= 30
    wanted = {"ZeroLengthCompacted", "CausalTopLeft", "NanForMaskedRows", "KeyPastEnd", "LseBase2", "GqaHeadModulo",
              "BroadcastQDqFirstSequence", "CrossSequenceLeak", "NondeterministicDq", "ScaleFromValueDim",
              "GqaDvNotReduced", "UnwrittenTail", "MaxSeqlenOffByOne", "KeyOffsetsFromQuery", "Float32AsBfloat16"}
    assert wanted <= set(mutants.MUTANTS)
    assert all(cls.catalog_id for cls in mutants.MUTANTS.values())


def test_every_mutant_is_caught_and_the_control_passes():
    """The whole self-test, each mutant stopped at its first failed check (what CI needs). The check that
    catches a mutant must be one its catalog class lists: BUGS.md's "caught by" is a claim CI verifies."""
    results = selftest.run_selftest(first_failure=True, jobs=2, timeout=600)
    assert [r.class_name for r in results] == [selftest.CONTROL, *mutants.MUTANTS]
    bad = [r for r in results if not r.ok]
    report = "\n\n".join(f"{r.name}: caught by {r.caught_by}, errors {r.errors}\n{r.output[-2000:]}" for r in bad)
    assert not bad, report
    control = results[0]
    assert control.passed and not control.caught_by
    # the control's records: every declared value exercised, and the table says so
    table = Console(file=io.StringIO(), width=200)
    assert selftest.print_coverage(control, console=table) == []
    assert "offsets_layout" in table.file.getvalue() and "scores_low" in table.file.getvalue()
    catalog = bugs.by_id()
    unlisted = [f"{r.class_name} was first caught by {r.caught_by[0]}, which class {r.catalog_id} does not list "
                f"(conformance/bugs.py: {catalog[r.catalog_id].caught_by})"
                for r in results[1:] if r.caught_by[0].partition("[")[0] not in catalog[r.catalog_id].caught_by]
    assert not unlisted, "\n".join(unlisted)


def _result(class_name: str, caught=(), errors=(), returncode=1) -> selftest.MutantResult:
    return selftest.MutantResult(class_name, f"name-{class_name}", "bug", caught_by=list(caught), passed=["test_x"],
                                 errors=list(errors), returncode=returncode)


@pytest.mark.parametrize(
    "results, status",
    [
        ([_result("Unmutated", returncode=0), _result("LseBase2", ["test_lse"])], 0),
        ([_result("Unmutated", returncode=0), _result("LseBase2")], 1),  # a survivor
        ([_result("Unmutated", ["test_forward"]), _result("LseBase2", ["test_lse"])], 1),  # the control fails
        ([_result("Unmutated", returncode=0), _result("LseBase2", errors=["pytest exited with status 3"], returncode=3)], 1),
    ],
    ids=["all-caught", "survivor", "control-fails", "run-error"],
)
def test_selftest_status(monkeypatch, capsys, results, status):
    monkeypatch.setattr(selftest, "run_selftest", lambda *a, **k: results)
    assert selftest.main([]) == status
    out = capsys.readouterr().out
    assert "name-LseBase2" in out
    if status:
        assert "SURVIVED" in out or "FAILS" in out or "ERROR" in out


def test_junit_outcomes_become_caught_passed_skipped(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(
        """<testsuites><testsuite>
        <testcase classname="spec.test_edge_cases" name="test_edge_case[mutant-x-single_token-float32]"><failure message="m"/></testcase>
        <testcase classname="spec.test_oracle_checks" name="test_forward[mutant-x]"/>
        <testcase classname="spec.test_oracle_checks" name="test_lse[mutant-x]"><skipped message="s"/></testcase>
        <testcase classname="spec.test_oracle_checks" name="test_gradients[mutant-x]"><error message="e"/></testcase>
        </testsuite></testsuites>"""
    )
    result = selftest.MutantResult("X", "mutant-x", "bug")
    selftest._read_junit(junit, result)
    assert result.caught_by == ["test_edge_case[single_token-float32]"]
    assert result.passed == ["test_forward"] and result.skipped == ["test_lse"] and result.errors == ["test_gradients"]
    assert not result.ok  # an error is not a catch


def test_selftest_stops_each_mutant_at_its_first_catch_unless_asked_for_all(monkeypatch, capsys):
    seen = []

    def fake(names, profile, **kwargs):
        seen.append(kwargs["first_failure"])
        return [_result("Unmutated", returncode=0)]

    monkeypatch.setattr(selftest, "run_selftest", fake)
    assert selftest.main([]) == 0 and selftest.main(["-x"]) == 0 and selftest.main(["--all-checks"]) == 0
    assert seen == [True, True, False]
    assert "each stopped at its first" in capsys.readouterr().out


def test_a_seeded_selftest_draws_from_the_seed(tmp_path):
    """The ci profile is derandomized, which makes hypothesis ignore --hypothesis-seed: a seeded selftest
    runs a variant that is not, so another seed really means other draws."""
    from hypothesis import settings

    plain = selftest.spec_command("LseBase2", "ci", tmp_path / "j.xml", first_failure=True, device=None)
    seeded = selftest.spec_command("LseBase2", "ci", tmp_path / "j.xml", first_failure=True, device=None, seed=7)
    assert "--hypothesis-seed=7" in seeded and not any(a.startswith("--hypothesis-seed") for a in plain)
    profile = seeded[seeded.index("--hypothesis-profile") + 1]
    assert settings.get_profile(profile).derandomize is False
    assert settings.get_profile(plain[plain.index("--hypothesis-profile") + 1]).derandomize is True


def test_a_mutants_pytest_process_reports_its_status_its_output_and_its_timeout(tmp_path):
    """run_pytest forks each mutant's pytest session from the fork server: its exit status comes back, its
    output lands in the log, and a session past its timeout is killed and reported as None."""
    (tmp_path / "test_x.py").write_text(
        "import time\n"
        "def test_fails():\n    print('said by the test')\n    assert False\n"
        "def test_sleeps():\n    time.sleep(60)\n")
    log = tmp_path / "log.txt"
    base = ["python", "-m", "pytest", "-p", "no:cacheprovider", "-s", str(tmp_path / "test_x.py")]
    assert selftest.run_pytest(base + ["-k", "fails"], log, timeout=120, threads=1) == 1
    assert "said by the test" in log.read_text() and "1 failed" in log.read_text()
    assert selftest.run_pytest(base + ["-k", "nothing_matches"], log, timeout=120) == 5  # no tests collected
    assert selftest.run_pytest(base + ["-k", "sleeps"], log, timeout=3) is None
