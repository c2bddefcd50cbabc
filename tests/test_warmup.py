"""The warm-up (conformance/warmup.py, manifest.py, gates.py): every kernel configuration compiled apart from
the checks, in a pool of worker processes, in an order that opens the cheapest gates first; the checks of a
backend wait at its gate; what compiled once is not compiled again; hangs, crashes and killed compilers
are contained. The misbehaving backends are tests/conftest.py's."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from pathlib import Path

import pytest
import torch

from conformance import cli, configs, gates, manifest, registry, warmup
from conformance.backend import Capabilities
from conformance.configs import KernelConfig

def test_the_warm_up_times_each_configuration_and_contains_hangs_and_crashes(tmp_path, misbehaving):
    config = KernelConfig("float32", 16, None, 1, 1, "none", False, None)
    other = KernelConfig("float32", 32, None, 1, 1, "bottom_right", False, None)
    jobs = [warmup.Job(f"{misbehaving}:{cls}", name, c) for cls, name in
            (("Fine", "fine"), ("Hangs", "hangs"), ("Segfaults", "segfaults"), ("Raises", "raises"))
            for c in (config, other)]
    started = time.monotonic()
    results = warmup.run_pool(jobs, device="cpu", envs=[dict(__import__("os").environ)] * 2, budget_s=8,
                              log_path=tmp_path / "warmup.log")
    assert time.monotonic() - started < 60
    outcomes = {(r.backend, r.key): r.outcome for r in results}
    assert outcomes[("fine", config.key)] == outcomes[("fine", other.key)] == "ok"
    # one budget (both jobs may have started side by side), then the backend's jobs are skipped
    assert outcomes[("hangs", config.key)] == "timeout"
    assert outcomes[("hangs", other.key)] in ("timeout", "skipped")
    assert outcomes[("segfaults", config.key)] == outcomes[("segfaults", other.key)] == "crash"
    assert outcomes[("raises", config.key)] == "error"
    assert "no kernel" in next(r.message for r in results if r.backend == "raises")
    summary = warmup.summarize(results)
    assert summary["hangs"]["compile_s"] >= 8 and summary["fine"]["configs"] == 2


def test_jobs_that_share_a_build_never_run_side_by_side(tmp_path, misbehaving, monkeypatch):
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("CALLS", str(calls))
    spec = f"{misbehaving}:SharedBuild"
    backend = registry.resolve(spec)
    configs_ = [KernelConfig("float32", 16, None, h, h, "none", False, None) for h in (1, 2, 3)]
    jobs = [warmup.Job(spec, "shared-build", c, build=warmup._build_key(backend, c, "cpu")) for c in configs_]
    assert {job.build_key for job in jobs} == {"one build"}
    results = warmup.run_pool(jobs, device="cpu", envs=[dict(__import__("os").environ)] * 3, budget_s=60,
                              log_path=tmp_path / "warmup.log")
    assert [r.outcome for r in results] == ["ok"] * 3
    spans = sorted((float(a), float(b)) for _, a, b, *_ in (line.split() for line in calls.read_text().splitlines()))
    assert len(spans) >= 3 and all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:]))


@pytest.mark.skipif(not hasattr(os, "nice"), reason="process priorities are POSIX")
def test_jobs_of_a_backend_with_parallel_builds_run_at_a_lower_cpu_priority(tmp_path, misbehaving, monkeypatch):
    # FlashInfer's builds run nvcc on every core: at the priority of the other workers they starved FA4's,
    # flex's and triton-jfa's compiles (H200, 2026-12-06). Its jobs run in processes of lower priority, and
    # a worker slot that takes an ordinary job afterwards is an ordinary process again.
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("CALLS", str(calls))
    spec = f"{misbehaving}:SharedBuild"
    base = os.nice(0)
    config = lambda h: KernelConfig("float32", 16, None, h, h, "none", False, None)  # noqa: E731
    jobs = [warmup.Job(spec, "background", config(1), build="b1", background=True),
            warmup.Job(spec, "background", config(2), build="b1", background=True),
            warmup.Job(spec, "plain", config(3), build="p1")]
    results = warmup.run_pool(jobs, device="cpu", envs=[dict(os.environ)], budget_s=60,
                              log_path=tmp_path / "warmup.log")
    assert [r.outcome for r in results] == ["ok"] * 3
    lines = [line.split() for line in calls.read_text().splitlines()]
    seen = {(int(heads), int(nice)) for _, _, _, nice, heads, _, _ in lines}
    assert seen == {(1, base + warmup.BACKGROUND_NICE), (2, base + warmup.BACKGROUND_NICE), (3, base)}
    # a worker is a session of its own: where the kernel schedules sessions as groups (autogroup), the
    # process's niceness ranks it only inside its group, so the group's niceness is lowered too
    groups = {int(heads): group for _, _, _, _, heads, group, _ in lines}
    if groups[3] != "-":
        assert int(groups[1]) == int(groups[2]) == int(groups[3]) + warmup.BACKGROUND_NICE


def test_parallel_builds_run_a_few_at_a_time_each_on_its_share_of_the_cores(tmp_path, misbehaving, monkeypatch):
    # four fa3 builds at once on the H200 ran some 70 nvcc processes (one per core each) and the kernel killed
    # one for memory; now at most cpu_count // 8 run at once, each told its share of the cores (MAX_JOBS)
    assert warmup.parallel_builds(16) == (2, 8) and warmup.parallel_builds(2) == (1, 2)
    assert warmup.parallel_builds(128) == (16, 8)
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.delenv("MAX_JOBS", raising=False)
    spec = f"{misbehaving}:SharedBuild"
    config = lambda h: KernelConfig("float32", 16, None, h, h, "none", False, None)  # noqa: E731
    jobs = [warmup.Job(spec, "background", config(h), build=f"b{h}", background=True) for h in (1, 2, 3)]
    jobs.append(warmup.Job(spec, "plain", config(4), build="p4"))
    results = warmup.run_pool(jobs, device="cpu", envs=[dict(os.environ)] * 3, budget_s=60,
                              log_path=tmp_path / "warmup.log", builds_at_once=(1, 5))
    assert [r.outcome for r in results] == ["ok"] * 4
    lines = [line.split() for line in calls.read_text().splitlines()]
    spans: dict[int, list[float]] = {}
    for _, start, end, _, heads, _, _ in lines:
        span = spans.setdefault(int(heads), [float(start), float(end)])
        span[0], span[1] = min(span[0], float(start)), max(span[1], float(end))
    builds = sorted(spans[h] for h in (1, 2, 3))
    assert all(later[0] >= earlier[1] for earlier, later in zip(builds, builds[1:]))  # one at a time
    assert {(int(heads), jobs_) for _, _, _, _, heads, _, jobs_ in lines} == {(1, "5"), (2, "5"), (3, "5"), (4, "-")}
    # a parallel build waiting for its turn does not hold up the others: the plain job did not wait for them
    assert spans[4][0] < builds[-1][0]


def test_flashinfer_declares_parallel_builds_where_it_compiles():
    from backends.flashinfer import FlashInfer, FlashInferCudnn, FlashInferFA3
    assert FlashInfer().capabilities.parallel_build and FlashInferFA3().capabilities.parallel_build
    assert not FlashInferCudnn().capabilities.parallel_build
    assert not Capabilities().parallel_build


def test_a_shared_build_counts_once_and_its_other_jobs_go_after_the_builds():
    config = lambda h, dtype="float16": KernelConfig(dtype, 64, None, h, h, "none", False, None)  # noqa: E731
    fi = [warmup.Job("fi", "fi", config(h), build="m1") for h in (1, 2, 3)]
    fi.append(warmup.Job("fi", "fi", config(1, "bfloat16"), build="m2"))
    auto = [warmup.Job("auto", "auto", config(h), build="m1") for h in (1, 2)]
    x = [warmup.Job("x", "x", config(h)) for h in (1, 2)]
    # each job measured 100 s (FlashInfer's lock waits included), x's two 120 s each
    seconds = {f"{j.backend} | {j.config.key}": 100.0 for j in fi + auto}
    seconds.update({f"x | {j.config.key}": 120.0 for j in x})
    ordered = warmup.order(fi + auto + x, seconds)
    names = [(j.backend, j.build_key) for j in ordered]
    # auto: one build, 100 s; fi: two builds, 200 s (not 400); x: 240 s. auto makes m1 and fi's m1 jobs
    # follow it, after fi's own build m2
    assert names == [("auto", "m1"), ("auto", "m1"), ("fi", "m2"), ("fi", "m1"), ("fi", "m1"), ("fi", "m1"),
                     ("x", f"x | {config(1).key}"), ("x", f"x | {config(2).key}")]
    # a job whose build another process is making waits; the next one goes instead
    assert warmup.next_job(ordered, set()) == 0
    assert warmup.next_job(ordered, {"m1"}) == 2
    assert warmup.next_job(ordered[:2], {"m1"}) is None


def test_a_second_run_skips_what_the_first_compiled(tmp_path, misbehaving):
    cache_dir = tmp_path / "cache"
    argv = ["run", "--report-dir", str(tmp_path), "-q", "-n", "2", "--warmup", "--cache-dir", str(cache_dir),
            "--backend", f"{misbehaving}:NarrowFine", "--backend", f"{misbehaving}:NarrowRaises",
            "-k", "single_token", "--timeout", "60"]
    cli.main([*argv, "--name", "first"])
    cli.main([*argv, "--name", "second"])
    first, second = (json.loads((tmp_path / n / "report.json").read_text()) for n in ("first", "second"))
    for name, outcomes in (("narrow-fine", {"ok"}), ("narrow-raises", {"error"})):
        assert {w["outcome"] for w in first["backends"][name]["time"]["warmup"]} == outcomes
    assert {w["outcome"] for w in second["backends"]["narrow-fine"]["time"]["warmup"]} == {"cached"}
    assert second["backends"]["narrow-fine"]["time"]["compile_s"] == 0
    # what failed to compile is not tried again under the same fingerprint: the error is recalled, with its
    # message; the checks meet it themselves, and their verdicts do not change
    recalled = second["backends"]["narrow-raises"]["time"]["warmup"]
    assert {w["outcome"] for w in recalled} == {"error"} and {w["seconds"] for w in recalled} == {0.0}
    assert all("no kernel for this configuration" in w["message"] and "not tried again" in w["message"]
               for w in recalled)
    assert [r["outcome"] for r in first["records"]] == [r["outcome"] for r in second["records"]]
    # a change to what the kernels depend on (here: the fingerprint) compiles, and tries, everything again
    data = json.loads((cache_dir / manifest.MANIFEST).read_text())
    assert set(data["seconds"]) == set(next(iter(data["compiled"].values())))  # what compiled, timed
    data["compiled"] = {"another-fingerprint": next(iter(data["compiled"].values()))}
    data["failed"] = {"another-fingerprint": next(iter(data["failed"].values()))}
    (cache_dir / manifest.MANIFEST).write_text(json.dumps(data))
    cli.main([*argv, "--name", "third"])
    third = json.loads((tmp_path / "third" / "report.json").read_text())
    assert {w["outcome"] for w in third["backends"]["narrow-fine"]["time"]["warmup"]} == {"ok"}
    tried = third["backends"]["narrow-raises"]["time"]["warmup"]
    assert {w["outcome"] for w in tried} == {"error"} and not any("not tried again" in w["message"] for w in tried)


def test_checks_run_beside_the_warm_up_and_wait_only_for_their_own_backend(tmp_path, misbehaving, monkeypatch):
    # the reference compiles nothing: its checks start while slow-compile compiles; slow-compile's checks wait
    # for its warm-up, and the wait (about 10 s) is not charged to their 4 s timeout
    ends = tmp_path / "warm-ends.txt"
    monkeypatch.setenv("COMPILE_S", "10")
    monkeypatch.setenv("WARM_ENDS", str(ends))
    argv = ["run", "--report-dir", str(tmp_path), "-q", "-n", "2", "--warmup", "--cache-dir", str(tmp_path / "c"),
            "--backend", "reference", "--backend", f"{misbehaving}:SlowCompile", "-k", "test_forward or test_lse",
            "--timeout", "4", "--name", "beside"]
    assert cli.main(argv) == 0
    report = json.loads((tmp_path / "beside" / "report.json").read_text())
    warm_done = max(float(line) for line in ends.read_text().split())
    ran = [r for r in report["records"] if r["outcome"] == "pass"]
    slow = [r for r in ran if r["backend"] == "slow-compile"]
    reference = [r for r in ran if r["backend"] == "reference"]
    assert slow and reference
    assert min(r["started_at"] for r in reference) < warm_done  # checked while the other backend compiled
    assert min(r["started_at"] for r in slow) >= warm_done  # not before its own warm-up ended
    assert {w["outcome"] for w in report["backends"]["slow-compile"]["time"]["warmup"]} == {"ok"}
    assert report["run"]["warmup"]["ran"] and report["run"]["checks"]["busy_s"] > 0


def test_the_checks_that_would_wait_go_last_in_each_share():
    from conformance.check_order import gated_last, worksteal_shares
    order = [5, 0, 3, 1, 4, 2, 6]
    gated = [i in (5, 1, 6) for i in range(7)]
    assert worksteal_shares(7, 2) == [3, 4]
    assert gated_last(order, gated, 2) == [0, 3, 5, 4, 2, 1, 6]  # shares [5, 0, 3] and [1, 4, 2, 6]
    assert gated_last(order, [False] * 7, 3) == order
    assert sorted(gated_last(order, gated, 4)) == sorted(order)


def test_warmup_opens_the_cheapest_gates_first_and_starts_each_backends_longest_compiles_first():
    config = lambda d: KernelConfig("float32", d, None, 1, 1, "none", False, None)  # noqa: E731
    jobs = [warmup.Job("a", "a", config(16)), warmup.Job("a", "a", config(32)), warmup.Job("b", "b", config(16)),
            warmup.Job("b", "b", config(32)), warmup.Job("c", "c", config(16))]
    key = lambda job: (job.name, job.config.head_dim)  # noqa: E731
    # nothing known: backends interleaved
    assert [key(j) for j in warmup.order(jobs)] == [("a", 16), ("b", 16), ("c", 16), ("a", 32), ("b", 32)]
    # an unknown job of a known backend is expected to take that backend's mean, one of an unknown backend
    # the mean of everything (here 10 + 1 + 40 over 3 = 17): a 11 s in all, c 17 s, b 80 s
    seconds = {f"a | {config(16).key}": 1.0, f"a | {config(32).key}": 10.0, f"b | {config(16).key}": 40.0}
    assert [key(j) for j in warmup.order(jobs, seconds)] == [("a", 32), ("a", 16), ("c", 16), ("b", 16), ("b", 32)]
    # a cold cache: the backends' declared compile costs order them (b, declaring none, expects 0 s);
    # measured seconds still win over them
    priors = {"a": 2.0, "b": None, "c": 30.0}
    assert [key(j) for j in warmup.order(jobs, None, priors)] == [("b", 16), ("b", 32), ("a", 16), ("a", 32), ("c", 16)]
    assert [key(j) for j in warmup.order(jobs, seconds, priors)] == [("a", 32), ("a", 16), ("c", 16), ("b", 16), ("b", 32)]


def test_a_manifest_in_an_unknown_format_is_ignored(tmp_path):
    (tmp_path / manifest.MANIFEST).write_text(json.dumps({"0123abcd": ["a | float32 d16 h1:1 none"]}))
    assert manifest.load(tmp_path, "0123abcd") == set() and manifest.load_seconds(tmp_path) == {}


def test_with_timings_the_warm_up_builds_their_shapes_last_and_outside_the_gate(tmp_path, misbehaving, monkeypatch):
    # --bench: the warm-up also compiles the configurations of the timings' shapes (benchmarks.py) that the
    # checks' list lacks, after every check configuration and without holding the checks at the gate; the
    # timings then meet compiled kernels, and the next run finds them in the manifest
    from conformance.benchmarks import shapes
    monkeypatch.setenv("CALLS", str(tmp_path / "calls.txt"))
    argv = ["run", "--report-dir", str(tmp_path), "-q", "-n", "1", "--warmup", "--bench", "--cache-dir",
            str(tmp_path / "c"), "--backend", f"{misbehaving}:TimedCompile", "-k", "single_token"]
    cli.main([*argv, "--name", "timed"])
    report = json.loads((tmp_path / "timed" / "report.json").read_text())
    jobs = report["backends"]["timed-compile"]["time"]["warmup"]
    for_checks = [j["key"] for j in jobs if j.get("for") is None]
    for_timings = [j["key"] for j in jobs if j.get("for") == "timings"]
    wanted = {configs.KernelConfig.of(p).key for p in shapes("cpu").values()} - set(for_checks)
    assert wanted and set(for_timings) == wanted and len(for_timings) == len(wanted)
    assert {j["outcome"] for j in jobs} == {"ok"}
    assert [j.get("for") for j in jobs] == [None] * len(for_checks) + ["timings"] * len(for_timings)  # last
    assert "timed-compile" in report["run"]["warmup"]["ready_s"]  # its gate opened with its checks' jobs
    assert report["run"]["benchmarks"] == "ok" and {t["backend"] for t in report["timings"]} == {"timed-compile"}
    cli.main([*argv, "--name", "again"])
    again = json.loads((tmp_path / "again" / "report.json").read_text())
    assert {j["outcome"] for j in again["backends"]["timed-compile"]["time"]["warmup"]} == {"cached"}


def test_the_timings_jobs_go_last_and_open_no_gate():
    def job(backend, dim, gate=True):
        return warmup.Job(backend, backend, configs.KernelConfig("float32", dim, None, 1, 1, "none", False, None),
                          gate=gate)
    jobs = [job("a", 64, gate=False), job("a", 16), job("b", 16), job("b", 32, gate=False)]
    for ordered in (warmup.order(jobs), warmup.order(jobs, {"a | float32 d16 h1:1 none": 9.0}, {"b": 1.0})):
        assert [j.gate for j in ordered] == [True, True, False, False]
    plan = warmup.Plan(jobs, [jobs[0], jobs[2], jobs[3]], [], {}, "print", set(), {})
    assert plan.warming() == {"b"}  # a's only job still to run is for the timings: its checks need not wait


def test_the_warm_up_skips_backends_that_compile_nothing(tmp_path, misbehaving):
    # the reference declares compile_s = 0 (float64 torch: nothing a cache could keep); a backend that declares
    # nothing is warmed up
    argv = ["run", "--report-dir", str(tmp_path), "-q", "-n", "1", "--warmup", "--cache-dir", str(tmp_path / "c"),
            "--backend", "reference", "--backend", f"{misbehaving}:NarrowFine", "-k", "single_token",
            "--name", "skip"]
    cli.main(argv)
    report = json.loads((tmp_path / "skip" / "report.json").read_text())
    assert report["backends"]["reference"]["time"]["warmup"] == []
    assert {w["outcome"] for w in report["backends"]["narrow-fine"]["time"]["warmup"]} == {"ok"}


def test_the_warm_up_runs_the_sizes_a_backend_declares_its_kernels_change_at(monkeypatch):
    # a backend whose compiled kernels change with problem size (a persistent grid past the SM count, a kernel
    # for long sequences) declares those sizes; the warm-up runs them for every configuration, broadcast-Q
    # ones with a short dense query block per sequence
    from conformance.backend import Backend
    from conformance.problem import Output

    calls = []

    class SizeAware(Backend):
        name = "size-aware"
        capabilities = Capabilities(broadcast_q="native", backward=False,
                                    warmup_lengths=(((5, 300), (7, 300)),))

        def forward(self, args):
            calls.append((tuple(args.seqlens_q), tuple(args.seqlens_k), args.broadcast_q))
            out = torch.zeros(args.q.shape[0] * (len(args.seqlens_k) if args.broadcast_q else 1), args.q.shape[1],
                              args.v.shape[2], dtype=args.q.dtype)
            return Output(out, torch.zeros(args.q.shape[1], out.shape[0]))

    dense = KernelConfig("float32", 16, None, 2, 1, "none", False, None)
    warmup.warm(SizeAware(), dense, "cpu")
    assert [c[:2] for c in calls] == [(q, k) for q, k in warmup.WARM_LENGTHS] + [((5, 300), (7, 300))]
    calls.clear()
    warmup.warm(SizeAware(), KernelConfig("float32", 16, None, 2, 1, "none", True, None), "cpu")
    broadcast = [c for c in calls if c[2]]
    assert [c[1] for c in broadcast] == [k for _, k in warmup.WARM_LENGTHS] + [(7, 300)]
    assert all(len(set(q)) == 1 and len(q) == len(k) for q, k, _ in broadcast)
    assert len(calls) == 2 * len(broadcast)  # and each replicated (native broadcast-Q is checked against it)


def test_the_warm_up_builds_a_configuration_whose_usual_lengths_the_backend_refuses():
    # FlashInfer refuses causal attention with more queries than keys in a sequence, so it refused every
    # broadcast-Q problem of the usual warm-up (4 or 17 query rows beside sequences of 1 and 3 keys); the
    # H200 run of 2026-12-06 then built two JIT modules (bf16, head dim 256) inside checks, 100+ s each
    from conformance.backend import Backend
    from conformance.problem import Output

    calls = []

    class KeysCoverQueries(Backend):
        name = "keys-cover-queries"
        capabilities = Capabilities(broadcast_q="emulated", backward=False)

        def not_supported_reasons(self, problem):
            reasons = super().not_supported_reasons(problem)
            if problem.causal == "bottom_right" and any(q > k for q, k in zip(problem.seqlens_q, problem.seqlens_k)):
                reasons.append("more queries than keys under causal masking")
            return reasons

        def forward(self, args):
            calls.append((tuple(args.seqlens_q), tuple(args.seqlens_k)))
            out = torch.zeros(args.q.shape[0], args.q.shape[1], args.v.shape[2], dtype=args.q.dtype)
            return Output(out, torch.zeros(args.q.shape[1], out.shape[0]))

    causal_bq = KernelConfig("float32", 16, None, 2, 1, "bottom_right", True, None)
    assert all(KeysCoverQueries().not_supported_reasons(p) for p in warmup.warm_problems(causal_bq))
    warmup.warm(KeysCoverQueries(), causal_bq, "cpu")
    assert calls and all(q <= k for qs, ks in calls for q, k in zip(qs, ks))
    # the usual problems still come first where the backend takes them: nothing changes for the others
    calls.clear()
    warmup.warm(KeysCoverQueries(), dataclasses.replace(causal_bq, causal="none"), "cpu")
    assert len(calls) == len(warmup.WARM_LENGTHS) and any(q > k for qs, ks in calls for q, k in zip(qs, ks))


@pytest.mark.parametrize("bad", [((1, 2), (1,)), ((), ()), ((1, -1), (1, 1)), [(1,), (1,)], ((1.5,), (1,))])
def test_malformed_warmup_lengths_name_the_field(bad):
    with pytest.raises(ValueError, match=r"warmup_lengths\[0\]"):
        Capabilities(warmup_lengths=(bad,))


def test_triton_jfa_warms_up_past_its_size_switches_on_a_gpu(monkeypatch):
    # on a GPU: one sequence past the Gluon forward's key split, one short of it (the Gluon kernels' deal is
    # a runtime flag, so many tiles need no warm-up of their own); under the interpreter nothing compiles
    from backends.triton_jfa import TritonJfa
    from kernels.config import default as kernel_config

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert TritonJfa().capabilities.warmup_lengths == ()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    (q, k), = TritonJfa().capabilities.warmup_lengths
    assert q == k and min(k) < kernel_config().gluon_split_keys <= max(k)


def test_the_warm_up_calls_the_forward_with_and_without_gradients():
    # a graph compiler (torch.compile: flex) builds one graph for inputs that need gradients and another for
    # those that do not; forward-only checks run the second, so the warm-up compiles both
    from conformance.backend import Backend
    from conformance.problem import Output

    seen = []

    class Recording(Backend):
        name = "recording"
        capabilities = Capabilities(broadcast_q="none")

        def forward(self, args):
            seen.append(args.q.requires_grad)
            out = (args.q[..., :1] * 0).expand(-1, -1, args.v.shape[2]) + args.v.sum() * 0
            return Output(out, torch.zeros(args.q.shape[1], args.q.shape[0]))

    warmup.warm(Recording(), KernelConfig("float32", 16, None, 2, 1, "none", False, None), "cpu")
    assert seen == [True, False] * len(warmup.WARM_LENGTHS)
    seen.clear()

    class ForwardOnly(Recording):
        capabilities = Capabilities(broadcast_q="none", backward=False)

    warmup.warm(ForwardOnly(), KernelConfig("float32", 16, None, 2, 1, "none", False, None), "cpu")
    assert seen == [False] * len(warmup.WARM_LENGTHS)


def test_the_live_view_says_what_compiles_and_who_waits_for_it(tmp_path):
    from rich.console import Console

    from conformance import recorder
    from conformance.live import LiveView, WarmupView
    config = lambda d: KernelConfig("float32", d, None, 1, 1, "none", False, None)  # noqa: E731
    jobs = [warmup.Job("fa4", "fa4", config(16)), warmup.Job("fa4", "fa4", config(32)),
            warmup.Job("flex", "flex", config(16))]
    view = WarmupView(Console(file=open(tmp_path / "out", "w")), jobs, enabled=False)
    assert view.status() == "fa4 0/2; flex 0/1"
    view.started(0, jobs[0])
    view.started(1, jobs[1])
    assert view.status() == f"fa4 0/2 (compiling {config(16).key}, +1 more); flex 0/1"
    view.finished(warmup.Result("fa4", config(16).key, "ok", 3.0, worker=0))
    view.finished(warmup.Result("fa4", config(32).key, "ok", 4.0, worker=1))
    assert view.status() == "flex 0/1"
    view.finished(warmup.Result("flex", config(16).key, "ok", 1.0))
    assert view.status() == ""
    # a worker at a gate says so in its flight file, and the live view reads it
    class Config:
        def getoption(self, name, default=None):
            return str(tmp_path) if name == "jfa_flight_dir" else default
    recorder.note_waiting(Config(), "fa4")
    live = LiveView(Console(file=open(tmp_path / "out2", "w")), enabled=False, flight_dir=tmp_path)
    worker = __import__("os").environ.get("PYTEST_XDIST_WORKER", "main")
    assert live.running_now().startswith(f"{worker} waiting for fa4's warm-up")


def test_the_warm_up_ends_with_the_checks(tmp_path, misbehaving, monkeypatch):
    # -k leaves slow-compile's checks out: the run does not wait for its 60 s of compiling
    monkeypatch.setenv("COMPILE_S", "60")
    monkeypatch.setenv("WARM_ENDS", str(tmp_path / "ends"))
    started = time.monotonic()
    argv = ["run", "--report-dir", str(tmp_path), "-q", "-n", "1", "--warmup", "--cache-dir", str(tmp_path / "c"),
            "--backend", "reference", "--backend", f"{misbehaving}:SlowCompile", "-k", "test_forward[reference]",
            "--name", "cut"]
    cli.main(argv)  # (exit status 1: slow-compile has no check that ran, "supports nothing")
    assert time.monotonic() - started < 50
    report = json.loads((tmp_path / "cut" / "report.json").read_text())
    assert {w["outcome"] for w in report["backends"]["slow-compile"]["time"]["warmup"]} == {"skipped"}
    assert [r["outcome"] for r in report["records"] if r["backend"] == "reference"] == ["pass"]


def test_a_warm_up_that_fails_releases_every_gate(tmp_path):
    gate_dir = tmp_path / "warming"
    gates.open_gates(gate_dir, {"fa4", "flex"})

    def broken(stop, checks_over):
        raise RuntimeError("the warm-up could not start")
    warming = warmup.Beside(broken, gate_dir, {"fa4", "flex"})
    with pytest.raises(RuntimeError, match="could not start"):
        warming.join()
    assert gates.wait_for_gate(gate_dir, "fa4") == 0.0 and not gates.gate_path(gate_dir, "flex").exists()
    assert gates.gated_backends(gate_dir) == {"fa4", "flex"}  # the order the workers collected stays as it was


def test_a_vendor_package_upgrade_recompiles_that_vendors_kernels_only(tmp_path):
    config = lambda d: KernelConfig("float32", d, None, 1, 1, "none", False, None)  # noqa: E731
    old = [warmup.Job("fa4", "fa4", config(16), "flash-attn-4=4.0.0b36"), warmup.Job("flex", "flex", config(16))]
    results = [warmup.Result(j.name, j.config.key, "ok", 7.0, "") for j in old]
    manifest.save(tmp_path, "common", old, results, set())
    done = manifest.load(tmp_path, "common")
    assert manifest.split_done(old, done)[0] == []  # the same versions: nothing to compile
    upgraded = [warmup.Job("fa4", "fa4", config(16), "flash-attn-4=4.0.0b37"), old[1]]
    todo, cached = manifest.split_done(upgraded, done)
    assert [j.name for j in todo] == ["fa4"] and [r.backend for r in cached] == ["flex"]
    # the last compile seconds are the backend's and configuration's, whatever the versions: they order the
    # upgrade's jobs
    assert manifest.load_seconds(tmp_path) == {f"fa4 | {config(16).key}": 7.0, f"flex | {config(16).key}": 7.0}


def test_a_compiler_killed_by_the_system_is_tried_again_and_a_compile_error_is_not(tmp_path):
    # on the H200 an fa3 build with ~70 nvcc processes on the machine lost one to the out-of-memory killer:
    # "Ninja build failed ... FAILED: [code=137]"; kept as FlashInfer's compile error, the next run with the
    # same fingerprint would not have tried it again
    config = lambda d: KernelConfig("float16", d, None, 1, 1, "none", False, None)  # noqa: E731
    jobs = [warmup.Job("fi", "fi", config(d)) for d in (64, 128, 256)]
    killed = "RuntimeError: Ninja build failed. Ninja output:\n[1/11] nvcc ...\nFAILED: [code=137] /cache/x.cuda.o"
    results = [warmup.Result("fi", config(64).key, "error", 560.0, killed),
               warmup.Result("fi", config(128).key, "error", 12.0, "RuntimeError: Ninja build failed ... "
                                                                  "FAILED: [code=1] error: identifier undefined"),
               warmup.Result("fi", config(256).key, "error", 3.0, "MLIRError: Operation creation failed")]
    manifest.save(tmp_path, "common", jobs, results, set())
    failed = manifest.load_failed(tmp_path, "common")
    todo, settled = manifest.split_done(jobs, set(), failed)
    assert [j.config.head_dim for j in todo] == [64]
    assert sorted(r.key for r in settled) == sorted([config(128).key, config(256).key])
    # a manifest written before this rule, listing the killed build, is read the same way
    data = json.loads((tmp_path / manifest.MANIFEST).read_text())
    data["failed"]["common"]["old-killed"] = ["error", killed]
    (tmp_path / manifest.MANIFEST).write_text(json.dumps(data))
    assert "old-killed" not in manifest.load_failed(tmp_path, "common")


def test_a_backends_packages_are_the_distributions_of_its_modules():
    import importlib.metadata
    assert manifest.package_versions(("hypothesis",)) == f"hypothesis={importlib.metadata.version('hypothesis')}"
    assert manifest.package_versions(("hypothesis.strategies", "hypothesis")) == manifest.package_versions(("hypothesis",))
    assert manifest.package_versions(("torch.nn.attention.flex_attention", "triton")) == ""  # in every fingerprint
    assert manifest.package_versions(("no_such_module_anywhere",)) == ""


def test_the_cute_dsl_counts_among_fa4s_packages(monkeypatch):
    import importlib.metadata
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda dist: "4.8.1" if dist == "nvidia-cutlass-dsl" else real(dist))
    assert "nvidia-cutlass-dsl=4.8.1" in manifest.package_versions(("flash_attn.cute", "cutlass"))


def test_the_warm_up_simulator_models_shared_builds(tmp_path, capsys):
    import importlib.util
    from types import SimpleNamespace

    path = Path(__file__).resolve().parent.parent / "tools" / "simulate_warmup_order.py"
    spec = importlib.util.spec_from_file_location("simulate_warmup_order", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)

    def job(backend, key, build=None):
        return SimpleNamespace(backend=backend, config=SimpleNamespace(key=key), build_key=build or f"{backend} | {key}",
                               gate=True)

    jobs = [job("fi", "a", "m"), job("fi", "b", "m"), job("x", "c"), job("x", "d")]
    seconds = {"fi | a": 100.0, "fi | b": 100.0, "x | c": 50.0, "x | d": 50.0}
    # held back, fi's second job loads m once it is made (4 s) while x's jobs use the other worker
    assert tool.gates(jobs, seconds, 2, 4.0, hold_back=True) == {"fi": 104.0, "x": 100.0}
    # started at once, it holds a worker while it waits for m, and x's jobs come after
    assert tool.gates(jobs, seconds, 2, 4.0, hold_back=False) == {"fi": 104.0, "x": 154.0}
    # a report whose warm-up built the timings' shapes too: those jobs open no gate, in either order
    report = {"backends": {"x": {"time": {"warmup": [
        {"key": "c", "seconds": 50.0}, {"key": "t", "seconds": 500.0, "for": "timings"}]}}}}
    (tmp_path / "report.json").write_text(json.dumps(report))
    assert tool.main([str(tmp_path / "report.json"), "--workers", "1"]) == 0
    assert re.search(r"warm-up order\s+50 s", capsys.readouterr().out)  # c first; the timings' job after it
