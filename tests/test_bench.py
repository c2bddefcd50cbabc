"""The benchmark's own parts do what they claim (CPU): padded SDPA against one SDPA call per sequence
(forward and gradients), the useful-FLOP count against a brute-force count, the interleaved rounds, the
paths each triton row records, and the GPU script's stages naming only known implementations and shapes."""
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import bench  # noqa: E402  (tools/bench.py: a script, outside the packages)

impl_sdpa, visible_pairs = bench.impl_sdpa, bench.visible_pairs


def _per_sequence_sdpa(shape, q, k, v):
    lq, lk, outs, cq, ck = shape["lq"], shape["lk"], [], 0, 0
    for b in range(len(lk)):
        a, n = (int(lq[0]) if shape["bq"] else int(lq[b])), int(lk[b])
        qs = q[:a] if shape["bq"] else q[cq:cq + a]
        o = F.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in (qs, k[ck:ck + n], v[ck:ck + n])),
                                           is_causal=shape["causal"])
        outs.append(o[0].transpose(0, 1))
        cq, ck = cq + a, ck + n
    return torch.cat(outs)


@pytest.mark.parametrize("lq, lk, causal, bq", [
    ([5, 17, 33], [5, 17, 33], False, False),
    ([5, 17, 33], [5, 17, 33], True, False),
    ([20], [7, 40, 1], False, True),
    ([32, 32], [32, 32], True, False),  # dense: the is_causal path
])
def test_padded_sdpa_baseline_matches_per_sequence_sdpa(lq, lk, causal, bq):
    shape = dict(lq=np.array(lq), lk=np.array(lk), H=2, causal=causal, bq=bq)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(lq[0] if bq else sum(lq), 2, 16, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(sum(lk), 2, 16, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    got = impl_sdpa(shape, q, k, v, None, None)()
    want = _per_sequence_sdpa(shape, q, k, v)
    torch.testing.assert_close(got, want)
    do = torch.randn(got.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(got, (q, k, v), do), torch.autograd.grad(want, (q, k, v), do)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("causal", [False, True])
def test_visible_pairs_counts_bottom_right_causal_pairs(causal):
    lq, lk = np.array([3, 5, 4]), np.array([5, 5, 2])
    brute = sum(int(((np.arange(b)[None, :] <= np.arange(a)[:, None] + (b - a)) | (not causal)).sum())
                for a, b in zip(lq, lk))
    assert visible_pairs(lq, lk, causal, False) == brute
    assert visible_pairs(np.array([4]), lk, False, True) == 4 * int(lk.sum())


def test_rounds_are_interleaved_and_reported_as_median_and_spread(monkeypatch, tmp_path):
    # the timing loop without a GPU: fake timings per call, in the order the loop makes them
    calls = []

    def fake_time(make, shape, tensors, warmup=25, rep=100, backward=True):
        name = next(n for n, f in bench.IMPLS.items() if f is make)
        if name == "fa4":
            raise ImportError("no flash_attn here")
        calls.append(name)
        t = {"triton": [1.0, 3.0, 2.0], "sdpa": [4.0, 4.0, 4.0]}[name][sum(c == name for c in calls) - 1]
        return t, 2 * t if backward else float("nan"), tensors[0][:4].float()
    _tiny(monkeypatch)
    monkeypatch.setattr(bench, "time_impl", fake_time)
    monkeypatch.setattr(bench, "triton_paths", lambda name, shape, tensors: "paths")
    rows = bench.main(["--out", str(tmp_path), "--impls", "fa4,triton,sdpa", "--shapes", "T", "--rounds", "3"])
    assert calls == ["triton", "sdpa"] * 3  # interleaved; the failing impl is not retried
    by = {r["impl"]: r for r in rows}
    assert "error" in by["fa4"] and by["triton"]["fwd_ms_rounds"] == [1.0, 3.0, 2.0]
    assert by["triton"]["fwd_ms"] == 2.0 and by["triton"]["bwd_ms"] == 4.0 and by["sdpa"]["fwd_ms"] == 4.0
    table = (tmp_path / "bench.md").read_text()
    assert "| T | triton | 2.000 |" in table and "100% / 100%" in table and "0% / 0%" in table
    # --fwd-only: the forward is timed, the backward column says it was not
    calls.clear()
    rows = bench.main(["--out", str(tmp_path), "--impls", "triton,sdpa", "--shapes", "T", "--fwd-only", "sdpa"])
    assert calls == ["triton", "sdpa"]
    table = (tmp_path / "bench.md").read_text()
    assert "| T | sdpa | 4.000 | " in table and "| - | - |" in table and "| T | triton | 1.000 |" in table
    # --once: a slow baseline is timed in the first round only, the others in every round
    calls.clear()
    rows = bench.main(["--out", str(tmp_path), "--impls", "triton,sdpa", "--shapes", "T", "--rounds", "3",
                       "--once", "sdpa"])
    assert calls == ["triton", "sdpa", "triton", "triton"]
    by = {r["impl"]: r for r in rows}
    assert by["sdpa"]["fwd_ms_rounds"] == [4.0] and len(by["triton"]["fwd_ms_rounds"]) == 3


def test_unknown_impl_or_shape_is_refused_before_any_timing(tmp_path, capsys):
    for argv, bad in ((["--impls", "triton-plan,triton-plan-gluon-fused"], "triton-plan-gluon-fused"),
                      (["--shapes", "S1,S9"], "S9"), (["--impls", "triton", "--once", "flexx"], "flexx"),
                      (["--shapes", "S3s7"], "S3s7")):
        with pytest.raises(SystemExit):
            bench.main(["--out", str(tmp_path)] + argv)
        err = capsys.readouterr().err
        assert f"unknown impls or shapes: {bad} (" in err


def test_other_pareto_draws_of_s3_are_shapes_of_their_own():
    shapes = bench.make_shapes([1, 2])
    assert {"S3", "S3s1", "S3s2"} <= set(shapes)
    s3, a, b = (shapes[n]["lk"] for n in ("S3", "S3s1", "S3s2"))
    assert len(a) == len(b) == 512 and not np.array_equal(a, b) and not np.array_equal(a, s3)
    assert np.array_equal(bench.make_shapes([1])["S3s1"]["lk"], a)  # a seed is a fixed draw


def _tiny(monkeypatch):
    real_build = bench.build
    monkeypatch.setattr(bench, "build", lambda shape, D=128: real_build(shape, D=16, dtype=torch.float32, device="cpu"))
    monkeypatch.setattr(bench, "warm_clocks", lambda seconds=0.5: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "test")
    monkeypatch.setattr(bench, "make_shapes", lambda s3_seeds=(): {"T": dict(desc="t", lq=np.array([3, 5]),
                                                                            lk=np.array([4, 5]), H=2, causal=True,
                                                                            bq=False)})


def test_rows_name_the_kernels_that_ran(monkeypatch, tmp_path):
    # the real timing loop on a tiny problem under the interpreter (one call per timing): each triton row
    # names the kernels its calls ran, so a variant that fell back cannot pass as itself
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("runs the kernels under the Triton interpreter only")
    import triton.testing
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: (fn(), 1.0)[1])
    _tiny(monkeypatch)
    rows = bench.main(["--out", str(tmp_path), "--impls", "triton-plan,triton,triton-tl-plan", "--shapes", "T"])
    by = {r["impl"]: r for r in rows}
    assert all("error" not in r for r in rows), rows
    tl = "forward tl; dK/dV tl; dQ tl; delta preprocess"
    assert by["triton-plan"]["paths"] == by["triton"]["paths"] == \
        f"{tl} (no Gluon: the Triton interpreter does not run Gluon)"
    assert by["triton-tl-plan"]["paths"] == f"{tl} (no Gluon: Config.gluon is off)"


def test_plan_impls_launch_what_the_full_call_launches():
    # the plan rows time the launches alone; their answers must be the full call's
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("runs the kernels under the Triton interpreter only")
    shape = dict(desc="t", lq=np.array([20, 3]), lk=np.array([20, 3]), H=2, causal=True, bq=False)
    tensors = bench.build(shape, D=16, dtype=torch.float32, device="cpu")
    full = bench.IMPLS["triton"](shape, *tensors)()
    for name in ("triton-plan", "triton-tl-plan"):
        assert torch.equal(bench.IMPLS[name](shape, *tensors)(), full), name


def test_gpu_check_names_only_known_impls_and_shapes():
    # tools/gpu_check.sh spends GPU time: a misspelt implementation or shape should fail here
    script = open(os.path.join(os.path.dirname(bench.__file__), "gpu_check.sh")).read().replace("\\\n", "")
    named = {"impls": [], "shapes": [], "seeds": []}
    for option, value in re.findall(r"--(impls|once|shapes|s3-seeds) (\S+)", script):
        named["shapes" if option == "shapes" else "seeds" if option == "s3-seeds" else "impls"] += value.split(",")
    assert named["impls"] and named["shapes"]  # the parse found the stage
    assert [n for n in named["impls"] if n not in bench.IMPLS] == []
    shapes = bench.make_shapes([int(x) for x in named["seeds"]])
    assert [n for n in named["shapes"] if n not in shapes] == []
    assert sum(n.startswith("S3") for n in named["shapes"]) >= 3  # S3 on three Pareto draws


def test_s3_seeds_are_timed_even_where_the_shapes_do_not_name_them():
    # gpu_runs.sh's kernels stage passed --s3-seeds 1,2 with --shapes ...,S3 and timed one S3 draw only
    assert bench.run_shapes(["S4b", "S3", "S5"], [1, 2]) == ["S4b", "S3", "S3s1", "S3s2", "S5"]
    assert bench.run_shapes(["S1"], [7]) == ["S1", "S3s7"]
    assert bench.run_shapes(["S3s2", "S3"], [1, 2]) == ["S3s2", "S3", "S3s1"]  # named ones keep their place
    assert bench.run_shapes(["S1", ""], []) == ["S1"]


def test_the_head_dim_64_shape_is_timed_at_its_head_dim_and_leaves_the_others_unchanged():
    shapes = bench.make_shapes()
    assert shapes["S5"].get("D") == 64 and len(shapes["S5"]["lk"]) == 1024
    assert shapes["S5c"].get("D") == 64 and shapes["S5c"]["causal"] and shapes["S5c"]["lk"] is shapes["S5"]["lk"]
    # the small head dims: S6 / S6c at 32 (S6c causal), S7 at 16, on S5's lengths
    assert [shapes[n].get("D") for n in ("S6", "S6c", "S7")] == [32, 32, 16]
    assert [shapes[n]["causal"] for n in ("S6", "S6c", "S7")] == [False, True, False]
    assert all(shapes[n]["lk"] is shapes["S5"]["lk"] for n in ("S6", "S6c", "S7"))
    assert all("D" not in shapes[n] for n in ("S1", "S1c", "S2", "S3", "S4a", "S4b"))
    # its lengths come from a generator of its own: S1-S3's draws are what they were
    assert int(shapes["S1"]["lk"].sum()) == int(bench._uniform_lens(np.random.default_rng(bench.SEED), 1024, 1,
                                                                      1024).sum())


def _busy_validation(n):
    return sum(i * i for i in range(n))


def test_host_profile_names_where_a_call_spends_its_host_time():
    import time as _time

    slept = []

    def call():
        _busy_validation(20000)
        start = _time.perf_counter()
        _time.sleep(0.001)
        slept.append(_time.perf_counter() - start)
    synced = []
    top = bench.host_profile(call, calls=5, top=3, sync=lambda: synced.append(1))
    assert len(top) == 3 and len(synced) == 2
    where = [w for w, _ in top]
    assert any("time.sleep" in w for w in where) and any("_busy_validation" in w or "genexpr" in w for w in where), top
    sleep_us = dict(top)[next(w for w in where if "time.sleep" in w)]
    # per call, against what each sleep really took (a loaded CPU stretches them): a total would be 5x that
    per_call_us = 1e6 * sum(slept[-5:]) / 5
    assert 900 <= sleep_us and 0.5 * per_call_us <= sleep_us < 2 * per_call_us, (sleep_us, per_call_us)
    assert [us for _, us in top] == sorted((us for _, us in top), reverse=True)


def test_host_cost_is_per_call_and_the_table_shows_it(monkeypatch, tmp_path):
    import time as _time
    synced = []
    us, launches = bench.host_cost(lambda: _time.sleep(0.002), calls=5, sync=lambda: synced.append(1),
                                   count_launches=False)
    assert 2000 <= us < 20000 and launches is None and len(synced) == 2  # before and after the timed calls
    # --host: measured in the first round only and tabled beside the GPU time
    measured = []

    def fake_time(make, shape, tensors, warmup=25, rep=100, backward=True):
        return 1.0, 2.0, tensors[0][:4].float()

    def fake_host(make, shape, tensors):
        measured.append(make)
        return dict(fwd_host_us=900.0, fwd_launches=4, bwd_host_us=1500.0, bwd_launches=7)
    _tiny(monkeypatch)
    monkeypatch.setattr(bench, "time_impl", fake_time)
    monkeypatch.setattr(bench, "measure_host", fake_host)
    monkeypatch.setattr(bench, "triton_paths", lambda name, shape, tensors: "paths")
    bench.main(["--out", str(tmp_path), "--impls", "triton,sdpa", "--shapes", "T", "--rounds", "2", "--host"])
    assert len(measured) == 2
    assert "| T | triton | 1.000 | 900 | 4 | 2.000 | 1500 | 7 |" in (tmp_path / "bench.md").read_text()


def test_the_profiled_steps_run_what_the_direction_names():
    # tools/profile_kernels.py: the forward alone, the backward of one stored output, or both
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("runs the kernels under the Triton interpreter only")
    import profile_kernels
    shape = dict(desc="t", lq=np.array([9, 3]), lk=np.array([9, 3]), H=1, causal=True, bq=False)
    tensors = bench.build(shape, D=16, dtype=torch.float32, device="cpu")
    launches = {}
    for direction in profile_kernels.DIRECTIONS:
        step = profile_kernels.make_step("triton-plan", shape, tensors, direction)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step()
        launches[direction] = {e.key for e in prof.key_averages()}
    grad = "autograd::engine::evaluate_function"
    assert not any(k.startswith(grad) for k in launches["fwd"])
    assert any(k.startswith(grad) for k in launches["bwd"]) and any(k.startswith(grad) for k in launches["both"])


def test_the_profile_stage_names_known_shapes_and_impls():
    import profile_kernels
    script = open(os.path.join(os.path.dirname(bench.__file__), "gpu_check.sh")).read()
    stage = script[script.index("  ncu)"):]
    shapes = re.search(r"for shape in \$\{NCU_SHAPES:-([^}]+)\};", stage).group(1).split()
    impls = re.search(r"for impl in ([^;]+);", stage).group(1).split()
    for shape in shapes:
        for impl in impls:
            profile_kernels.parse(["--shape", shape, "--impl", impl])  # exits on an unknown name
    with pytest.raises(SystemExit):
        profile_kernels.parse(["--shape", "S9"])


def test_a_config_variant_is_timed_through_a_plan_in_the_same_rounds(monkeypatch, tmp_path, capsys):
    # --variant NAME=CONFIG: the A/B of a kernel change made as a Config field, beside the kernels as they are
    from kernels import Config
    monkeypatch.setattr(bench, "IMPLS", dict(bench.IMPLS))
    monkeypatch.setattr(bench, "VARIANTS", {})
    calls, made = [], []
    real_plan = bench.impl_triton_plan

    def plan(shape, q, k, v, cu_q, cu_k, config=None):
        made.append(config)
        return real_plan(shape, q, k, v, cu_q, cu_k, config=config)
    monkeypatch.setattr(bench, "impl_triton_plan", plan)

    def fake_time(make, shape, tensors, warmup=25, rep=100, backward=True):
        calls.append(next(n for n, f in bench.IMPLS.items() if f is make))
        if calls[-1].startswith("triton-plan:"):
            make(shape, *tensors)
        return 1.0, 2.0, tensors[0][:4].float()
    _tiny(monkeypatch)
    monkeypatch.setattr(bench, "time_impl", fake_time)
    monkeypatch.setattr(bench, "triton_paths", lambda name, shape, tensors: "paths")
    rows = bench.main(["--out", str(tmp_path), "--impls", "sdpa", "--shapes", "T", "--rounds", "2",
                       "--variant", "split0=gluon_split_keys=0,gluon_programs=3"])
    assert calls == ["sdpa", "triton-plan:split0"] * 2
    assert made == [Config(gluon_split_keys=0, gluon_programs=3)] * 2
    assert {r["impl"] for r in rows} == {"sdpa", "triton-plan:split0"}
    # a field the Config does not have is refused before any timing, by its name
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path), "--variant", "x=no_such_field=1"])
    assert "no_such_field" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path), "--variant", "gluon_split_keys"])  # no NAME=CONFIG
    assert "--variant takes NAME=FIELD=VALUE" in capsys.readouterr().err


def test_the_tox_stage_names_the_runner_packages_where_the_base_interpreter_reads():
    # gpu_runs.sh's tox stage writes a .pth naming the runner's packages for tox's env; written where the
    # base interpreter does not look (Ubuntu's Python reads dist-packages, not site-packages), it named nothing
    import subprocess
    script = (Path(bench.__file__).parent / "gpu_runs.sh").read_text()
    line = next(s.strip() for s in script.splitlines() if s.strip().startswith("site_dir=$("))
    base = subprocess.run(
        ["bash", "-c", line.replace("python3", sys.executable, 1) + '; echo "$site_dir"'],
        capture_output=True, text=True, check=True).stdout.strip()
    base_exe = getattr(sys, "_base_executable", sys.executable)
    read = subprocess.run([base_exe, "-c", "import site, sys; print('\\n'.join(site.getsitepackages() + sys.path))"],
                          capture_output=True, text=True, check=True).stdout.split("\n")
    # a site directory of the base interpreter (site.py reads its .pth files; the stage creates it if missing)
    assert base and base in read, (base, read)
    if os.path.isdir(base):
        assert base in subprocess.run([base_exe, "-c", "import sys; print('\\n'.join(sys.path))"],
                                      capture_output=True, text=True, check=True).stdout.split("\n")
