"""The FlashInfer adapters on a CPU machine, against a stand-in ``flashinfer`` module.

The stand-in keeps the real wrapper's contract, as flashinfer-python 0.7.2.post1's ``flashinfer/prefill.py``
(``BatchPrefillWithRaggedKVCacheWrapper``) defines it: ``__init__``, ``plan()`` and ``run()`` have the real
parameter names, order and defaults and no ``**kwargs``, so a misspelt or invented keyword is a TypeError;
they raise where the real ones raise for this adapter's calls (unknown layout or LSE option, dtypes other
than planned, q rows other than ``qo_indptr[-1]``, an empty batch, cuDNN's options and its single-token
grouped-query LSE); ``run()`` computes from what was planned (bottom-right causal, the planned scale) and
returns ``(out, lse)`` with the LSE FlashInfer's way, base 2 and ``[rows, Hq]`` unless ``lse_base`` /
``lse_layout`` ask otherwise. So a wrong argument, a skipped conversion or a stale plan shows up as an
error or an oracle failure.

Index tensors are read as FlashInfer reads them: ``plan()`` takes host or device indptrs of either index
type, compiles for ``kv_indptr``'s type and reads ``qo_indptr`` as that type too (the stand-in asserts the
two agree), and its planner and kernels index every indptr through its data pointer, ignoring the stride
(flashinfer-ai/flashinfer#5260): the stand-in computes from what that reading gives and leaves the rows it
does not reach unwritten (NaN).
"""
from __future__ import annotations

import dataclasses

import importlib.machinery
import importlib.util
import inspect
import json
import math
import sys
import types

import pytest
import torch

from backends import flashinfer as fi
from conformance import registry
from conformance import cli, oracle
from conformance.harness import Run, Unsupported, judge_forward, run_backend
from conformance.problem import AttentionArgs, Problem, make_inputs
from test_adapter_layouts import CONTIGUOUS_OFFSETS, LAYOUTS, assert_meets_oracle, kernel_reads, laid_out, verdicts

NAMES = {"flashinfer": "auto", "flashinfer-fa2": "fa2", "flashinfer-fa3": "fa3", "flashinfer-cudnn": "cudnn"}
INF = float("inf")
# the backend= values the 0.7.2 wrapper's docstring lists
WRAPPER_BACKENDS = ("auto", "fa2", "fa3", "cudnn", "cutlass", "cute-dsl", "cute-dsl-prims", "cutile")
POS_ENCODING_MODES = ("NONE", "ROPE_LLAMA", "ALIBI")  # flashinfer.utils.PosEncodingMode


def _dtype(value):
    """flashinfer.utils.canonicalize_torch_dtype."""
    if isinstance(value, str):
        return getattr(torch, value)
    if isinstance(value, torch.dtype):
        return value
    raise TypeError(f"dtype must be a string or torch.dtype, got {type(value)}")


class StandInWrapper:
    """``BatchPrefillWithRaggedKVCacheWrapper`` in plain torch, recording every construction and plan."""

    log: list = []  # replaced per test by the fixture

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None,
                 jit_kwargs=None, variant_owns_mask=False):
        if kv_layout not in ("NHD", "HND"):
            raise KeyError(f"Invalid kv_layout {kv_layout}")
        if backend not in WRAPPER_BACKENDS:
            raise ValueError(f"Invalid backend: {backend}")
        assert not use_cuda_graph and jit_args is None and not variant_owns_mask, "not modelled by the stand-in"
        self.workspace, self.kv_layout, self.backend, self.planned = float_workspace_buffer, kv_layout, backend, None
        self.log.append(("init", self))

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
             rope_theta=None, q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True,
             prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None,
             fixed_split_size=None, disable_split_kv=False, seq_lens=None, seq_lens_q=None,
             max_token_per_sequence=None, max_sequence_kv=None, v_indptr=None, o_indptr=None, uniform_q_len=None):
        q_data_type = _dtype(q_data_type)
        kv_data_type = q_data_type if kv_data_type is None else _dtype(kv_data_type)
        o_data_type = q_data_type if o_data_type is None else _dtype(o_data_type)
        head_dim_vo = head_dim_qk if head_dim_vo is None else head_dim_vo
        logits_soft_cap = 0.0 if logits_soft_cap is None else logits_soft_cap
        if len(kv_indptr) != len(qo_indptr):
            raise ValueError("The kv_indptr length should be equal to mask_indptr length.")
        if pos_encoding_mode not in POS_ENCODING_MODES:
            raise KeyError(pos_encoding_mode)
        assert qo_indptr.dtype == kv_indptr.dtype, "one index type per module: qo_indptr is read as kv_indptr's"
        assert qo_indptr.dtype in (torch.int32, torch.int64)
        qo_host, kv_host = qo_indptr.to("cpu"), kv_indptr.to("cpu")
        max_kv_len = int(torch.diff(kv_host).max())  # the real plan() takes these maxima: an empty batch fails
        max_qo_len = int(torch.diff(qo_host).max())
        assert num_qo_heads % num_kv_heads == 0
        if self.backend == "cudnn":
            if (pos_encoding_mode != "NONE" or window_left != -1 or logits_soft_cap != 0
                    or custom_mask is not None or packed_custom_mask is not None or prefix_len_ptr is not None):
                raise NotImplementedError("cuDNN ragged prefill supports only causal or full attention without "
                                          "position encoding, window_left, logits_soft_cap or custom masks")
            max_token_per_sequence = max_qo_len if max_token_per_sequence is None else max_token_per_sequence
        # The stand-in computes plain softmax attention: an option that would change the result is not modelled.
        assert (pos_encoding_mode, window_left, logits_soft_cap, use_fp16_qk_reduction) == ("NONE", -1, 0.0, False)
        assert custom_mask is None and packed_custom_mask is None and prefix_len_ptr is None
        self.planned = dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, num_qo_heads=num_qo_heads,
                            num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk, head_dim_vo=head_dim_vo, causal=causal,
                            pos_encoding_mode=pos_encoding_mode, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                            q_data_type=q_data_type, kv_data_type=kv_data_type, o_data_type=o_data_type,
                            window_left=window_left, max_token_per_sequence=max_token_per_sequence,
                            qo_indptr_last=int(qo_host[-1]), max_kv_len=max_kv_len,
                            qo_read=kernel_reads(qo_indptr).to("cpu"), kv_read=kernel_reads(kv_indptr).to("cpu"))
        self.log.append(("plan", self))

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None, out=None, lse=None,
            return_lse=False, lse_base="log2", lse_layout="NH", enable_pdl=None, kv_cache_sf=None):
        p = self.planned
        if lse_base not in ("log2", "ln"):
            raise ValueError(f"lse_base must be one of ('log2', 'ln'), got {lse_base!r}")
        if lse_layout not in ("NH", "HN"):
            raise ValueError(f"lse_layout must be one of ('NH', 'HN'), got {lse_layout!r}")
        if q.dtype != p["q_data_type"] or k.dtype != p["kv_data_type"]:
            raise ValueError(f"q/k dtypes {q.dtype}/{k.dtype} do not match the planned "
                             f"{p['q_data_type']}/{p['kv_data_type']}")
        if q.size(0) != p["qo_indptr_last"]:
            raise ValueError(f"q.shape[0] ({q.size(0)}) does not match qo_indptr[-1] ({p['qo_indptr_last']}).")
        if self.backend == "cudnn" and return_lse and p["max_token_per_sequence"] == 1 and q.shape[1] != k.shape[1]:
            raise NotImplementedError("cuDNN's single-token (max q_len == 1) GQA kernel writes the LSE only for "
                                      "the first head of each kv group")
        # The FA2/FA3 kernels read strides 0 and 1 only (csrc/batch_prefill*.cu): a head dim without unit
        # stride would be misread there, so the stand-in refuses it outright.
        assert all(t.stride(-1) == 1 for t in (q, k, v)), "FlashInfer assumes a unit stride along the head dim"
        assert k.shape[0] == int(p["kv_indptr"][-1])
        assert (q.shape[1], k.shape[1], q.shape[2], v.shape[2]) == \
            (p["num_qo_heads"], p["num_kv_heads"], p["head_dim_qk"], p["head_dim_vo"])
        self.log.append(("run", (q, k, v)))
        scale = p["sm_scale"] if p["sm_scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
        out, lse = _attention_as_read(q, k, v, p["qo_read"], p["kv_read"], p["causal"], scale)
        out = out.to(p["o_data_type"])
        if not return_lse:
            return out
        lse = lse.float().transpose(0, 1).contiguous()  # natural log, [rows, Hq]
        if lse_base == "log2":
            lse = lse / math.log(2.0)
        return out, (lse if lse_layout == "NH" else lse.transpose(0, 1).contiguous())


def _attention_as_read(q, k, v, cu_q, cu_k, causal: bool, scale: float):
    """(out, natural-log lse [Hq, rows]) of a kernel driven by the offsets ``cu_q`` / ``cu_k`` as it read them:
    the rows they cover get attention, the others stay unwritten (NaN); offsets past the tensors would be an
    illegal memory access."""
    rows, covered, keys = q.shape[0], int(cu_q[-1]), int(cu_k[-1])
    if not (0 <= covered <= rows and 0 <= keys <= k.shape[0]) or (cu_q.diff() < 0).any() or (cu_k.diff() < 0).any():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    args = AttentionArgs(q[:covered], k[:keys], v[:keys], cu_q.to(q.device), cu_k.to(q.device),
                         int(cu_q.diff().max()), int(cu_k.diff().max()), "bottom_right" if causal else "none", scale)
    exact = oracle.attention(args)
    out = torch.full((rows, q.shape[1], v.shape[2]), float("nan"), dtype=exact.out.dtype)
    lse = torch.full((q.shape[1], rows), float("nan"), dtype=exact.lse.dtype)
    out[:covered], lse[:, :covered] = exact.out, exact.lse
    return out, lse


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
    # the JIT implementations declare their measured compile cost (the warm-up's order on an empty cache);
    # cuDNN compiles nothing a cache keeps, so the warm-up leaves it out and its checks start at once
    assert caps.compile_s == {"flashinfer": 85.0, "flashinfer-fa2": 32.0, "flashinfer-fa3": 90.0,
                              "flashinfer-cudnn": 0.0}[name]


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


def _cudnn_frontend(backend_version):
    """A stand-in ``cudnn`` module whose ``backend_version()`` is the given callable."""
    return types.SimpleNamespace(__spec__=importlib.machinery.ModuleSpec("cudnn", None),
                                 backend_version=backend_version)


def test_reasons_on_cuda(hopper_with_tools, monkeypatch):
    tmp_path, capability = hopper_with_tools
    monkeypatch.setitem(sys.modules, "cudnn", _cudnn_frontend(lambda: 92700))
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


def test_jit_honours_flashinfer_nvcc(hopper_with_tools, monkeypatch):
    """FlashInfer's JIT writes $FLASHINFER_NVCC into its ninja files in place of <CUDA home>/bin/nvcc."""
    tmp_path, _ = hopper_with_tools
    (tmp_path / "bin" / "nvcc").unlink()
    assert "cannot find nvcc" in fi.FlashInferFA2().unavailable_reason("cuda")
    (tmp_path / "wrapped-nvcc").write_text("#!/bin/sh\n")
    monkeypatch.setenv("FLASHINFER_NVCC", str(tmp_path / "wrapped-nvcc"))
    assert fi.FlashInferFA2().unavailable_reason("cuda") is None
    monkeypatch.setenv("FLASHINFER_NVCC", "ninja")  # a bare name is looked up on PATH
    assert fi.FlashInferFA2().unavailable_reason("cuda") is None
    monkeypatch.setenv("FLASHINFER_NVCC", str(tmp_path / "missing-nvcc"))
    assert "cannot find nvcc" in fi.FlashInferFA2().unavailable_reason("cuda")


def test_cudnn_frontend_that_cannot_load_cudnn_is_named(hopper_with_tools, monkeypatch):
    """FlashInfer's cuDNN graph path needs ``import cudnn`` to succeed and libcudnn behind it; without them it
    falls back to a cubin path this adapter cannot use, so the backend is unavailable, with the reason."""
    def no_library():
        raise RuntimeError("libcudnn.so.9: cannot open shared object file")

    monkeypatch.setitem(sys.modules, "cudnn", _cudnn_frontend(no_library))
    reason = fi.FlashInferCudnn().unavailable_reason("cuda")
    assert reason.startswith("the cuDNN frontend ('cudnn' module) cannot load cuDNN") and "libcudnn.so.9" in reason
    monkeypatch.setitem(sys.modules, "cudnn", _cudnn_frontend(lambda: 0))
    assert "reports no cuDNN library" in fi.FlashInferCudnn().unavailable_reason("cuda")
    assert fi.FlashInferFA2().unavailable_reason("cuda") is None  # only the cuDNN name needs the frontend


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


def test_cudnn_refuses_the_single_token_grouped_query_lse():
    """0.7.2's run() raises NotImplementedError on cuDNN for an LSE when max q_len == 1 and Hq != Hkv."""
    decode = Problem((1, 1, 0), (7, 3, 2), heads_q=4, heads_kv=2, head_dim=128, dtype="bfloat16")
    reasons = fi.FlashInferCudnn().not_supported_reasons(decode)
    assert len(reasons) == 1 and "one head per group" in reasons[0]
    for name in ("flashinfer", "flashinfer-fa2", "flashinfer-fa3"):
        assert not registry.resolve(name).not_supported_reasons(decode)
    for fine in (decode.replace(heads_q=2), decode.replace(seqlens_q=(2, 1, 0)),
                 decode.replace(seqlens_q=(0, 0, 0))):
        assert not fi.FlashInferCudnn().not_supported_reasons(fine), fine
    broadcast = Problem((1, 1), (5, 9), heads_q=8, heads_kv=1, dtype="float16", broadcast_q=True)
    assert fi.FlashInferCudnn().not_supported_reasons(broadcast)  # emulated: one query per sequence too


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


def test_stand_in_is_as_strict_as_the_library(stand_in):
    """The stand-in's methods take exactly the real parameters (no catch-all), and raise where 0.7.2 does."""
    wrapper_type = sys.modules["flashinfer"].BatchPrefillWithRaggedKVCacheWrapper
    for method in (wrapper_type.__init__, wrapper_type.plan, wrapper_type.run):
        kinds = {param.kind for param in inspect.signature(method).parameters.values()}
        assert inspect.Parameter.VAR_KEYWORD not in kinds, method
    workspace = torch.empty(16, dtype=torch.uint8)
    with pytest.raises(TypeError):
        wrapper_type(workspace, "NHD", backend="fa3", kv_layouts="NHD")
    with pytest.raises(KeyError):
        wrapper_type(workspace, "THD")
    with pytest.raises(ValueError, match="Invalid backend"):
        wrapper_type(workspace, "NHD", backend="flash")
    wrapper = wrapper_type(workspace, "NHD", backend="cudnn")
    cu_q, cu_k = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 3, 5], dtype=torch.int32)
    with pytest.raises(TypeError):
        wrapper.plan(cu_q, cu_k, 4, 2, 64, head_dim=64)
    with pytest.raises(NotImplementedError, match="logits_soft_cap"):
        wrapper.plan(cu_q, cu_k, 4, 2, 64, logits_soft_cap=30.0)
    with pytest.raises(RuntimeError):  # the maximum of no request length
        wrapper.plan(cu_q[:1], cu_k[:1], 4, 2, 64)
    wrapper.plan(cu_q, cu_k, 4, 2, 64, q_data_type=torch.float16)
    q, k = torch.randn(2, 4, 64, dtype=torch.float16), torch.randn(5, 2, 64, dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="single-token"):
        wrapper.run(q, k, k, return_lse=True)
    wrapper.run(q, k, k)  # without the LSE cuDNN serves it
    with pytest.raises(ValueError, match="does not match qo_indptr"):
        wrapper.run(q[:1], k, k)
    with pytest.raises(ValueError, match="do not match the planned"):
        wrapper.run(q.bfloat16(), k, k)
    with pytest.raises(TypeError):
        wrapper.run(q, k, k, return_lse=True, lse_format="ln")
    with pytest.raises(ValueError, match="lse_base"):
        wrapper.run(q, k, k, return_lse=True, lse_base="e")
    fa2 = wrapper_type(workspace, "NHD", backend="fa2")
    fa2.plan(cu_q, cu_k, 4, 2, 64, causal=True, q_data_type="float16")
    out, lse2 = fa2.run(q, k, k, return_lse=True)
    out_ln, lse_ln = fa2.run(q, k, k, return_lse=True, lse_base="ln", lse_layout="HN")
    assert out.shape == (2, 4, 64) and lse2.shape == (2, 4) and lse_ln.shape == (4, 2)
    torch.testing.assert_close(lse_ln, fi.natural_log_lse(lse2))


ACCEPTANCE = [
    Problem((1, 1, 0), (7, 3, 2), heads_q=4, heads_kv=2, head_dim=128, dtype="bfloat16"),  # grouped decode
    Problem((1, 1), (7, 3), heads_q=2, heads_kv=2, head_dim=64, dtype="float16", causal="bottom_right"),
    Problem((0, 0), (3, 4), heads_q=2, heads_kv=1, head_dim=64, dtype="float16"),  # no queries at all
    Problem((4, 2), (0, 6), heads_q=4, heads_kv=4, head_dim=256, dtype="bfloat16"),  # a sequence without keys
    Problem((5, 3), (5, 3), heads_q=2, heads_kv=1, head_dim=64, dtype="float16", causal="bottom_right"),
    Problem((5, 3), (4, 3), heads_q=2, heads_kv=1, head_dim=64, dtype="float16", causal="bottom_right"),
    Problem((), (), dtype="float16"),
]


@pytest.mark.parametrize("name", list(NAMES))
def test_every_accepted_problem_runs(stand_in, name):
    """What a name does not refuse, the (strict) stand-in computes, and the oracle accepts; no library
    refusal at run time."""
    backend = registry.resolve(name)
    accepted = 0
    for problem in ACCEPTANCE:
        if backend.not_supported_reasons(problem):
            continue
        accepted += 1
        verdicts = judge_forward(problem, run_backend(backend, problem, "cpu"))
        assert verdicts and all(v.ok for v in verdicts), (problem, [str(v) for v in verdicts if not v.ok])
    assert accepted >= 4


def test_inputs_without_a_unit_head_stride_are_copied(stand_in):
    """FlashInfer's FA2/FA3 kernels take strides 0 and 1 only; the adapter hands over unit-stride tensors."""
    problem = CASES["jagged_gqa_causal"]
    args = make_inputs(problem, "cpu")
    strided = args.replace(**{name: getattr(args, name).transpose(1, 2).contiguous().transpose(1, 2)
                              for name in ("q", "k", "v")})
    assert strided.q.stride(-1) != 1 and torch.equal(strided.q, args.q)
    expected, got = fi.FlashInfer().forward(args), fi.FlashInfer().forward(strided)
    assert torch.equal(got.out, expected.out) and torch.equal(got.lse, expected.lse)


# -- the caller's layouts ---------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", CONTIGUOUS_OFFSETS)
def test_caller_layouts(stand_in, layout):
    """int64 offsets and q, k, v of any row and head strides: what FlashInfer takes, handed over as they are."""
    args, _ = laid_out(CASES["jagged_gqa_causal"], LAYOUTS[layout])
    output = fi.FlashInfer().forward(args)
    assert_meets_oracle(args, Run(output.out, output.lse))
    (plan,) = _plans(stand_in)
    assert plan["qo_indptr"] is args.cu_seqlens_q and plan["kv_indptr"] is args.cu_seqlens_k
    ((_, given),) = [entry for entry in stand_in if entry[0] == "run"]
    assert all(passed is caller for passed, caller in zip(given, (args.q, args.k, args.v)))


def test_qo_indptr_takes_the_index_type_of_kv_indptr(stand_in):
    args, _ = laid_out(CASES["cross_attention"], LAYOUTS["int64_offsets"])
    args = args.replace(cu_seqlens_q=args.cu_seqlens_q.int())
    fi.FlashInfer().forward(args)
    (plan,) = _plans(stand_in)
    assert plan["qo_indptr"].dtype == torch.int64 and plan["qo_indptr"].tolist() == args.cu_seqlens_q.tolist()
    assert plan["kv_indptr"] is args.cu_seqlens_k


@pytest.mark.parametrize("layout", ["strided_offsets", "strided_int64_offsets"])
def test_strided_offsets_reach_flashinfer_as_given(stand_in, layout):
    """FlashInfer documents no contiguity requirement for its indptrs and reads them ignoring the stride
    (flashinfer-ai/flashinfer#5260): the adapter hands the views over, so the spec sees that reading fail."""
    args, _ = laid_out(CASES["jagged_gqa_causal"], LAYOUTS[layout])
    output = fi.FlashInfer().forward(args)
    (plan,) = _plans(stand_in)
    assert plan["qo_indptr"] is args.cu_seqlens_q and plan["kv_indptr"] is args.cu_seqlens_k
    assert not all(v.ok for v in verdicts(args, Run(output.out, output.lse)))


def test_plans_are_cached_per_indptr_layout(stand_in):
    backend = fi.FlashInfer()
    contiguous, _ = laid_out(CASES["jagged_gqa_causal"], LAYOUTS["int64_offsets"])
    strided, _ = laid_out(CASES["jagged_gqa_causal"], LAYOUTS["strided_int64_offsets"])
    backend.forward(contiguous)
    backend.forward(strided)  # equal values, other strides: its own plan
    backend.forward(contiguous)
    assert len(_plans(stand_in)) == 2


def test_the_first_plan_of_each_module_is_reported_as_a_build(stand_in):
    # plan() builds (or loads) the JIT module of the call's dtypes, head dims and index type once per process;
    # the adapter reports it so that a check that compiled says so (jit_watch.record_build)
    from conformance import jit_watch
    backend = fi.FlashInferFA2()
    contiguous, _ = laid_out(CASES["jagged_gqa_causal"], LAYOUTS["int64_offsets"])
    strided, _ = laid_out(CASES["jagged_gqa_causal"], LAYOUTS["strided_int64_offsets"])
    before = jit_watch.totals()
    backend.forward(contiguous)
    backend.forward(strided)  # a plan of its own, the same module
    built = jit_watch.since(before)
    assert built["reported"]["FlashInfer JIT modules"]["builds"] == 1 and len(_plans(stand_in)) == 2
    halved = dataclasses.replace(contiguous, q=contiguous.q.half(), k=contiguous.k.half(), v=contiguous.v.half())
    backend.forward(halved)  # another dtype: another module
    assert jit_watch.since(before)["reported"]["FlashInfer JIT modules"]["builds"] == 2
    # cuDNN compiles nothing its cache keeps: nothing is reported
    before = jit_watch.totals()
    fi.FlashInferCudnn().forward(contiguous)
    assert jit_watch.since(before) is None


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


# -- the real library, on a GPU (skipped elsewhere) -------------------------------------------------------
# What the stand-in cannot show: the JIT builds, FA3 being what `auto` picks on sm_90, cuDNN's graph path, the
# library's own LSE base and layout, rows without keys, zero-row batches. Needs flashinfer-python importable
# (tools/flashinfer-bundle.sh) and nvcc + ninja for the JIT names.

def _real_flashinfer_missing() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if importlib.util.find_spec("flashinfer") is None:
        return "needs flashinfer-python"
    return None


needs_real_flashinfer = pytest.mark.skipif(_real_flashinfer_missing() is not None,
                                           reason=_real_flashinfer_missing() or "")


@needs_real_flashinfer
def test_real_wrapper_conventions():
    """0.7.2's documented defaults, measured: ``(out, lse)``, lse base 2 ``[rows, Hq]``; `auto` picks FA3 on
    sm_90 for these dims; cuDNN refuses the single-token grouped-query LSE."""
    import flashinfer

    problem = Problem((3, 5), (7, 5), heads_q=4, heads_kv=2, head_dim=128, dtype="bfloat16",
                      causal="bottom_right")
    args = make_inputs(problem, "cuda")
    expected_lse = oracle.attention(args).lse.transpose(0, 1).float()  # CPU, natural log, [rows, Hq]
    workspace = torch.empty(fi.WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    cu_q, cu_k = args.cu_seqlens_q.cpu().int(), args.cu_seqlens_k.cpu().int()
    cudnn_ok = fi.cudnn_load_error() is None
    for backend in ("auto", "fa2", "fa3", "cudnn"):
        if (backend == "fa3" and torch.cuda.get_device_capability()[0] != 9) or (backend == "cudnn" and not cudnn_ok):
            continue
        wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=backend)
        wrapper.plan(cu_q, cu_k, 4, 2, 128, causal=True, sm_scale=args.softmax_scale,
                     q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        if backend == "auto" and torch.cuda.get_device_capability()[0] == 9:
            assert wrapper._backend == "fa3"  # determine_attention_backend on sm_90
        out, lse = wrapper.run(args.q, args.k, args.v, return_lse=True)
        assert out.shape == args.q.shape and lse.shape == (8, 4) and lse.dtype == torch.float32, backend
        torch.testing.assert_close((lse * math.log(2.0)).cpu(), expected_lse, atol=2e-2, rtol=0, msg=backend)
    if not cudnn_ok:
        return
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="cudnn")
    wrapper.plan(torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 3, 5], dtype=torch.int32), 4, 2, 128,
                 q_data_type=torch.bfloat16)
    q, k = (torch.randn(n, h, 128, dtype=torch.bfloat16, device="cuda") for n, h in ((2, 4), (5, 2)))
    with pytest.raises(NotImplementedError):
        wrapper.run(q, k, k, return_lse=True)


@needs_real_flashinfer
@pytest.mark.parametrize("name", list(NAMES))
def test_real_adapters_meet_the_oracle(name):
    backend = registry.resolve(name)
    reason = backend.unavailable_reason("cuda")
    if reason is not None:
        pytest.skip(reason)
    failures = []
    for problem in ACCEPTANCE + list(CASES.values()):
        if backend.not_supported_reasons(problem):
            continue
        try:  # every problem runs, so one GPU run names every failure
            verdicts = judge_forward(problem, run_backend(backend, problem, "cuda"))
        except Exception as exc:  # noqa: BLE001 - an undeclared refusal or a library error is a failure here
            failures.append((problem, f"{type(exc).__name__}: {exc}"))
            continue
        if not verdicts or not all(v.ok for v in verdicts):
            failures.append((problem, [str(v) for v in verdicts if not v.ok]))
    assert not failures, failures


@needs_real_flashinfer
@pytest.mark.parametrize("name", list(NAMES))
def test_real_adapters_under_caller_layouts(name):
    """int64 offsets on the device and row- or head-strided q, k, v, handed to the real library as they are.
    (Strided offsets are left out here: flashinfer-ai/flashinfer#5260 reports illegal memory accesses.)"""
    backend = registry.resolve(name)
    reason = backend.unavailable_reason("cuda")
    if reason is not None:
        pytest.skip(reason)
    failures = []
    for layout in CONTIGUOUS_OFFSETS:
        for problem in (CASES["jagged_gqa_causal"], CASES["cross_attention"]):
            if backend.not_supported_reasons(problem):
                continue
            args, _ = laid_out(problem, LAYOUTS[layout], "cuda")
            try:
                output = backend.forward(args)
            except Exception as exc:  # noqa: BLE001 - every layout runs, so one GPU run names every failure
                failures.append((layout, problem, f"{type(exc).__name__}: {exc}"))
                continue
            failed = [str(v) for v in verdicts(args, Run(output.out, output.lse)) if not v.ok]
            if failed:
                failures.append((layout, problem, failed))
    assert not failures, failures


def test_a_build_key_names_what_flashinfer_compiles(monkeypatch):
    from conformance.configs import KernelConfig

    def config(heads=(4, 2), causal="none", dtype="float16", head_dim=64, offsets="int32"):
        return KernelConfig(dtype, head_dim, None, *heads, causal, False, 0.3, offsets)

    fa2, fa3, auto = fi.FlashInferFA2(), fi.FlashInferFA3(), fi.FlashInfer()
    # heads, the mask and the scale are run-time arguments of one module
    assert fa3.build_key(config(), "cuda") == fa3.build_key(config((1, 1), "bottom_right"), "cuda")
    # dtype, head dims and index type select the module, and so does the path
    keys = {fa3.build_key(c, "cuda") for c in (config(), config(dtype="bfloat16"), config(head_dim=128),
                                               config(offsets="int64"))}
    assert len(keys) == 4 and fa2.build_key(config(), "cuda") != fa3.build_key(config(), "cuda")
    # auto builds fa3's modules on sm_90 and fa2's elsewhere
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert auto.build_key(config(), "cuda") == fa3.build_key(config(), "cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert auto.build_key(config(), "cuda") == fa2.build_key(config(), "cuda")
