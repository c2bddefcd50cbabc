"""The bug catalog (conformance/bugs.py, rendered into conformance/BUGS.md): every class is sourced and
classified, every mutant names a class of the catalog, BUGS.md is up to date, and each pending mutant
really fails on a problem that triggers its class (so only the drawing stands between it and CI)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from conformance import bugs, checks, mutants
from conformance.harness import Run, judge_forward
from conformance.problem import Output, Problem, make_inputs
from conformance.recorder import problem_from_repr
from conformance.reference import Reference
from conformance.reference_online import ReferenceOnline
from conformance.replay import problem_from_dict
from conformance.spec import edge_cases

SPEC_DIR = Path(bugs.__file__).resolve().parent / "spec"


def test_ids_are_unique_and_readable():
    ids = [b.id for b in bugs.CATALOG]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", i) for i in ids), ids


def test_at_least_forty_sourced_classes():
    assert len(bugs.CATALOG) >= 40
    for b in bugs.CATALOG:
        assert b.title and b.trigger and b.convention, b.id
        assert b.sources, f"{b.id} has no source"
        for s in b.sources:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+", s.repo), (b.id, s.repo)
            assert s.number > 0 and s.kind in ("issue", "pull") and s.says, (b.id, s)


def test_every_class_is_classified():
    for b in bugs.CATALOG:
        assert b.status in bugs.STATUSES, (b.id, b.status)
        assert set(b.caught_by) <= set(bugs.CHECKS), (b.id, b.caught_by)
        if b.status == "mutant":
            assert b.caught_by, f"{b.id}: a mutant class must say which checks catch it"
        else:
            assert b.how, f"{b.id}: a {b.status} class must say what is needed or what happens"


def test_check_names_exist_in_the_spec():
    source = "\n".join(p.read_text() for p in SPEC_DIR.glob("test_*.py"))
    for check in bugs.CHECKS:
        if check != "validation":
            assert f"def {check}(" in source, check


def test_every_mutant_names_a_class_of_the_catalog():
    catalog = bugs.by_id()
    assert len(mutants.MUTANTS) >= 30
    for name, cls in mutants.MUTANTS.items():
        assert cls.catalog_id in catalog, f"{name} names {cls.catalog_id!r}, not in the catalog"
        assert catalog[cls.catalog_id].status == "mutant", name
    for name, cls in mutants.PENDING.items():
        assert name not in mutants.MUTANTS
        assert cls.catalog_id in catalog and catalog[cls.catalog_id].status == "pending", name
        assert cls().capabilities == mutants.Unmutated.capabilities and cls.name.startswith("mutant-")


def test_every_mutant_class_has_a_mutant():
    rendered = {cls.catalog_id for cls in mutants.MUTANTS.values()}
    assert {b.id for b in bugs.CATALOG if b.status == "mutant"} == rendered


def test_bugs_md_is_up_to_date():
    document = bugs.BUGS_MD.read_text()
    assert bugs.generated_part(document) == bugs.render(), "run: python -m conformance.bugs"
    assert bugs.main(["--check"]) == 0


def test_bugs_md_keeps_the_fa4_versions_section_outside_the_generated_part():
    document = bugs.BUGS_MD.read_text()
    tail = document.split(bugs.END, 1)[1]
    assert "## FA4 releases on sm_90 (H200, H100)" in tail and "| b29 | b30 | b31 | b36 |" in tail
    # the runs the table cites are in the repository
    for folder in re.findall(r"`(reports/examples/[^`]+/)`", tail):
        assert (bugs.BUGS_MD.parent.parent / folder).is_dir(), folder


def test_splice_replaces_only_the_generated_part():
    document = f"intro\n{bugs.BEGIN}\nold\n{bugs.END}\nhand-written\n"
    assert bugs.splice(document, "new\n") == f"intro\n{bugs.BEGIN}\nnew\n{bugs.END}\nhand-written\n"
    with pytest.raises(ValueError, match="markers"):
        bugs.splice("no markers", "new\n")


# A problem that triggers the class directly (the ci drawing does not produce it, or meets it only through a
# metamorphic relation), and the verdicts that must fail on it.
TRIGGERS = {
    "ValueDimNarrowedInDq": (Problem((5, 3), (7, 4), heads_q=2, heads_kv=1, head_dim=32, head_dim_v=64), {"dq", "dk"}),
    "LseGqaDecodeFirstHeadOnly": (Problem((1, 1, 0), (5, 7, 3), heads_q=4, heads_kv=2), {"lse"}),
}


@pytest.mark.parametrize("name", list(TRIGGERS))
def test_mutant_fails_on_a_problem_that_triggers_its_class(name):
    problem, failing = TRIGGERS[name]
    verdicts = checks.everything({**mutants.MUTANTS, **mutants.PENDING}[name](), problem, "cpu")
    assert {v.quantity for v in verdicts if not v.ok} == failing
    assert all(v.ok for v in checks.everything(mutants.Unmutated(), problem, "cpu"))


def test_gqa_decode_fast_path_fails_with_an_empty_query_sequence():
    problem = Problem((0, 1, 1), (3, 5, 2), heads_q=4, heads_kv=2)
    with pytest.raises(RuntimeError, match="is invalid for input of size"):
        checks.forward(mutants.GqaDecodeFastPathOneQueryEach(), problem, "cpu")
    assert checks.forward(mutants.GqaDecodeFastPathOneQueryEach(), problem.replace(seqlens_q=(1, 1, 1)), "cpu")[0].ok


def test_finite_running_max_sentinel_zeroes_rows_scored_below_it():
    """Scores far below -5e4 (massive activations): the mutant returns zero rows, the control does not."""
    problem = Problem((1, 1, 1, 1), (1, 3, 1, 2), head_dim=64, scale=3e4, seed=0)
    args = make_inputs(problem)
    cu = args.cu_seqlens_k.tolist()
    best = [float((args.k[cu[b] : cu[b + 1], 0] @ args.q[b, 0]).max()) * problem.softmax_scale for b in range(4)]
    assert min(best) < -6e4  # some sequence's every score is below the sentinel
    mutant = mutants.FiniteRunningMaxSentinel().forward(args)
    assert not any(v.ok for v in judge_forward(problem, Run(mutant.out, mutant.lse)))
    assert all(v.ok for v in checks.everything(mutants.Unmutated(), problem, "cpu"))
    calm = problem.replace(seed=2)  # every sequence has a score above the sentinel: no difference
    assert all(v.ok for v in checks.everything(mutants.FiniteRunningMaxSentinel(), calm, "cpu"))


class SequencesPastTheGridLimitUnwritten(Reference):
    """A kernel whose launch put the batch on a grid axis of at most 65,535 and whose launch error went
    unchecked: the rows of every sequence past that are never written (zeros, as the output was allocated)."""

    name = "grid-limit-unwritten"

    def forward(self, args):
        run = super().forward(args)
        first = int(args.cu_seqlens_q[GRID_AXIS_LIMIT])
        out = torch.cat([run.out[:first], torch.zeros_like(run.out[first:])])
        lse = None if run.lse is None else torch.cat([run.lse[..., :first], torch.zeros_like(run.lse[..., first:])], -1)
        return Output(out, lse)


GRID_AXIS_LIMIT = 65_535


def test_batch_past_the_grid_limit_catches_sequences_left_unwritten():
    """The GPU edge case batch_past_grid_limit, judged here on the CPU against a backend that leaves the
    sequences past 65,535 unwritten: forward and LSE fail, the oracle's own backend passes."""
    problem = edge_cases.in_dtype("batch_past_grid_limit", "bfloat16")
    assert problem.batch > GRID_AXIS_LIMIT and problem.heads_q * problem.batch > GRID_AXIS_LIMIT
    assert edge_cases.in_dtype("batch_past_grid_limit", "float32") is None  # one dtype: the grid does not depend on it
    assert edge_cases.device_reason("batch_past_grid_limit", "cpu") and not edge_cases.device_reason(
        "batch_past_grid_limit", "cuda:0")
    assert edge_cases.device_reason("tile_edges", "cpu") is None
    # reports hold its lengths as runs and its repr stays short; both read back to the same problem
    assert len(json.dumps(problem.summary())) < 2000 and len(repr(problem)) < 200
    assert problem_from_repr(repr(problem)) == problem and problem_from_dict(problem.summary()) == problem
    problem = problem.replace(dtype="float32")  # the CPU's matmuls; the case runs in bfloat16 on GPUs
    failing = {v.quantity for v in checks.everything(SequencesPastTheGridLimitUnwritten(), problem, "cpu") if not v.ok}
    assert {"out", "lse"} <= failing
    assert all(v.ok for v in checks.everything(Reference(), problem, "cpu"))
    # a backend whose per-sequence loop cannot take that many declares so, and is not run on it
    assert any("max_batch 4096" in r for r in ReferenceOnline().not_supported_reasons(problem))
    assert not ReferenceOnline().not_supported_reasons(problem.replace(seqlens_q=(1,) * 4096, seqlens_k=(1,) * 4096))
    # the catalog's class names the check that catches it
    (entry,) = [c for c in bugs.CATALOG if c.id == "batch-past-grid-limit"]
    assert entry.status == "gpu-only" and "test_edge_case" in entry.caught_by
