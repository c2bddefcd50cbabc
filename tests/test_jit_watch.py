"""The seconds spent compiling inside checks (conformance/jit_watch.py: Triton kernels, torch.compile graphs)
reach the records and the reports: what shows, per check and per backend, what the warm-up did not prepare."""
from __future__ import annotations

import json
import textwrap

import pytest

from conformance import cli, jit_watch

pytest.importorskip("triton")

# A backend whose forward makes Triton's JIT hooks fire the way a first launch of a new kernel variant does
# (Triton calls them with these keywords around a compile or a load from its cache); under the interpreter
# no real launch compiles, so the hooks are called here directly.
BUILDS = textwrap.dedent('''
    import time
    import triton
    from triton import knobs
    from conformance.reference import Reference

    class Info:
        name = "kernels.tl._fwd_kernel"

    class BuildsKernels(Reference):
        name = "builds-kernels"
        calls = 0

        def forward(self, args):
            BuildsKernels.calls += 1
            if BuildsKernels.calls <= 2:  # two new variants, then every call finds them built
                key = ("variant", BuildsKernels.calls)
                fields = dict(key=key, repr="_fwd_kernel[num_warps=4](...)", fn=Info(), compile={},
                              is_manual_warmup=False, already_compiled=False)
                assert knobs.runtime.jit_cache_hook(**fields) is None  # (a true answer would skip the build)
                time.sleep(0.6)
                knobs.runtime.jit_post_compile_hook(**fields)
            return super().forward(args)

    class ReportsBuilds(Reference):
        name = "reports-builds"
        built = False

        def forward(self, args):
            from conformance import jit_watch
            if not ReportsBuilds.built:  # its own compiler, which no hook sees, builds once per process
                ReportsBuilds.built = True
                time.sleep(0.5)
                jit_watch.record_build("vendor modules", 0.5)
            return super().forward(args)

    class CompilesGraphs(Reference):
        name = "compiles-graphs"

        def forward(self, args):
            import torch
            # a graph per new input shape, as a torch.compile backend without dynamic shapes compiles
            torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)(args.q.new_zeros(args.q.shape[0] + 1))
            return super().forward(args)
''')


def test_kernels_built_inside_a_check_are_timed_and_reported(tmp_path, capsys):
    path = tmp_path / "builds.py"
    path.write_text(BUILDS)
    code = cli.main(["run", "--report-dir", str(tmp_path), "-q", "-n", "1", "--no-bench", "--name", "jit",
                     "--backend", f"{path}:BuildsKernels", "--backend", "reference", "-k", "test_forward"])
    assert code == 0
    run = tmp_path / "jit"
    report = json.loads((run / "report.json").read_text())
    built = {r["backend"]: r.get("jit") for r in report["records"]}
    assert built["reference"] is None  # it built nothing
    jit = built["builds-kernels"]
    assert jit["builds"] == 2 and jit["seconds"] >= 1.2 and "torch_compile" not in jit
    assert jit["triton"] == {"variants": 2, "seconds": jit["seconds"],
                             "kernels": {"_fwd_kernel": {"variants": 2, "seconds": jit["seconds"]}}}
    time = report["backends"]["builds-kernels"]["time"]
    assert time["check_jit_builds"] == 2 and time["check_jit_s"] == pytest.approx(jit["seconds"])
    assert report["backends"]["reference"]["time"]["check_jit_s"] == 0.0
    assert time["workers"] == 1 and time["first_call_s"] is None  # one worker tells no first call apart
    summary = (run / "summary.md").read_text()
    assert "compiling in checks s" in summary and "_fwd_kernel x2" in summary
    page = (run / "index.html").read_text()
    assert "checks that compiled" in page and "_fwd_kernel x2" in page
    printed = capsys.readouterr().out
    assert "compiling inside checks" in printed and "test_forward[builds-kernels]" in printed


def test_torch_compile_graphs_built_inside_a_check_are_counted(tmp_path):
    path = tmp_path / "builds.py"
    path.write_text(BUILDS)
    code = cli.main(["run", "--report-dir", str(tmp_path), "-q", "-n", "1", "--no-bench", "--name", "graphs",
                     "--backend", f"{path}:CompilesGraphs", "-k", "test_forward", "--max-examples", "3"])
    assert code == 0
    report = json.loads((tmp_path / "graphs" / "report.json").read_text())
    jit, = [r["jit"] for r in report["records"]]
    # one graph per new packed length among the examples (at least the first), and their seconds
    assert jit["torch_compile"]["graphs"] >= 1 and jit["builds"] == jit["torch_compile"]["graphs"]
    assert jit["seconds"] == jit["torch_compile"]["seconds"] > 0 and "triton" not in jit
    assert "torch.compile graphs x" in (tmp_path / "graphs" / "summary.md").read_text()


def test_builds_a_backend_reports_count_as_compiling_inside_checks(tmp_path):
    # FlashInfer's nvcc JIT is seen by no hook: on the H200 (2026-12-06) checks that built its modules took
    # 100+ s each while the report said 0 s of compiling in checks
    path = tmp_path / "builds.py"
    path.write_text(BUILDS)
    code = cli.main(["run", "--report-dir", str(tmp_path), "-q", "-n", "1", "--no-bench", "--name", "vendor",
                     "--backend", f"{path}:ReportsBuilds", "-k", "test_forward", "--max-examples", "3"])
    assert code == 0
    report = json.loads((tmp_path / "vendor" / "report.json").read_text())
    jit, = [r["jit"] for r in report["records"]]
    assert jit == {"reported": {"vendor modules": {"builds": 1, "seconds": 0.5}}, "seconds": 0.5, "builds": 1}
    assert report["backends"]["reports-builds"]["time"]["check_jit_s"] == 0.5
    assert "vendor modules x1" in (tmp_path / "vendor" / "summary.md").read_text()
    assert jit_watch.since(jit_watch.totals()) is None  # nothing since: nothing reported


def test_the_hooks_chain_with_hooks_installed_before_and_never_break_a_build(monkeypatch):
    from triton import knobs

    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **kw: seen.append(("theirs", kw["key"])) or True)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    monkeypatch.setattr(jit_watch, "_installed", False)
    monkeypatch.setattr(jit_watch, "_started", {})
    assert jit_watch.install()
    before = jit_watch.totals()
    # the hook installed before still answers (True: skip the build), and is still called
    assert knobs.runtime.jit_cache_hook(key="k", fn=None, repr="mine[num_warps=4](x)") is True
    assert seen == [("theirs", "k")]
    assert knobs.runtime.jit_post_compile_hook(key="k", fn=None, repr="mine[num_warps=4](x)") is None
    assert jit_watch.since(before)["triton"]["kernels"] == {"mine": {"variants": 1, "seconds": pytest.approx(0, abs=0.5)}}
    # malformed calls (another Triton's keywords) are ignored, never raised
    knobs.runtime.jit_post_compile_hook(unexpected=object())
    assert jit_watch.since(before)["triton"]["variants"] == 1
