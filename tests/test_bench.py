"""The benchmark's own parts do what they claim (CPU): padded SDPA against one SDPA call per sequence
(forward and gradients), the useful-FLOP count against a brute-force count, the interleaved rounds,
and the sweep's correctness column for backward configs."""
import json
import os
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kernels.bench import impl_sdpa, visible_pairs


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
    from kernels import bench
    calls = []

    def fake_time(make, shape, tensors, warmup=25, rep=100, backward=True):
        name = next(n for n, f in bench.IMPLS.items() if f is make)
        if name == "fa4":
            raise ImportError("no flash_attn here")
        calls.append(name)
        t = {"triton": [1.0, 3.0, 2.0], "sdpa": [4.0, 4.0, 4.0]}[name][sum(c == name for c in calls) - 1]
        return t, 2 * t if backward else float("nan"), tensors[0][:4].float()
    real_build = bench.build
    monkeypatch.setattr(bench, "build", lambda shape, D=128: real_build(shape, D=8, dtype=torch.float32, device="cpu"))
    monkeypatch.setattr(bench, "time_impl", fake_time)
    monkeypatch.setattr(bench, "warm_clocks", lambda seconds=0.5: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "test")
    monkeypatch.setattr(bench, "make_shapes", lambda: {"T": dict(desc="t", lq=np.array([3, 5]), lk=np.array([3, 5]),
                                                                  H=2, causal=False, bq=False)})
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
    from kernels import bench
    for argv, bad in ((["--impls", "triton-plan,triton-plan-gluon-fused-dims"], "triton-plan-gluon-fused-dims"),
                      (["--shapes", "S1,S5"], "S5"), (["--impls", "triton", "--once", "flexx"], "flexx")):
        with pytest.raises(SystemExit):
            bench.main(["--out", str(tmp_path)] + argv)
        err = capsys.readouterr().err
        assert f"unknown impls or shapes: {bad} (" in err


def test_rows_name_the_backward_that_ran(monkeypatch, tmp_path):
    # the real timing loop on a tiny problem under the interpreter (one call per timing): each triton row
    # names the dK/dV and dQ paths its backward took, so a variant that fell back cannot pass as itself
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("runs the kernels under the Triton interpreter only")
    import triton.testing
    from kernels import bench
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: (fn(), 1.0)[1])
    real_build = bench.build
    monkeypatch.setattr(bench, "build", lambda shape, D=128: real_build(shape, D=16, dtype=torch.float32, device="cpu"))
    monkeypatch.setattr(bench, "warm_clocks", lambda seconds=0.5: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "test")
    monkeypatch.setattr(bench, "make_shapes", lambda: {"T": dict(desc="t", lq=np.array([3, 5]), lk=np.array([4, 5]),
                                                                  H=2, causal=True, bq=False)})
    rows = bench.main(["--out", str(tmp_path), "--impls", "triton-plan,triton-plan-atomic,triton-plan-tl-dq",
                       "--shapes", "T"])
    by = {r["impl"]: r for r in rows}
    assert all("error" not in r for r in rows), rows
    assert by["triton-plan"]["bwd_path"] == "dK/dV triton; dQ separate; delta preprocess"
    assert by["triton-plan-atomic"]["bwd_path"] == "dK/dV triton; dQ atomic-element; delta preprocess"
    assert by["triton-plan-tl-dq"]["bwd_path"] == "dK/dV triton; dQ separate; delta preprocess"


def test_backward_sweep_rows_carry_their_difference_from_the_shipped_gradients(monkeypatch, tmp_path):
    # the sweep under the interpreter on a tiny float32 problem: every backward row is timed (a fake
    # clock) and compared with the shipped configuration's dQ / dK / dV
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("runs the kernels under the Triton interpreter only")
    from kernels import bench, jfa, sweep
    monkeypatch.setattr(jfa, "BWD_KV_KERNEL", "auto")
    monkeypatch.setattr(jfa, "BWD_Q_KERNEL", "auto")
    real_build = bench.build
    monkeypatch.setattr(sweep, "build", lambda shape: real_build(shape, D=16, dtype=torch.float32, device="cpu"))
    monkeypatch.setattr(sweep, "do_bench", lambda fn, **kw: (fn(), 1.0)[1])
    monkeypatch.setattr(sweep, "make_shapes", lambda: {"T": dict(desc="t", lq=np.array([20, 3]), lk=np.array([20, 3]),
                                                                   H=2, causal=True, bq=False)})
    monkeypatch.setattr(sweep, "KV", [(16, 32, 4, 1), (32, 16, 4, 1)])
    monkeypatch.setattr(sweep, "Q", [(16, 16, 4, 1)])
    sweep.main(["--out", str(tmp_path), "--shapes", "T", "--kinds", "kv,q"])
    rows = json.loads((tmp_path / "sweep.json").read_text())
    assert [r["kind"] for r in rows] == ["kv", "kv", "q"] and not any("error" in r for r in rows)
    assert all(0.0 <= r["maxdiff"] < 1e-4 for r in rows), rows  # float32: only summation order differs
    # each row ran the tl kernel it swept (on sm_90 "auto" would pick a Gluon one), and the switches are back
    assert [r["bwd_path"] for r in rows] == ["dK/dV triton; dQ separate; delta preprocess"] * 3, rows
    assert (jfa.BWD_KV_KERNEL, jfa.BWD_Q_KERNEL) == ("auto", "auto")


def test_profile_driver_runs_a_bench_shape_and_names_bad_arguments(monkeypatch, capsys):
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("runs the kernels under the Triton interpreter only")
    from kernels import bench, profile
    real_build = bench.build
    monkeypatch.setattr(bench, "build", lambda shape, D=128: real_build(shape, D=16, dtype=torch.float32, device="cpu"))
    monkeypatch.setattr(bench, "make_shapes", lambda: {"T": dict(desc="tiny", lq=np.array([20, 3]),
                                                                  lk=np.array([20, 3]), H=2, causal=True, bq=False)})
    profile.main(["--shape", "T", "--impl", "triton", "--backward"])
    assert ("profiled 2 x fwd+bwd of T (tiny) with triton; forward path ptr; backward dK/dV triton; dQ separate; "
            "delta preprocess" in capsys.readouterr().out)
    with pytest.raises(SystemExit, match="--shape must be one of"):
        profile.main(["--shape", "S9"])
    with pytest.raises(SystemExit, match="--impl must be one of"):
        profile.main(["--shape", "T", "--impl", "cuda"])


def test_profile_rounds_and_host_times_print_what_they_measured(monkeypatch, capsys):
    # --rounds: a line per round with its do_bench times; --host: host time per call and the backward's
    # cProfile table
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("runs the kernels under the Triton interpreter only")
    import triton.testing
    from kernels import bench, profile
    clock = iter([1.5, 2.5, 1.25, 2.25])
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: (fn(), next(clock))[1])
    real_build = bench.build
    monkeypatch.setattr(bench, "build", lambda shape, D=128: real_build(shape, D=16, dtype=torch.float32, device="cpu"))
    monkeypatch.setattr(bench, "make_shapes", lambda: {"T": dict(desc="tiny", lq=np.array([20, 3]),
                                                                  lk=np.array([20, 3]), H=2, causal=True, bq=False)})
    profile.main(["--shape", "T", "--impl", "triton", "--backward", "--rounds", "2", "--iters", "1"])
    out = capsys.readouterr().out
    assert "2 rounds of T (tiny) with triton" in out
    assert [line.split()[:3] for line in out.splitlines() if line.startswith("    ")] == [
        ["0", "1.500", "2.500"], ["1", "1.250", "2.250"]]
    profile.main(["--shape", "T", "--impl", "triton", "--host", "--calls", "2"])
    out = capsys.readouterr().out
    assert "T (tiny) with triton, 2 calls each:" in out
    assert re.search(r"^forward: host \d+\.\d{3} ms per call, host \+ GPU \d+\.\d{3} ms per call$", out, re.M)
    assert re.search(r"^backward: host \d+\.\d{3} ms per call", out, re.M)
    assert re.search(r"^ +\d+ function calls .* in \d+\.\d+ seconds$", out, re.M)  # the cProfile table
    for argv, name in ((["--rounds", "-1"], "--rounds"), (["--calls", "0"], "--calls"), (["--iters", "0"], "--iters")):
        with pytest.raises(SystemExit, match=f"{name} must be at least"):
            profile.main(["--shape", "T"] + argv)


def test_plan_impls_launch_what_the_full_call_launches():
    # the plan rows time the launches alone; their answers must be the full call's
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("runs the kernels under the Triton interpreter only")
    from kernels import bench
    shape = dict(desc="t", lq=np.array([20, 3]), lk=np.array([20, 3]), H=2, causal=True, bq=False)
    tensors = bench.build(shape, D=16, dtype=torch.float32, device="cpu")
    full = bench.IMPLS["triton"](shape, *tensors)()
    for name in ("triton-plan", "triton-tl-plan", "triton-gluon-plan", "triton-split1024-plan"):
        assert torch.equal(bench.IMPLS[name](shape, *tensors)(), full), name


def test_gpu_run_stages_name_only_known_impls_and_shapes():
    # kernels/gpu_run.sh spends GPU calls: a misspelt implementation or shape should fail here, on the CPU
    import re
    from kernels import bench
    script = open(os.path.join(os.path.dirname(bench.__file__), "gpu_run.sh")).read().replace("\\\n", "")
    variables = {}
    for name, value in re.findall(r"^\s*(\w+)=(\S+)$", script, re.M):
        for known, expanded in sorted(variables.items(), key=lambda kv: -len(kv[0])):
            value = value.replace("$" + known, expanded)
        variables[name] = value
    named = {"impls": [], "shapes": []}
    for option, value in re.findall(r"--(impls|fwd-only|once|shapes) (\S+)", script):
        for known, expanded in sorted(variables.items(), key=lambda kv: -len(kv[0])):
            value = value.replace("$" + known, expanded)
        named["shapes" if option == "shapes" else "impls"] += value.split(",")
    assert len(named["impls"]) > 30 and named["shapes"]  # the parse found the stages
    assert [n for n in named["impls"] if n not in bench.IMPLS] == []
    shapes = bench.make_shapes()
    assert [n for n in named["shapes"] if n not in shapes and not n.startswith("$")] == []
