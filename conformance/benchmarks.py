"""Timings of each backend's forward and backward on a few representative jagged shapes (pytest-benchmark).

Not collected by the spec run (the file name does not match ``test_*.py``): ``jfa-conformance run --bench``
runs it in its own pytest session without xdist, because pytest-benchmark switches itself off under xdist.

On a GPU each timed round makes ``calls_per_round`` calls back to back and waits for the device once, at
the end: the host's work for one call overlaps the device's for the one before, as in a model's step and
as vendors' tables and ``triton.testing.do_bench`` measure; pytest-benchmark's own statistics
(``benchmark.json``) are per round, the report's per call.  Beside it,
``latency_s`` is one call and a wait (what a lone call costs, the host's time and the launches' included)
and ``host_s`` the host's time per call submitted back to back: where it reaches the time per call, the
backend is host-bound there and its time is the host's.  Each benchmark stores in ``extra_info`` what the
report needs: those three, the shape, its length skew, the useful FLOPs (valid tokens only, causal halved:
``4 * pairs * D * Hq`` forward, 2.5x that backward), the padding waste a padded ``[B, max L]`` layout would
pay on it, and the seconds of the first call (compilation included).
"""
from __future__ import annotations

import contextlib
import functools
import random
import time

import pytest
import torch

from .harness import Unsupported, call_backend, ensure_supported
from .problem import Problem, make_grad_out, make_inputs

BACKWARD_FLOP_RATIO = 2.5
ROUND_S = 0.02  # a GPU round's length: enough calls back to back that one wait at the end is a small share
MAX_CALLS = 64  # calls per round at most (the launch queue holds about a thousand launches)
LATENCY_CALLS = 5
HOST_CALLS = 8


def _lengths(kind: str, batch: int, mean: int, rng: random.Random) -> tuple[int, ...]:
    if kind == "dense":
        return (mean,) * batch
    if kind == "uniform":
        return tuple(rng.randint(1, 2 * mean - 1) for _ in range(batch))
    if kind == "pareto":
        return tuple(min(16 * mean, max(1, int(mean / 3 * rng.paretovariate(1.2)))) for _ in range(batch))
    if kind == "one_long":
        return (mean * batch // 2,) + tuple(max(1, mean // 8) for _ in range(batch - 1))
    raise ValueError(f"unknown length law {kind!r}")


def shapes(device: str) -> dict[str, Problem]:
    """Representative problems: small on CPU (the suite must stay quick there), realistic on GPUs."""
    gpu = device.startswith("cuda")
    batch, mean = (64, 512) if gpu else (8, 48)
    heads, dim, dtype = (8, 128, "bfloat16") if gpu else (2, 64, "float32")
    rng = random.Random(1234)  # fixed: the same shapes on every run, so timings compare across runs
    out = {}
    for name, law, causal in (("dense", "dense", "none"), ("uniform", "uniform", "none"),
                              ("uniform_causal", "uniform", "bottom_right"), ("pareto", "pareto", "none"),
                              ("one_long", "one_long", "bottom_right")):
        lens = _lengths(law, batch, mean, rng)
        out[name] = Problem(lens, lens, heads_q=heads, heads_kv=heads, head_dim=dim, dtype=dtype, causal=causal,
                            seed=7, length_law=law)
    return out


def useful_flops(problem: Problem, direction: str) -> float:
    forward = 4.0 * problem.visible_pairs() * problem.head_dim * problem.heads_q
    return forward * (BACKWARD_FLOP_RATIO if direction == "backward" else 1.0)


def padding_waste(problem: Problem) -> float:
    """Share of a padded layout's attention work that is padding: 1 - useful pairs / padded pairs."""
    longest_q, longest_k = max(problem.seqlens_q, default=0), max(problem.seqlens_k, default=0)
    padded = problem.replace(seqlens_q=(longest_q,) * problem.batch, seqlens_k=(longest_k,) * problem.batch)
    padded_pairs = padded.visible_pairs()
    return 1.0 - problem.visible_pairs() / padded_pairs if padded_pairs else 0.0


def length_skew(problem: Problem) -> float:
    """Longest over mean key length: 1 for dense batches, large when one sequence dominates."""
    lens = problem.seqlens_k
    mean = sum(lens) / len(lens) if lens else 0
    return max(lens) / mean if mean else 1.0


@functools.lru_cache(maxsize=2)
def _drawn(problem: Problem):
    """A shape's inputs and upstream gradient, drawn once per session on the host (make_inputs draws on the CPU:
    about half a second for a GPU shape, which every backend and direction would otherwise pay again).  The
    timings run shape by shape (plugin.arrange_timings), so two entries serve every turn."""
    return make_inputs(problem, "cpu"), make_grad_out(problem, "cpu")


def fresh_inputs(problem: Problem, device: str):
    """(args, grad_out) of ``problem`` on ``device``: copies of the drawn tensors, so that nothing a backend
    does to its inputs reaches another's timing."""
    args, grad_out = _drawn(problem)
    moved = {name: getattr(args, name).to(device, copy=True) for name in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")}
    return args.replace(**moved), grad_out.to(device, copy=True)


def out_of_memory(exc: BaseException) -> str:
    """The skip reason of a timing the device cannot hold (a padded layout's mask on a long sequence, say)."""
    return f"not timed: out of memory on this device ({str(exc).split('. Including')[0].strip()})"


def prelude_shapes(device: str) -> list[Problem]:
    """The first timing shape of each causal mode: between them, every kernel configuration the timings use
    (they differ in lengths and causal mode only)."""
    firsts: dict[str, Problem] = {}
    for problem in shapes(device).values():
        firsts.setdefault(problem.causal, problem)
    return list(firsts.values())


def prelude(backends, device: str, limit_s: float | None = None) -> dict[str, float]:
    """Each backend's first calls, forward and backward, on :func:`prelude_shapes`, while the checks still run
    (the benchmark session waits at its gate after it): the work a process does once per backend and kernel
    configuration (a DSL's set-up, a graph compile) leaves the timing phase.  Seconds per backend; what
    fails here is left for the timing itself to report.  A backend that hangs past ``limit_s`` (the
    session's --timeout) ends the session, as pytest-timeout ends it for a timing that hangs; the log names
    the call."""
    from .containment import Watchdog
    seconds: dict[str, float] = {}
    for problem in prelude_shapes(device):
        for backend in backends:
            if backend.not_supported_reasons(problem):
                continue
            print(f"prelude: {backend.name} on {problem.length_law} lengths, causal {problem.causal}", flush=True)
            start = time.perf_counter()
            with Watchdog(limit_s) if limit_s else contextlib.nullcontext():
                try:
                    args, grad_out = fresh_inputs(problem, device)
                    with torch.no_grad():
                        backend.forward(args)
                    if backend.capabilities.backward and not args.broadcast_q:
                        leaves = [t.detach().clone().requires_grad_(True) for t in (args.q, args.k, args.v)]
                        out = backend.forward(args.replace(q=leaves[0], k=leaves[1], v=leaves[2])).out
                        torch.autograd.grad(out, leaves, grad_out, allow_unused=True)
                    _synchronize(device)
                except Exception:  # noqa: BLE001 - the timing of this shape makes the same call and reports it
                    pass
            seconds[backend.name] = round(seconds.get(backend.name, 0.0) + time.perf_counter() - start, 2)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # hand the memory back to the checks while the session waits
    return seconds


def _unless_out_of_memory(fn, device: str):
    """``fn()``; if the device cannot hold it, the timing is skipped as not timed, with the reason."""
    try:
        return fn()
    except torch.OutOfMemoryError as exc:
        reason = out_of_memory(exc)
    # outside the except block, so that the failed call's tensors are freed before the cache is emptied
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    pytest.skip(reason)


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


SHAPES = shapes("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_timing(benchmark, backend, device, shape, direction):
    problem = shapes(device)[shape]
    try:
        ensure_supported(backend, problem)
    except Unsupported as exc:
        pytest.skip(f"unsupported: {exc}")
    if direction == "backward" and not backend.capabilities.backward:
        pytest.skip(f"unsupported: {backend.name} declares no backward")
    args, grad_out = fresh_inputs(problem, device)
    benchmark.group = f"{shape}-{direction}"
    benchmark.extra_info.update(
        backend=backend.name, shape=shape, direction=direction, useful_flops=useful_flops(problem, direction),
        padding_waste=padding_waste(problem), length_skew=length_skew(problem), problem=problem.summary(),
    )
    if direction == "forward":
        def call():
            with torch.no_grad():
                backend.forward(args)
    else:
        leaves = [t.detach().clone().requires_grad_(True) for t in (args.q, args.k, args.v)]
        call_args = args.replace(q=leaves[0], k=leaves[1], v=leaves[2])
        if call_args.broadcast_q and backend.capabilities.broadcast_q == "emulated":
            call_args = call_args.with_broadcast_q_expanded()
        out = _unless_out_of_memory(lambda: backend.forward(call_args).out, device)

        def call():
            torch.autograd.grad(out, leaves, grad_out, retain_graph=True, allow_unused=True)

    def one():
        call()
        _synchronize(device)
    # The first call in this direction on this shape, compilation included. A backend compiles per
    # configuration (dtype, head dims, causal mode), so a shape after one with the same configuration
    # may find its kernels compiled already; the report shows it beside the backend's compile time.
    start = time.perf_counter()
    _unless_out_of_memory(one, device)
    benchmark.extra_info["first_call_s"] = time.perf_counter() - start
    # Same as the spec's contract check: a wrong shape would make the timing meaningless.
    call_backend(backend, args)
    latency = _median_seconds(one, LATENCY_CALLS if device.startswith("cuda") else 1)
    calls = calls_per_round(latency, device)

    def run():
        for _ in range(calls):
            call()
        _synchronize(device)
    # the host's time per call, over few enough calls that the launch queue never fills (a full queue
    # would make the host wait for the device, and that wait would read as host time)
    host_calls = min(calls, HOST_CALLS)
    start = time.perf_counter()
    for _ in range(host_calls):
        call()
    host_s = (time.perf_counter() - start) / host_calls
    _synchronize(device)
    benchmark.extra_info.update(latency_s=latency, host_s=host_s, calls_per_round=calls)
    benchmark.pedantic(run, rounds=5 if device.startswith("cuda") else 3, iterations=1, warmup_rounds=1)


def calls_per_round(latency_s: float, device: str) -> int:
    """Calls back to back in one timed round: about ``ROUND_S`` of them on a GPU (at most ``MAX_CALLS``);
    one elsewhere, where a call does not return before its work is done."""
    if not device.startswith("cuda"):
        return 1
    return max(1, min(MAX_CALLS, int(ROUND_S / max(latency_s, 1e-6))))


def _median_seconds(fn, n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]
