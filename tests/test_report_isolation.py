"""Nothing a backend does takes the run down: a segfault, a hang, a CUDA-style error and NaN output each
leave a complete report, with that backend marked crash / timeout / crash / fail and the others intact."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

from conformance import cli

MISBEHAVING = textwrap.dedent('''
    import ctypes
    import os
    import signal
    import time

    import torch
    from conformance.reference import Reference
    from conformance.problem import Output

    class Segfaults(Reference):
        name = "segfaults"
        def forward(self, args):
            if sum(args.seqlens_k) > 0:
                os.kill(os.getpid(), signal.SIGSEGV)
            return super().forward(args)

    class ReadsNull(Reference):
        name = "reads-null"
        def forward(self, args):
            ctypes.string_at(0)
            return super().forward(args)

    class Hangs(Reference):
        name = "hangs"
        def forward(self, args):
            time.sleep(3600)

    class CudaError(Reference):
        name = "cuda-error"
        def forward(self, args):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    class KillsContext(Reference):
        """Like a real device fault: the first problem with at least min_keys keys faults, and every later
        call in the same process fails too."""
        name = "kills-context"
        dead = False
        min_keys = 1
        def forward(self, args):
            cls = type(self)
            if cls.dead or sum(args.seqlens_k) >= cls.min_keys:
                cls.dead = True
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return super().forward(args)

    class StickyFault(KillsContext):
        """Gets one-key problems right, so a check run after its fault shows whether the fault leaked."""
        name = "sticky-fault"
        dead = False
        min_keys = 4

    class ReturnsNan(Reference):
        name = "returns-nan"
        def forward(self, args):
            result = super().forward(args)
            return Output(torch.full_like(result.out, float("nan")), result.lse)
''')


def test_crashes_hangs_device_errors_and_nan_each_leave_a_complete_report(tmp_path, capsys):
    module = tmp_path / "misbehaving.py"
    module.write_text(MISBEHAVING)
    backends = [f"{module}:{cls}" for cls in ("Segfaults", "ReadsNull", "Hangs", "CudaError", "KillsContext", "ReturnsNan")]
    argv = ["run", "--report-dir", str(tmp_path), "--name", "isolation", "-q", "-n", "2", "--max-examples", "2",
            "--timeout", "8", "-k", "test_forward or single_token and float32"]
    for backend in ["reference", *backends]:
        argv += ["--backend", backend]
    assert cli.main(argv) == 1

    report = json.loads((tmp_path / "isolation" / "report.json").read_text())
    assert report["run"]["stopped"] is None, "the run reached its end"
    # The hanging backend's second check times out too when both started before the first timed out;
    # started after it, containment probes the backend and reports the check not run, naming the hang.
    contained = [r for r in report["records"] if r["outcome"] == "not-run"]
    assert all(r["backend"] == "hangs" and "hung in" in r["reason"] for r in contained), contained
    assert report["run"]["complete"] == (not contained)
    outcomes: dict[str, set] = {}
    for r in report["records"]:
        outcomes.setdefault(r["backend"], set()).add(r["outcome"])
    assert outcomes.pop("hangs") in ({"timeout"}, {"timeout", "not-run"})
    assert outcomes == {"reference": {"pass"}, "segfaults": {"crash"}, "reads-null": {"crash"},
                        "cuda-error": {"crash"}, "kills-context": {"crash"}, "returns-nan": {"fail"}}
    assert len(report["records"]) == 7 * 2
    by_backend = {(r["backend"], r["feature"]): r for r in report["records"]}
    # The problem that triggered a crash or hang is recorded, read from the dead worker's flight file.
    edge = by_backend["segfaults", "edge_case:single_token"]
    assert edge["problem"]["seqlens_k"] == [1] and edge["problem"]["causal"] == "bottom_right"
    assert "died" in edge["reason"] and edge["problem_source"] == "running"
    assert by_backend["hangs", "forward"]["problem"] is not None
    assert "8 s" in by_backend["hangs", "forward"]["reason"]
    assert "CUDA error" in by_backend["cuda-error", "forward"]["reason"]
    # A device fault stops hypothesis at once: the problem named is the one that faulted, not a "shrunk"
    # one drawn after the context died (which would fail on any input, the empty batch included).
    fault = by_backend["kills-context", "forward"]
    assert sum(fault["problem"]["seqlens_k"]) > 0, fault
    assert fault["problem_source"] == "running" and "DeviceFault" in fault["message"]
    nan = by_backend["returns-nan", "forward"]
    assert nan["counterexample"].startswith("Problem(") and nan["budget_used"] == float("inf")
    # Each failure leaves a replay artifact and the one line that reruns exactly that check.
    assert nan["replay"]["command"].startswith("jfa-conformance replay ")
    # Paths are relative to the report directory, so the report can be moved; the script stands alone.
    run_dir = tmp_path / "isolation"
    assert (run_dir / "failures").is_dir() and (run_dir / nan["replay"]["artifact"]).exists()
    assert nan["replay"]["artifact"].startswith("failures/") and (run_dir / nan["replay"]["script"]).exists()
    assert nan["replay"]["command"] == f"jfa-conformance replay {nan['replay']['artifact']} --backend {module}:ReturnsNan"
    junit = (tmp_path / "isolation" / "junit.xml").read_text()
    assert junit.count("<testcase") >= 12
    out = capsys.readouterr().out
    assert "CRASH" in out and "TIMEOUT" in out


def test_a_device_fault_does_not_leak_into_the_next_check(tmp_path):
    # One worker runs the forward check (which faults) and then the single-token edge case (one key,
    # which this backend gets right): the edge case must run in a fresh process and pass.
    module = tmp_path / "misbehaving.py"
    module.write_text(MISBEHAVING)
    argv = ["run", "--report-dir", str(tmp_path), "--name", "sticky", "-q", "-n", "1", "--max-examples", "4",
            "--timeout", "20", "-k", "test_forward or single_token and float32",
            "--backend", f"{module}:StickyFault"]
    assert cli.main(argv) == 1
    report = json.loads((tmp_path / "sticky" / "report.json").read_text())
    outcomes = {r["feature"]: r["outcome"] for r in report["records"]}
    assert outcomes == {"forward": "crash", "edge_case:single_token": "pass"}, outcomes


def test_a_librarys_argument_status_is_the_backends_error_not_a_device_fault():
    # cuDNN / cuBLAS name a bad argument or an unsupported request before launching anything: the context is
    # intact, so the check records the backend's error as a failure (hypothesis may shrink it), not a crash
    import pytest

    from conformance.harness import DeviceFault, call_backend, device_error
    from conformance.problem import Problem, make_inputs
    from conformance.reference import Reference

    bad_param = ("execute(handle, plan->get_raw_desc(), variant_pack_descriptor.get_ptr()) failed with message: "
                 "varPackPtrs[io_uid_idx] == nullptr, and code: CUDNN_STATUS_BAD_PARAM_NULL_POINTER")
    assert device_error(bad_param) is None
    assert device_error("CUBLAS_STATUS_INVALID_VALUE when calling cublasGemmEx") is None
    assert device_error("CUDNN_STATUS_EXECUTION_FAILED") == "CUDNN_STATUS_"
    assert device_error("CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx") == "CUBLAS_STATUS_"
    assert device_error(f"{bad_param}; then CUDA error: an illegal memory access") == "CUDA error"

    class Refuses(Reference):
        def __init__(self, message):
            self.message = message

        def forward(self, args):
            raise RuntimeError(self.message)

    args = make_inputs(Problem((3,), (4,)))
    with pytest.raises(RuntimeError, match="BAD_PARAM_NULL_POINTER"):
        call_backend(Refuses(bad_param), args)
    with pytest.raises(DeviceFault, match="illegal memory access"):
        call_backend(Refuses("CUDA error: an illegal memory access was encountered"), args)
