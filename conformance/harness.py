"""Running a backend on a problem and judging it: strategy -> backend -> oracle + tolerance -> verdicts.

The spec tests are thin wrappers over these functions, so the same path serves pytest, the CLI and
replays.
"""
from __future__ import annotations

import contextlib
import functools
import re
import time
from dataclasses import dataclass

import torch

from . import oracle
from .backend import Backend
from .poison import poison_free_memory
from .problem import AttentionArgs, Output, Problem, make_grad_out, make_inputs, same_layout_copy
from .tolerance import FORWARD_FACTOR, GRADIENT_FACTOR, Verdict, allowed_error, judge, magnitude, max_error
from .validation import validate_packed_inputs


class Unsupported(Exception):
    """The backend cannot run this problem; the message is the reason shown in reports."""


class OutOfMemory(RuntimeError):
    """A backend call ran out of memory every time it was tried (:func:`call_backend`)."""


class ContractError(AssertionError):
    """The backend returned something outside the adapter contract (shape, dtype, device, grad)."""


# Errors after which a GPU context is unusable: reported as a crash, and the worker is replaced.
DEVICE_ERROR = re.compile(
    r"CUDA error|CUDA driver error|illegal memory access|device-side assert|CUBLAS_STATUS_|CUDNN_STATUS_"
    r"|unspecified launch failure|misaligned address|HIP error|hipError",
    re.IGNORECASE,
)


# Library statuses that name a bad argument or an unsupported request, found before anything is launched:
# the context is intact, so such an error is the backend's answer to this problem (a failure, with its
# message), not a device fault. cuDNN's execution and internal errors, and every CUDA error, stay faults.
ARGUMENT_STATUS = re.compile(r"CUDNN_STATUS_(?:BAD_PARAM|NOT_SUPPORTED)\w*|CUBLAS_STATUS_(?:INVALID_VALUE|NOT_SUPPORTED)\w*")


def device_error(message: str) -> str | None:
    """The words of ``message`` that name a device error (:data:`DEVICE_ERROR`, a library's argument
    statuses left out), or None."""
    match = DEVICE_ERROR.search(ARGUMENT_STATUS.sub("", message))
    return match.group(0) if match else None


class DeviceFault(BaseException):
    """A device error inside a backend call. Every later call on that device fails too, so this is a
    BaseException: hypothesis stops at once instead of "shrinking" on a dead context (which would name
    an innocent problem), and the problem being run when it was raised is the one that faulted."""


@contextlib.contextmanager
def _faults_attributed(backend: Backend, phase: str, device: torch.device):
    """Wait for the device at the end of ``phase``, so an asynchronous fault surfaces here, in this
    problem's call, and raise it as :class:`DeviceFault`."""
    try:
        yield
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:
        if device_error(str(exc)):
            raise DeviceFault(f"{backend.name} {phase}: {type(exc).__name__}: {exc}") from exc
        raise


@dataclass
class Run:
    """One evaluation: forward results and, when asked for, the gradients w.r.t. q, k, v."""

    out: torch.Tensor
    lse: torch.Tensor | None
    dq: torch.Tensor | None = None
    dk: torch.Tensor | None = None
    dv: torch.Tensor | None = None


def _check_output(backend: Backend, args: AttentionArgs, output) -> Output:
    if isinstance(output, torch.Tensor):
        output = Output(output)
    if not isinstance(output, Output):
        raise ContractError(f"{backend.name}.forward must return an Output, got {type(output).__name__}")
    rows = sum(args.seqlens_q)
    hq, dv = args.q.shape[1], args.v.shape[2]
    out, lse = output.out, output.lse
    if tuple(out.shape) != (rows, hq, dv):
        raise ContractError(f"out has shape {tuple(out.shape)}, expected [rows, Hq, Dv] = {(rows, hq, dv)}")
    if out.dtype != args.q.dtype:
        raise ContractError(f"out has dtype {out.dtype}, expected the input dtype {args.q.dtype}")
    if out.device != args.q.device:
        raise ContractError(f"out is on {out.device}, expected the input device {args.q.device}")
    if lse is not None:
        if tuple(lse.shape) != (hq, rows):
            raise ContractError(f"lse has shape {tuple(lse.shape)}, expected [Hq, rows] = {(hq, rows)}")
        if lse.dtype != torch.float32:
            raise ContractError(f"lse has dtype {lse.dtype}, expected float32")
    return output


def checked_forward(backend: Backend, args: AttentionArgs) -> Output:
    """``backend.forward(args)``: a refusal (NotImplementedError) becomes :class:`Unsupported`, a device
    fault :class:`DeviceFault`, and the output must meet the adapter contract."""
    try:
        with _faults_attributed(backend, "forward", args.q.device):
            return _check_output(backend, args, backend.forward(args))
    except NotImplementedError as exc:
        raise Unsupported(str(exc) or f"{backend.name} raised NotImplementedError") from exc


# Out of memory is not a device fault (the context stays usable), and on a GPU shared by a run's workers it
# may be a neighbour's doing: the call is tried again after this process hands back its cached memory, after
# each pause here; an OOM that outlasts them is the call's, reported with the device's free memory.
OUT_OF_MEMORY = re.compile(r"out of memory", re.IGNORECASE)
OOM_PAUSES_S = (1.0, 4.0)  # a neighbour finishing its check or warm-up job releases its memory within seconds


def call_backend(backend: Backend, args: AttentionArgs, grad_out: torch.Tensor | None = None) -> Run:
    """Run ``backend`` on ``args`` (emulating broadcast-Q when the backend only supports it that way);
    with ``grad_out``, also backpropagate it through ``out`` and return dq, dk, dv. A call that runs out
    of memory is tried again (:data:`OOM_PAUSES_S`)."""
    for pause in (*OOM_PAUSES_S, None):
        try:
            return _call_backend_once(backend, args, grad_out)
        except Exception as exc:  # noqa: BLE001 - only out-of-memory errors are retried
            if not OUT_OF_MEMORY.search(str(exc)):
                raise
            _release_memory(args.q.device)
            if pause is None:
                note = _memory_note(args.q.device, len(OOM_PAUSES_S) + 1)
                raise OutOfMemory(f"{type(exc).__name__}: {exc} [{note}]") from exc
            time.sleep(pause)
    raise AssertionError("unreachable")


def _release_memory(device: torch.device) -> None:
    import gc
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _memory_note(device: torch.device, attempts: int) -> str:
    note = f"out of memory in each of {attempts} attempts"
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        note += (f"; the GPU had {free / 2**30:.1f} of {total / 2**30:.1f} GiB free after this process released "
                 "its cache")
    return note


def _call_backend_once(backend: Backend, args: AttentionArgs, grad_out: torch.Tensor | None) -> Run:
    validate_packed_inputs(
        args.q, args.k, args.v, args.cu_seqlens_q, args.cu_seqlens_k, args.max_seqlen_q, args.max_seqlen_k,
        broadcast_q=args.broadcast_q, softmax_scale=args.softmax_scale,
    )
    # copies with the caller's strides (a strided view stays one): the layout is part of the problem
    leaves = [same_layout_copy(t.detach()).requires_grad_(grad_out is not None) for t in (args.q, args.k, args.v)]
    call = args.replace(q=leaves[0], k=leaves[1], v=leaves[2])
    if call.broadcast_q and backend.capabilities.broadcast_q == "emulated":
        call = call.with_broadcast_q_expanded()
    poison_free_memory(call.q.device)  # CUDA: rows a kernel never writes read back as NaN
    output = checked_forward(backend, call)
    run = Run(output.out.detach(), None if output.lse is None else output.lse.detach())
    if grad_out is not None:
        if not output.out.requires_grad:
            if getattr(backend, "infers_capabilities", False) and output.out.numel():
                raise Unsupported(f"{backend.name} returned an output without an autograd graph (no backward)")
            # A declared backward with no graph means a constant output: zero gradients, judged as such.
            run.dq, run.dk, run.dv = (torch.zeros_like(t) for t in leaves)
            return run
        poison_free_memory(call.q.device)
        with _faults_attributed(backend, "backward", call.q.device):
            grads = torch.autograd.grad(output.out, leaves, grad_out, allow_unused=True)
        run.dq, run.dk, run.dv = (torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves))
    return run


def ensure_supported(backend: Backend, problem: Problem) -> None:
    reasons = backend.not_supported_reasons(problem)
    if reasons:
        raise Unsupported("; ".join(reasons))


def run_backend(backend: Backend, problem: Problem, device, *, gradients: bool = False) -> Run:
    ensure_supported(backend, problem)
    if gradients and not backend.capabilities.backward:
        raise Unsupported(f"{backend.name} declares no backward")
    grad_out = make_grad_out(problem, device) if gradients else None
    return call_backend(backend, make_inputs(problem, device), grad_out)


def oracle_call(args: AttentionArgs, compute_dtype: torch.dtype, grad_out: torch.Tensor | None = None) -> Run:
    """The oracle as a :class:`Run`, in ``compute_dtype`` (float64: the oracle; else the low-precision reference)."""
    leaves = [t.detach().to("cpu", compute_dtype).requires_grad_(grad_out is not None) for t in (args.q, args.k, args.v)]
    result = oracle.attention(args.replace(q=leaves[0], k=leaves[1], v=leaves[2]), compute_dtype)
    run = Run(result.out.detach(), result.lse.detach())
    if grad_out is not None and result.out.requires_grad:
        grads = torch.autograd.grad(result.out, leaves, grad_out.to("cpu", compute_dtype), allow_unused=True)
        run.dq, run.dk, run.dv = (torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves))
    elif grad_out is not None:
        run.dq, run.dk, run.dv = (torch.zeros_like(t) for t in leaves)
    return run


@functools.lru_cache(maxsize=16)
def oracle_run(problem: Problem, low_precision: bool, gradients: bool) -> Run:
    """Oracle results for ``problem`` (cached: several checks judge the same drawn problem)."""
    compute = problem.torch_dtype if low_precision else torch.float64
    return oracle_call(make_inputs(problem), compute, make_grad_out(problem) if gradients else None)


GRADIENTS = ("dq", "dk", "dv")


def _floor_terms(problem: Problem, quantity: str, exact: Run) -> dict:
    """The floors' terms of ``quantity`` (tolerance.py): out and the gradients grow with the largest |LSE|;
    the gradients also with the dot length and the largest gradient."""
    if quantity in GRADIENTS:
        return dict(dot_length=max(problem.head_dim, problem.value_dim), score_scale=magnitude(exact.lse),
                    gradient_scale=max(magnitude(exact.dq), magnitude(exact.dk), magnitude(exact.dv)))
    return dict(score_scale=magnitude(exact.lse)) if quantity == "out" else {}


def judge_forward(problem: Problem, run: Run) -> list[Verdict]:
    exact, low = oracle_run(problem, False, False), oracle_run(problem, True, False)
    names = ("out", "lse") if run.lse is not None else ("out",)
    return [judge(name, getattr(run, name), getattr(exact, name), getattr(low, name), problem.torch_dtype,
                  FORWARD_FACTOR, **_floor_terms(problem, name, exact)) for name in names]


def judge_gradients(problem: Problem, run: Run) -> list[Verdict]:
    exact, low = oracle_run(problem, False, True), oracle_run(problem, True, True)
    return [
        judge(name, getattr(run, name), getattr(exact, name), getattr(low, name), problem.torch_dtype, GRADIENT_FACTOR,
              **_floor_terms(problem, name, exact))
        for name in GRADIENTS
    ]


def compare_runs(problem: Problem, quantity: str, observed: torch.Tensor, expected: torch.Tensor) -> Verdict:
    """Two results of one backend that must agree (e.g. native vs emulated broadcast-Q), allowed the same
    error as a comparison with the oracle would be."""
    gradient = quantity in GRADIENTS
    exact, low = oracle_run(problem, False, gradient), oracle_run(problem, True, gradient)
    reference_error = max_error(getattr(low, quantity), getattr(exact, quantity))
    return Verdict(
        quantity=quantity,
        observed=max_error(observed, expected),
        allowed=allowed_error(reference_error, problem.torch_dtype, magnitude(getattr(exact, quantity)),
                              GRADIENT_FACTOR if gradient else FORWARD_FACTOR, **_floor_terms(problem, quantity, exact)),
        reference_error=reference_error,
    )


def assert_verdicts(problem: Problem, verdicts: list[Verdict], backend_name: str = "") -> None:
    """Fail with every quantity's error, allowance and budget when any verdict fails."""
    if all(v.ok for v in verdicts):
        return
    who = f"{backend_name} " if backend_name else ""
    lines = "\n  ".join(str(v) for v in verdicts)
    raise AssertionError(f"{who}disagrees with the float64 oracle on {problem!r}\n  {lines}")
