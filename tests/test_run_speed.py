"""What makes a run finish in CI time, apart from the warm-up (tests/test_warmup.py): kernel configurations
drawn from a small covering set, shared compile caches, worker defaults that use the machine, and
containment of backends that hang or crash."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance import cache, cli, configs, run
from conformance.backend import Capabilities
from conformance.configs import KernelConfig, axis_values, covered, kernel_configs, problem_axes
from conformance.problem import CAUSAL_MODES, Problem
from conformance.spec.edge_cases import GPU_CASES
from conformance.strategies import problems

capabilities = st.builds(
    Capabilities,
    dtypes=st.sampled_from([("float32",), ("float16", "bfloat16"), ("float32", "float16", "bfloat16")]),
    head_dims=st.one_of(st.none(), st.sampled_from([(64,), (64, 128), (16, 32, 64, 128, 256)])),
    max_head_dim=st.sampled_from([None, 128]),
    value_dim_differs=st.booleans(),
    causal_modes=st.sampled_from([("none",), ("none", "bottom_right"), CAUSAL_MODES]),
    gqa=st.booleans(),
    broadcast_q=st.sampled_from(["native", "emulated", "none"]),
    max_drawn_rows=st.sampled_from([None, 160]),
)


def missing_values(chosen, caps):
    seen, values = covered(chosen, caps), axis_values(caps)
    return {axis: [v for v in vals if v not in seen[axis]] for axis, vals in values.items() if set(vals) - seen[axis]}


@settings(max_examples=60, deadline=None)
@given(caps=capabilities, seed=st.integers(0, 2**31))
def test_the_configurations_cover_every_declared_value(caps, seed):
    if not any(caps.supports_head_dim(d) for d in (caps.head_dims or configs.HEAD_DIMS)):
        return
    chosen = kernel_configs(caps, seed)
    assert not missing_values(chosen, caps)
    assert len(chosen) == len(set(chosen))
    values = axis_values(caps)
    for c in chosen:  # and nothing outside the declaration
        assert c.dtype in values["dtype"] and c.causal in values["causal"]
        assert (c.heads_q, c.heads_kv) in values["heads"] and c.broadcast_q in values["broadcast_q"]
        assert caps.supports_head_dim(c.head_dim) and caps.supports_head_dim(c.head_dim_v or c.head_dim)
    # bounded: about one configuration per value of the widest axis, plus the value-dim choices
    assert len(chosen) <= max(len(v) for v in values.values()) * 2 + 2


def test_the_set_keeps_the_edge_cases_first_changes_with_the_seed_and_respects_refusals():
    caps = Capabilities(dtypes=("float16", "bfloat16"))
    seeds = [KernelConfig("float16", 64, None, 1, 1, "none", False, None),
             KernelConfig("float32", 64, None, 1, 1, "none", False, None)]  # undeclared dtype: dropped
    first = kernel_configs(caps, 1, seeds=seeds)
    assert first[0] == seeds[0] and seeds[1] not in first
    assert kernel_configs(caps, 1, seeds=seeds) == first  # the same in every worker
    assert kernel_configs(caps, 2, seeds=seeds) != first  # pairings change from run to run
    no_gqa_256 = kernel_configs(caps, 1, supported=lambda c: not (c.head_dim == 256 and c.heads_q != c.heads_kv))
    assert all(not (c.head_dim == 256 and c.heads_q != c.heads_kv) for c in no_gqa_256)
    assert not missing_values(no_gqa_256, caps)
    assert len(kernel_configs(caps, 1, extra=4)) >= len(kernel_configs(caps, 1)) + 3


def test_every_head_dim_meets_equal_value_dims():
    # Some backwards run only with head_dim_v == head_dim: each head dim appears at least once so.
    caps = Capabilities(gqa=True)
    chosen = kernel_configs(caps, 7)
    assert {c.head_dim for c in chosen if c.head_dim_v is None} == set(axis_values(caps)["head_dim"])


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_drawn_problems_take_their_kernel_axes_from_the_configurations(data):
    caps = Capabilities(dtypes=("float16", "bfloat16"))
    chosen = kernel_configs(caps, 3)
    problem = data.draw(problems(caps, configs=chosen))
    assert KernelConfig.of(problem) in chosen
    pinned = data.draw(problems(caps, configs=chosen, broadcast_q=True, causal="none"))
    assert pinned.broadcast_q and pinned.causal == "none"
    # a pin no configuration has is set on one of them: still one of a bounded few
    assert KernelConfig.of(pinned) in chosen or any(
        c == KernelConfig.of(pinned.replace(broadcast_q=c.broadcast_q, causal=c.causal)) for c in chosen)


def test_problem_axes_name_every_coverage_value():
    p = Problem((3, 0), (5, 0), heads_q=8, heads_kv=2, head_dim=64, head_dim_v=32, dtype="float16",
                causal="bottom_right", scale=0.3, length_law="many_zeros")
    assert problem_axes(p) == {
        "dtype": "float16", "head_dim": "64", "head_dim_v": "smaller", "heads": "8:2", "causal": "bottom_right",
        "broadcast_q": "false", "scale": "0.3", "length_law": "many_zeros", "batch": "2-4", "max_length": "2-16",
        "zero_length": "true", "cross_attention": "true", "offsets_dtype": "int32", "layout": "packed",
        "offsets_layout": "contiguous", "values": "normal"}
    assert problem_axes(p.replace(grad_layout="expanded"), gradients=True)["grad_layout"] == "expanded"


# -- caches and workers ---------------------------------------------------------------------------------
def test_every_compile_cache_points_into_one_directory_and_user_settings_stay(tmp_path):
    env = cache.cache_env(tmp_path, {"TRITON_CACHE_DIR": "/elsewhere", "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "0"})
    assert env["TRITON_CACHE_DIR"] == "/elsewhere" and env["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "0"
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "CUDA_CACHE_PATH"):
        assert env[variable].startswith(str(tmp_path)) and (tmp_path / cache.CACHE_VARIABLES[variable]).is_dir()
    assert env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "1"
    assert cache.default_dir({"JFA_CACHE_DIR": str(tmp_path / "x")}) == tmp_path / "x"
    assert cache.default_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "jfa-conformance"


def test_workers_use_the_machine(monkeypatch):
    from conformance import workers
    monkeypatch.setattr(workers, "cores", lambda: 16)
    monkeypatch.setattr(workers, "host_memory", lambda: 128 * workers.GIB)
    assert workers.default_workers("cpu") == 4
    assert workers.default_workers("cuda") == 15  # no GPU visible here: cores and host memory bound it
    monkeypatch.setattr(workers, "host_memory", lambda: 12 * workers.GIB)
    assert workers.default_workers("cuda") == 4
    ns = cli.build_parser().parse_args(["run", "--gpus", "0,1", "-n", "5"])
    assert run._worker_sets(ns, "cuda") == [("0", 3), ("1", 2)]
    assert workers.worker_sets("cuda", ["0", "1", "2"], 1) == [("0", 1), ("1", 1), ("2", 1)]  # one per GPU at least
    # the workers' own thread pools (torch's intra-op threads, inductor's compile processes) share the cores
    for name in ("OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
        monkeypatch.delenv(name, raising=False)
    env = run._child_env("cpu", 4, Path("cache"))
    assert env["OMP_NUM_THREADS"] == env["TORCHINDUCTOR_COMPILE_THREADS"] == "4"
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "2")  # a setting of the user's own is kept
    assert run._child_env("cuda", 15, Path("cache"))["TORCHINDUCTOR_COMPILE_THREADS"] == "2"
    assert run._child_env("cuda", 15, Path("cache"))["OMP_NUM_THREADS"] == "1"


# -- containment in the checks --------------------------------------------------------------------------
def _outcomes(report):
    counts: dict[tuple[str, str], int] = {}
    for r in report["records"]:
        counts[r["backend"], r["outcome"]] = counts.get((r["backend"], r["outcome"]), 0) + 1
    return counts


def test_a_hanging_backend_costs_about_one_timeout_and_a_probe(tmp_path, misbehaving):
    timeout = 8
    argv = ["run", "--report-dir", str(tmp_path), "--name", "hang", "-q", "-n", "2", "--timeout", str(timeout),
            "--backend", "reference", "--backend", f"{misbehaving}:Hangs", "--no-bench"]
    started = time.monotonic()
    assert cli.main(argv) == 1
    wall = time.monotonic() - started
    report = json.loads((tmp_path / "hang" / "report.json").read_text())
    counts = _outcomes(report)
    checks = sum(n for (backend, _), n in counts.items() if backend == "reference")
    # the correct backend fully judged (but the edge cases judged on CUDA devices only)
    assert checks > 40 and counts[("reference", "pass")] + counts.get(("reference", "unsupported"), 0) == checks
    assert counts.get(("reference", "unsupported"), 0) == len(GPU_CASES)
    assert 1 <= counts[("hangs", "timeout")] <= 2  # at most one per worker
    hung = counts[("hangs", "timeout")] + counts[("hangs", "not-run")]
    assert hung + counts.get(("hangs", "unsupported"), 0) == checks
    reasons = {r["reason"] for r in report["records"] if r["outcome"] == "not-run"}
    assert all(r.startswith("hangs hung in ") for r in reasons), reasons
    assert any("probe" in r for r in reasons)
    # the 51 checks after the hang cost nothing like 51 timeouts
    assert wall < 4 * timeout + 60, wall


def test_a_backend_that_crashes_on_every_call_costs_a_few_restarts(tmp_path, misbehaving):
    argv = ["run", "--report-dir", str(tmp_path), "--name", "crash", "-q", "-n", "2", "--timeout", "60",
            "--backend", "reference", "--no-bench", "-k", "not metamorphic and not determinism"]
    for cls in ("Segfaults", "Aborts", "CudaError"):
        argv += ["--backend", f"{misbehaving}:{cls}"]
    assert cli.main(argv) == 1
    report = json.loads((tmp_path / "crash" / "report.json").read_text())
    counts = _outcomes(report)
    checks = sum(n for (b, _), n in counts.items() if b == "reference")
    assert counts[("reference", "pass")] + counts.get(("reference", "unsupported"), 0) == checks  # GPU_CASES
    for name in ("segfaults", "aborts", "cuda-error"):
        crashed = counts.get((name, "crash"), 0)
        assert 1 <= crashed <= 6, (name, counts)  # the streak, plus checks already running in parallel
        assert crashed + counts.get((name, "not-run"), 0) + counts.get((name, "unsupported"), 0) == checks
        dead = [r["reason"] for r in report["records"] if r["backend"] == name and r["outcome"] == "not-run"]
        assert all("crashed in each of its last" in r for r in dead), dead


def test_a_backend_that_hangs_compiling_beside_the_checks_opens_its_gate_at_the_compile_budget(tmp_path, misbehaving):
    # its warm-up job is stopped at the compile budget, which opens its gate with the backend suspect: its
    # checks are decided by a probe instead of each costing a timeout; the reference is judged meanwhile
    argv = ["run", "--report-dir", str(tmp_path), "--name", "hangc", "-q", "-n", "2", "--warmup",
            "--cache-dir", str(tmp_path / "c"), "--compile-timeout", "4", "--timeout", "8",
            "--backend", "reference", "--backend", f"{misbehaving}:HangsCompiling", "-k", "test_forward or test_lse"]
    started = time.monotonic()
    assert cli.main(argv) == 1
    assert time.monotonic() - started < 90
    report = json.loads((tmp_path / "hangc" / "report.json").read_text())
    assert "timeout" in {w["outcome"] for w in report["backends"]["hangs-compiling"]["time"]["warmup"]}
    outcomes = _outcomes(report)
    assert outcomes[("reference", "pass")] == 2
    hung = outcomes.get(("hangs-compiling", "timeout"), 0)
    assert hung <= 1 and hung + outcomes.get(("hangs-compiling", "not-run"), 0) == 2
    assert all(r["reason"].startswith("hangs-compiling hung") for r in report["records"] if r["outcome"] == "not-run")


# -- flex: padded to a bucket, the same answer ------------------------------------------------------------
@pytest.mark.parametrize("causal", ["none", "bottom_right", "top_left"])
def test_flex_rows_padded_to_a_bucket_give_the_same_attention(causal):
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    from backends.flex import bucket, document_block_mask
    from conformance.problem import make_inputs
    problem = Problem((5, 0, 130, 7), (9, 3, 129, 1), heads_q=2, heads_kv=2, head_dim=16, causal=causal)
    args = make_inputs(problem)
    total_q, total_k = args.q.shape[0], args.k.shape[0]
    assert bucket(1) == bucket(4096) == 4096 and bucket(4097) == 8192

    def run(rows):
        mask = document_block_mask(args.cu_seqlens_q, args.cu_seqlens_k, causal, rows=rows)
        padded = [torch.nn.functional.pad(t, (0, 0, 0, 0, 0, n - t.shape[0]))
                  for t, n in ((args.q, rows[0]), (args.k, rows[1]), (args.v, rows[1]))]
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in padded)
        out, aux = flex_attention(q, k, v, block_mask=mask, scale=args.softmax_scale, return_aux=AuxRequest(lse=True))
        return out[0, :, :total_q], aux.lse[0, :, :total_q]

    out, lse = run((total_q, total_k))
    padded_out, padded_lse = run((384, 512))
    # padded key columns are masked out: the same sums up to the order of a longer reduction
    torch.testing.assert_close(padded_out, out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(padded_lse, lse, rtol=1e-6, atol=1e-6)


def test_workers_sharing_a_gpu_hand_back_memory_held_beyond_their_share(monkeypatch):
    from conformance import containment
    # 15 check workers: an equal part of 92% less their contexts; with the warm-up's 15 processes beside
    # them (which keep next to nothing cached), less 30 contexts; never more than the GPU in all
    assert containment.memory_share(15) == pytest.approx((0.92 - 15 * containment.CONTEXT_SHARE) / 15, abs=1e-4)
    assert containment.memory_share(15, 15) < containment.memory_share(15)
    for workers, warm in ((1, 0), (15, 0), (15, 15), (8, 8), (3, 5)):
        share = containment.memory_share(workers, warm)
        held = (workers + warm) * containment.CONTEXT_SHARE + warm * containment.WARMUP_SHARE
        assert workers * share + held <= 0.92 + 1e-3
    assert containment.gpu_memory_share({}) is None
    assert containment.gpu_memory_share({containment.MEMORY_SHARE_ENV: "0.25"}) == 0.25
    assert not containment.release_gpu_memory_over_share(None)  # not asked
    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": 100})())
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 20)
    assert not containment.release_gpu_memory_over_share(0.25) and not emptied  # within its share: kept
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 30)
    assert containment.release_gpu_memory_over_share(0.25) and emptied


def test_a_profile_bounds_the_seconds_hypothesis_spends_shrinking():
    from hypothesis.internal.conjecture import engine

    from conformance import profiles
    assert hasattr(engine, "MAX_SHRINKING_SECONDS")  # the engine constant the profiles set
    try:
        profiles.load("ci")
        assert engine.MAX_SHRINKING_SECONDS == profiles.SHRINK_SECONDS["ci"] == 30
        profiles.load("dev", max_examples=5)
        assert engine.MAX_SHRINKING_SECONDS == profiles.SHRINK_SECONDS["dev"]
        profiles.load("thorough")
        assert engine.MAX_SHRINKING_SECONDS == 300
    finally:
        profiles.load("ci")
