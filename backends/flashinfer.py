"""`flashinfer`, `flashinfer-fa2`, `flashinfer-fa3`, `flashinfer-cudnn`: FlashInfer's ragged prefill,
``flashinfer.BatchPrefillWithRaggedKVCacheWrapper`` (PyPI ``flashinfer-python``, written against 0.7.2.post1),
one name per implementation it offers on sm_90 (its ``backend=`` argument): ``auto`` (``fa3`` on Hopper for
the head dims FA3 is built for, ``fa2`` otherwise), ``fa2`` (sm_80+), ``fa3`` (sm_90 only) and ``cudnn``.

Conventions, from its sources (``flashinfer/prefill.py``, ``include/flashinfer/attention/``):

- Layout: q ``[total_q, Hq, D]`` and k/v ``[total_k, Hkv, D]`` (``kv_layout="NHD"``) with token offsets
  ``qo_indptr`` / ``kv_indptr``: the spec's packed layout as it is. The offsets are handed over as the
  caller gives them (device, int32 or int64, strides): ``plan()`` accepts host or device indptrs of either
  index type and documents no other requirement. One thing is structural: a compiled module has a single
  index type, taken from ``kv_indptr.dtype`` (``get_module_args`` in ``plan()``), and its planner reads
  ``qo_indptr`` as that type too, so ``qo_indptr`` is converted to ``kv_indptr``'s dtype when they differ.
  The planner and kernels read an indptr through its data pointer as if it were contiguous, with no check:
  a strided indptr gives wrong results (flashinfer-ai/flashinfer#5260), which the spec is there to see.
  An int64 indptr compiles a module of its own (the index type is part of the JIT module's name).
- Causal is bottom-right (the mask drops ``kv_idx + qo_len > kv_len + q_idx``; cuDNN is built with
  ``use_causal_mask_bottom_right``). Causal sequences with more queries than keys, whose first
  ``qo_len - kv_len`` rows see no key, are outside what FlashInfer tests: its test suites skip
  ``causal and qo_len > kv_len`` ("qo_len > kv_len not supported for causal attention"). Refused here; so is
  an empty batch (``plan()`` takes the maximum of the per-request lengths, which fails on none).
- LSE: ``run(..., return_lse=True)`` returns ``(out, lse)`` with lse base 2, ``[total_q, Hq]``
  (``max * scale * log2(e) + log2(sum)``; the defaults ``lse_base="log2"``, ``lse_layout="NH"``; cuDNN's
  natural-log stats are multiplied by log2(e) inside FlashInfer to match), converted here.
- cuDNN: the wrapper raises NotImplementedError for an LSE request when every sequence has at most one
  query and Hq != Hkv (cuDNN writes that LSE for one head per group only, NVBug 6783545 in FlashInfer's
  message). Refused by ``flashinfer-cudnn``. Its graph path needs the cuDNN frontend to import and load
  libcudnn; without it FlashInfer falls back to a cubin path that this call cannot use. Which engine runs
  is the frontend's choice: cudnn-frontend 1.32 ranks its own CuTe-DSL SDPA engines (one for sm_90, on by
  default) with libcudnn's when ``cutlass`` (nvidia-cutlass-dsl) imports, and offers libcudnn's alone
  when it does not, as in the bundle.
- float16 / bfloat16 only, head dims 64, 128, 256 with Dv == D: the dims FlashInfer's tests cover and,
  with (192, 128), the only ones FA3's prefill kernels are built for. FA2 would compile others, each
  (dtype, D, Dv) a build of minutes, so all four names keep to the common set.
- Forward only (inference kernels: no backward); broadcast-Q is emulated (q's rows must equal
  ``qo_indptr[-1]``; there is no dense-q form). The FA2/FA3 kernels take the token and head strides of
  q, k and v (``csrc/batch_prefill.cu`` reads ``stride(0)`` and ``stride(1)``) and have no parameter for a
  head-dim stride, so only a tensor whose last stride is not 1 is copied; the others pass as they are
  (the cuDNN path declares all three strides to its graph).

Kernels of ``auto``/``fa2``/``fa3`` are compiled by FlashInfer's JIT (nvcc and ninja) at the first call of
each (implementation, dtype, head dims); later calls in any process load them from its cache
(``FLASHINFER_WORKSPACE_BASE``). The JIT runs ``$FLASHINFER_NVCC`` when set, else nvcc under the CUDA
home it finds (``CUDA_HOME``, ``CUDA_PATH``, the nvcc on PATH, ``/usr/local/cuda``), and ``ninja`` from
PATH. ``tools/flashinfer-bundle.sh`` packs it all for an offline runner.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import math
import os
import shutil
import time
from collections import OrderedDict

import torch

from conformance import jit_watch
from conformance.backend import Backend, Capabilities
from conformance.problem import AttentionArgs, Output, Problem

HEAD_DIMS = (64, 128, 256)
WORKSPACE_BYTES = 256 * 1024 * 1024  # FlashInfer's split-KV scratch; it recommends 128 MB, serving stacks use more
PLAN_CACHE_SIZE = 8  # planned wrappers kept per backend (a check replays one layout several times)


def natural_log_lse(lse_log2: torch.Tensor) -> torch.Tensor:
    """FlashInfer's LSE (base 2, ``[rows, Hq]``) as the spec's: natural log, float32, ``[Hq, rows]``."""
    return (lse_log2.float() * math.log(2.0)).transpose(0, 1).contiguous()


def _nvcc() -> str:
    """The nvcc FlashInfer's JIT runs: $FLASHINFER_NVCC, else bin/nvcc under $CUDA_HOME or $CUDA_PATH, else
    the one on PATH, else /usr/local/cuda's."""
    override = os.environ.get("FLASHINFER_NVCC")
    if override:
        return override
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"


def _runnable(command: str) -> bool:
    if os.sep in command:
        return os.path.isfile(command)
    return shutil.which(command) is not None


def jit_tools_missing() -> str | None:
    """Why FlashInfer's JIT could not build a kernel here, or None."""
    found = {"nvcc": _runnable(_nvcc()), "ninja": shutil.which("ninja") is not None}
    missing = [tool for tool, there in found.items() if not there]
    if not missing:
        return None
    return (f"FlashInfer compiles its kernels at first use and cannot find {' or '.join(missing)} "
            "(nvcc from FLASHINFER_NVCC, CUDA_HOME, CUDA_PATH or PATH; ninja on PATH)")


def cudnn_load_error() -> str | None:
    """Why the cuDNN frontend cannot serve FlashInfer's cuDNN prefill here, or None.

    FlashInfer takes its cuDNN graph path only when ``import cudnn`` succeeds; the frontend loads libcudnn at
    import and answers ``backend_version()`` from it."""
    try:
        cudnn = importlib.import_module("cudnn")
        version = int(cudnn.backend_version())
    except Exception as exc:  # noqa: BLE001 - any failure here is the reason to report
        return f"the cuDNN frontend ('cudnn' module) cannot load cuDNN: {type(exc).__name__}: {exc}"
    if version <= 0:
        return f"the cuDNN frontend ('cudnn' module) reports no cuDNN library (backend_version() = {version})"
    return None


def _version() -> str:
    try:
        return importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


class FlashInfer(Backend):
    """``BatchPrefillWithRaggedKVCacheWrapper(backend="auto")``; the subclasses pin one implementation."""

    name = "flashinfer"
    implementation = "auto"  # FlashInfer's backend= argument
    requires: tuple[str, ...] = ("flashinfer",)
    compiled_at_first_use = True  # by FlashInfer's JIT
    minimum_capability = (8, 0)
    # seconds of FlashInfer's JIT per configuration, measured with 15 builds at once from an empty cache (one
    # H100, 16 cores, 0.7.2.post1; reports/examples/h100/2026-12-05/flashinfer/): auto 1,022 s, fa2 388 s,
    # fa3 1,081 s over 12 configurations each
    compile_s: float | None = 85.0

    def __init__(self, *, plan_cache_size: int = PLAN_CACHE_SIZE, workspace_bytes: int = WORKSPACE_BYTES):
        if plan_cache_size < 1 or workspace_bytes < 1:
            raise ValueError("plan_cache_size and workspace_bytes must be positive, "
                             f"got {plan_cache_size} and {workspace_bytes}")
        self.plan_cache_size, self.workspace_bytes = plan_cache_size, workspace_bytes
        self._workspaces: dict[torch.device, torch.Tensor] = {}  # one scratch buffer per device, shared by plans
        self._plans: OrderedDict[tuple, object] = OrderedDict()  # layout and options -> planned wrapper, LRU
        self._modules: set[tuple] = set()  # the JIT modules this process has planned with (see _planned)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            devices=("cuda",),
            dtypes=("float16", "bfloat16"),
            head_dims=HEAD_DIMS,
            value_dim_differs=False,
            causal_modes=("none", "bottom_right"),
            broadcast_q="emulated",
            backward=False,
            min_compute_capability=self.minimum_capability,
            compile_s=self.compile_s,
            parallel_build=self.compiled_at_first_use,
            notes=f"flashinfer-python {_version()}: BatchPrefillWithRaggedKVCacheWrapper, "
            f"backend='{self.implementation}'; base-2 LSE [rows, Hq] converted; causal needs Lk >= Lq per "
            "sequence; no empty batch; forward only",
        )

    def unavailable_reason(self, device: str) -> str | None:
        reason = super().unavailable_reason(device)
        if reason is None and self.compiled_at_first_use:
            reason = jit_tools_missing()
        return reason

    def not_supported_reasons(self, problem: Problem) -> list[str]:
        reasons = super().not_supported_reasons(problem)
        if problem.batch == 0:
            reasons.append("an empty batch is refused by FlashInfer's plan() (it takes the maximum request length)")
        if problem.causal == "bottom_right" and any(lq > lk for lq, lk in zip(problem.seqlens_q, problem.seqlens_k)):
            reasons.append("FlashInfer does not support causal attention with more queries than keys in a sequence "
                           "(its tests skip causal with qo_len > kv_len as not supported)")
        return reasons

    def build_key(self, config, device: str) -> str:
        # FlashInfer's JIT names a module by its path, dtypes, head dims and index type (the offsets' dtype
        # here, see _planned); heads, the causal mask and the scale are run-time arguments. On sm_90 its auto
        # path takes fa3 for these options (no custom mask, no positional encoding, float16 / bfloat16):
        # the H100 run of 2026-12-06 built the fa3 modules only for it
        path = self.implementation
        if path == "auto":
            path = "fa3" if torch.cuda.get_device_capability(device)[0] == 9 else "fa2"
        dims = f"d{config.head_dim}/{config.head_dim_v or config.head_dim}"
        return f"flashinfer {path} {config.dtype} {dims} {config.offsets_dtype}"

    def _workspace(self, device: torch.device) -> torch.Tensor:
        if device not in self._workspaces:
            self._workspaces[device] = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=device)
        return self._workspaces[device]

    def _planned(self, args: AttentionArgs):
        """A wrapper planned for this call's layout and options: from the cache, else made and planned."""
        from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

        cu_k = args.cu_seqlens_k
        cu_q = args.cu_seqlens_q.to(cu_k.dtype)  # one index type per module, see above
        heads_q, head_dim = args.q.shape[1:]
        heads_kv, head_dim_v = args.k.shape[1], args.v.shape[2]
        causal = args.causal == "bottom_right"
        # The indptrs' layout is part of the key: a plan made from other strides would hide how FlashInfer
        # reads these.
        layout = tuple((t.device, t.dtype, t.stride()) for t in (cu_q, cu_k))
        key = (args.q.device, tuple(cu_q.tolist()), tuple(cu_k.tolist()), layout, heads_q, heads_kv, head_dim,
               head_dim_v, args.q.dtype, args.k.dtype, causal, args.softmax_scale)
        wrapper = self._plans.pop(key, None)
        if wrapper is None:
            wrapper = BatchPrefillWithRaggedKVCacheWrapper(self._workspace(args.q.device), "NHD",
                                                           backend=self.implementation)
            # plan() builds the JIT module of these dtypes, head dims and index type, or loads it from
            # FlashInfer's cache, the first time a process needs it: reported as a build, so that a check
            # that compiles (what the warm-up did not prepare) shows it
            module = (args.q.device, args.q.dtype, head_dim, head_dim_v, cu_k.dtype)
            start = time.perf_counter()
            wrapper.plan(cu_q, cu_k, heads_q, heads_kv, head_dim, head_dim_vo=head_dim_v, causal=causal,
                         pos_encoding_mode="NONE", logits_soft_cap=0.0, sm_scale=args.softmax_scale,
                         q_data_type=args.q.dtype, kv_data_type=args.k.dtype)
            if module not in self._modules:
                self._modules.add(module)
                if self.compiled_at_first_use:
                    jit_watch.record_build("FlashInfer JIT modules", time.perf_counter() - start)
        self._plans[key] = wrapper  # most recently used last
        while len(self._plans) > self.plan_cache_size:
            self._plans.popitem(last=False)
        return wrapper

    def forward(self, args: AttentionArgs) -> Output:
        if args.causal not in ("none", "bottom_right"):
            raise NotImplementedError(f"FlashInfer's causal mask is bottom-right; '{args.causal}' is not expressible")
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (args.q, args.k, args.v))  # see above
        out, lse = self._planned(args).run(q, k, v, return_lse=True)
        return Output(out, natural_log_lse(lse))


class FlashInferFA2(FlashInfer):
    name = "flashinfer-fa2"
    implementation = "fa2"
    compile_s = 32.0


class FlashInferFA3(FlashInfer):
    name = "flashinfer-fa3"
    implementation = "fa3"
    minimum_capability = (9, 0)
    compile_s = 90.0

    def unavailable_reason(self, device: str) -> str | None:
        reason = super().unavailable_reason(device)
        if reason is None:
            major, minor = torch.cuda.get_device_capability(device)
            if major != 9:
                reason = f"FlashInfer's fa3 prefill runs on sm_90 (Hopper) only; this GPU is sm_{major}{minor}"
        return reason


class FlashInferCudnn(FlashInfer):
    """cuDNN's SDPA through FlashInfer's wrapper: no JIT, but the cuDNN frontend (``cudnn`` module)."""

    name = "flashinfer-cudnn"
    implementation = "cudnn"
    requires = ("flashinfer", "cudnn")
    compiled_at_first_use = False
    # cuDNN builds its graphs in each process, and nothing a cache keeps: a warm-up would only delay the
    # checks (its 12 configurations took 44 s on the H100 and held the checks back until 127 s into the run)
    compile_s = 0.0

    def unavailable_reason(self, device: str) -> str | None:
        reason = super().unavailable_reason(device)
        if reason is None:
            reason = cudnn_load_error()
        return reason

    def not_supported_reasons(self, problem: Problem) -> list[str]:
        reasons = super().not_supported_reasons(problem)
        if problem.heads_q != problem.heads_kv and max(problem.seqlens_q, default=0) == 1:
            reasons.append("FlashInfer's cuDNN path refuses the LSE of grouped-query attention when no sequence "
                           "has more than one query (cuDNN writes it for one head per group, NVBug 6783545)")
        return reasons
