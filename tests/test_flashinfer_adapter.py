"""The FlashInfer adapters on a CPU machine, against a stand-in ``flashinfer`` module.

The stand-in keeps the real wrapper's contract: ``plan()`` takes the layout and options, ``run()`` computes
from what was planned (bottom-right causal, the planned scale) and returns the LSE FlashInfer's way, base 2
and ``[rows, Hq]``. So a wrong argument, a skipped conversion or a stale plan shows up as an oracle failure.
"""
from __future__ import annotations

import importlib.machinery
import json
import math
import sys
import types

import pytest
import torch

from backends import flashinfer as fi
from conformance import registry
from conformance import cli, oracle
from conformance.harness import Unsupported, judge_forward, run_backend
from conformance.problem import AttentionArgs, Problem, make_inputs

NAMES = {"flashinfer": "auto", "flashinfer-fa2": "fa2", "flashinfer-fa3": "fa3", "flashinfer-cudnn": "cudnn"}
INF = float("inf")


class StandInWrapper:
    """``BatchPrefillWithRaggedKVCacheWrapper`` in plain torch, recording every construction and plan."""

    log: list = []  # replaced per test by the fixture

    def __init__(self, float_workspace_buffer, kv_layout="NHD", backend="auto"):
        self.workspace, self.kv_layout, self.backend, self.planned = float_workspace_buffer, kv_layout, backend, None
        self.log.append(("init", self))

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None, *,
             causal=False, pos_encoding_mode="NONE", logits_soft_cap=None, sm_scale=None,
             q_data_type=torch.float16, kv_data_type=None):
        int(torch.diff(kv_indptr).max())  # the real plan() takes this maximum too: an empty batch fails here
        self.planned = dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, num_qo_heads=num_qo_heads,
                            num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk, head_dim_vo=head_dim_vo, causal=causal,
                            pos_encoding_mode=pos_encoding_mode, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                            q_data_type=q_data_type, kv_data_type=kv_data_type)
        self.log.append(("plan", self))

    def run(self, q, k, v, return_lse=False):
        p = self.planned
        assert q.shape[0] == int(p["qo_indptr"][-1]) and k.shape[0] == int(p["kv_indptr"][-1])
        assert (q.shape[1], k.shape[1], q.shape[2], v.shape[2]) == \
            (p["num_qo_heads"], p["num_kv_heads"], p["head_dim_qk"], p["head_dim_vo"])
        assert q.dtype == p["q_data_type"] and k.dtype == p["kv_data_type"]
        scale = p["sm_scale"] if p["sm_scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
        args = AttentionArgs(q, k, v, p["qo_indptr"], p["kv_indptr"], int(torch.diff(p["qo_indptr"]).max()),
                             int(torch.diff(p["kv_indptr"]).max()), "bottom_right" if p["causal"] else "none", scale)
        exact = oracle.attention(args)
        out = exact.out.to(q.dtype)
        lse = (exact.lse / math.log(2.0)).float().transpose(0, 1).contiguous()  # base 2, [rows, Hq]
        return (out, lse) if return_lse else out


@pytest.fixture
def stand_in(monkeypatch):
    module = types.ModuleType("flashinfer")
    module.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None)
    module.BatchPrefillWithRaggedKVCacheWrapper = type("Wrapper", (StandInWrapper,), {"log": []})
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    return module.BatchPrefillWithRaggedKVCacheWrapper.log


def _plans(log):
    return [w.planned for kind, w in log if kind == "plan"]


# -- what `jfa-conformance list` says --------------------------------------------------------------------

@pytest.mark.parametrize("name", list(NAMES))
def test_adapters_load_and_declare(name):
    backend = registry.resolve(name)
    assert backend.name == name and backend.implementation == NAMES[name]
    caps = backend.capabilities
    assert caps.dtypes == ("float16", "bfloat16") and caps.head_dims == (64, 128, 256)
    assert not caps.backward and caps.lse and caps.broadcast_q == "emulated" and not caps.value_dim_differs
    assert caps.causal_modes == ("none", "bottom_right")


def test_list_names_the_missing_package(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # find_spec answers None: not installed
    assert cli.main(["list", "--device", "cuda", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    for name in NAMES:
        assert not rows[name]["available"]
        assert rows[name]["reason"] == "the Python module 'flashinfer' is not installed"


@pytest.fixture
def hopper_with_tools(monkeypatch, tmp_path, stand_in):
    """A CUDA machine as the reasons see it: sm_90, nvcc under CUDA_HOME, ninja on PATH."""
    (tmp_path / "bin").mkdir()
    for tool in ("nvcc", "ninja"):
        (tmp_path / "bin" / tool).write_text("#!/bin/sh\n")
        (tmp_path / "bin" / tool).chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    capability = {"value": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability["value"])
    return tmp_path, capability


def test_reasons_on_cuda(hopper_with_tools, monkeypatch):
    tmp_path, capability = hopper_with_tools
    cudnn = types.SimpleNamespace(__spec__=importlib.machinery.ModuleSpec("cudnn", None))
    monkeypatch.setitem(sys.modules, "cudnn", cudnn)
    assert all(registry.resolve(name).unavailable_reason("cuda") is None for name in NAMES)
    capability["value"] = (10, 0)
    assert "sm_90 (Hopper) only; this GPU is sm_100" in fi.FlashInferFA3().unavailable_reason("cuda")
    assert fi.FlashInferFA2().unavailable_reason("cuda") is None
    capability["value"] = (7, 5)
    assert "compute capability >= 8.0" in fi.FlashInfer().unavailable_reason("cuda")
    capability["value"] = (9, 0)
    (tmp_path / "bin" / "ninja").unlink()
    (tmp_path / "bin" / "nvcc").unlink()
    reason = fi.FlashInferFA2().unavailable_reason("cuda")
    assert reason.startswith("FlashInfer compiles its kernels at first use") and "nvcc or ninja" in reason
    assert fi.FlashInferCudnn().unavailable_reason("cuda") is None  # cuDNN builds nothing with nvcc
    monkeypatch.setitem(sys.modules, "cudnn", None)
    assert fi.FlashInferCudnn().unavailable_reason("cuda") == "the Python module 'cudnn' is not installed"


# -- declared limits ------------------------------------------------------------------------------------

def test_declared_refusals_are_readable():
    backend = fi.FlashInfer()
    ok = Problem((3, 5), (4, 5), heads_q=4, heads_kv=2, head_dim=64, dtype="bfloat16", causal="bottom_right")
    assert not backend.not_supported_reasons(ok)
    assert not backend.not_supported_reasons(ok.replace(seqlens_q=(9, 7), causal="none"))  # cross-attention
    assert not backend.not_supported_reasons(ok.replace(seqlens_q=(0, 5), seqlens_k=(4, 0), causal="none"))
    cases = {
        "empty batch": (ok.replace(seqlens_q=(), seqlens_k=()), "an empty batch is refused"),
        "causal Lq > Lk": (ok.replace(seqlens_q=(5, 5)), "more queries than keys"),
        "float32": (ok.replace(dtype="float32"), "dtype float32 is not supported"),
        "head dim": (ok.replace(head_dim=40), "head_dim 40 is not supported"),
        "Dv != D": (ok.replace(head_dim_v=128), "value head dim different"),
        "top-left": (ok.replace(causal="top_left"), "causal mode 'top_left' is not supported"),
    }
    for label, (problem, words) in cases.items():
        reasons = backend.not_supported_reasons(problem)
        assert any(words in r for r in reasons), (label, reasons)


def test_no_backward_is_declared(stand_in):
    with pytest.raises(Unsupported, match="declares no backward"):
        run_backend(fi.FlashInfer(), Problem((2,), (2,), dtype="float16"), "cpu", gradients=True)


# -- what reaches FlashInfer, and what comes back ----------------------------------------------------------

@pytest.mark.parametrize("name", list(NAMES))
def test_plan_gets_the_layout_and_options(stand_in, name):
    problem = Problem((3, 0, 6), (5, 2, 6), heads_q=6, heads_kv=2, head_dim=128, dtype="bfloat16",
                      causal="bottom_right", scale=0.3)
    run_backend(registry.resolve(name), problem, "cpu")
    kind, wrapper = stand_in[0]
    assert kind == "init" and wrapper.kv_layout == "NHD" and wrapper.backend == NAMES[name]
    (plan,) = _plans(stand_in)
    for key, lengths in (("qo_indptr", [0, 3, 3, 9]), ("kv_indptr", [0, 5, 7, 13])):
        assert plan[key].dtype == torch.int32 and plan[key].device.type == "cpu" and plan[key].is_contiguous()
        assert plan[key].tolist() == lengths
    assert (plan["num_qo_heads"], plan["num_kv_heads"], plan["head_dim_qk"], plan["head_dim_vo"]) == (6, 2, 128, 128)
    assert plan["causal"] is True and plan["sm_scale"] == 0.3 and plan["pos_encoding_mode"] == "NONE"
    assert plan["logits_soft_cap"] == 0.0
    assert plan["q_data_type"] == plan["kv_data_type"] == torch.bfloat16


CASES = {
    "jagged_gqa_causal": Problem((5, 17, 1), (9, 17, 30), heads_q=4, heads_kv=2, head_dim=64, dtype="bfloat16",
                                 causal="bottom_right", seed=3),
    "cross_attention": Problem((12, 3), (4, 9), heads_q=3, heads_kv=1, head_dim=128, dtype="float16", scale=0.05),
    "queries_without_keys": Problem((3, 5, 2), (0, 4, 0), head_dim=64, dtype="float16"),
    "broadcast_q_emulated": Problem((6, 6, 6), (6, 11, 7), heads_q=2, heads_kv=2, head_dim=256, dtype="bfloat16",
                                    broadcast_q=True, causal="bottom_right"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_adapter_meets_the_oracle(stand_in, case):
    problem = CASES[case]
    verdicts = judge_forward(problem, run_backend(fi.FlashInfer(), problem, "cpu"))
    assert verdicts and all(v.ok for v in verdicts), [str(v) for v in verdicts if not v.ok]


def test_lse_conversion_by_value():
    log2_rows_heads = torch.tensor([[1.0, -INF], [2.0, 0.5], [0.0, -3.0]])  # [rows=3, Hq=2]
    lse = fi.natural_log_lse(log2_rows_heads)
    ln2 = math.log(2.0)
    assert lse.dtype == torch.float32 and lse.shape == (2, 3) and lse.is_contiguous()
    torch.testing.assert_close(lse, torch.tensor([[ln2, 2 * ln2, 0.0], [-INF, 0.5 * ln2, -3 * ln2]]))


def test_lse_conversion_is_what_makes_it_pass(stand_in):
    """Returning FlashInfer's LSE with only the transpose fails the LSE check (and only it): the check can fail."""
    class Base2(fi.FlashInfer):
        def forward(self, args):
            out = super().forward(args)
            return type(out)(out.out, out.lse / math.log(2.0))

    problem = CASES["jagged_gqa_causal"]
    verdicts = judge_forward(problem, run_backend(Base2(), problem, "cpu"))
    assert [v.quantity for v in verdicts if not v.ok] == ["lse"]


# -- plan caching -----------------------------------------------------------------------------------------

def test_plans_are_cached_per_layout_and_options(stand_in):
    backend = fi.FlashInferFA2(plan_cache_size=4, workspace_bytes=1024)
    problem = CASES["jagged_gqa_causal"]
    args = make_inputs(problem, "cpu")
    first = backend.forward(args)
    again = backend.forward(make_inputs(problem.replace(seed=9), "cpu"))  # same layout, other values
    assert len(_plans(stand_in)) == 1 and not torch.equal(first.out, again.out)
    backend.forward(args.replace(softmax_scale=0.3))
    backend.forward(args.replace(causal="none"))
    backend.forward(make_inputs(problem.replace(seqlens_q=(5, 17, 2), seqlens_k=(9, 17, 31)), "cpu"))
    assert len(_plans(stand_in)) == 4
    planned = _plans(stand_in)
    assert [p["sm_scale"] for p in planned[:2]] == [args.softmax_scale, 0.3] and planned[2]["causal"] is False
    workspaces = {id(w.workspace) for kind, w in stand_in if kind == "init"}
    assert len(workspaces) == 1  # one scratch buffer per device, shared by every plan

    backend.forward(args.replace(softmax_scale=0.7))  # a fifth plan evicts the least recently used, the first
    backend.forward(args.replace(softmax_scale=0.3))  # still cached
    assert len(_plans(stand_in)) == 5
    backend.forward(args)  # evicted: planned again
    assert len(_plans(stand_in)) == 6


def test_cache_sizes_are_checked():
    with pytest.raises(ValueError, match="plan_cache_size"):
        fi.FlashInfer(plan_cache_size=0)


def test_top_left_reaching_forward_is_refused(stand_in):
    args = make_inputs(Problem((3,), (3,), dtype="float16", causal="top_left"), "cpu")
    with pytest.raises(NotImplementedError, match="bottom-right"):
        fi.FlashInfer().forward(args)
    assert not stand_in
