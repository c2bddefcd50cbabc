"""Seconds a process spends compiling: Triton kernel variants (compiled, or loaded from the on-disk cache,
on their first launch in the process) and torch.compile graphs (dynamo's tracing and the backend compiler,
inductor included, whose caches make a graph compiled before cheaper, not free).

The warm-up exists so that checks do not compile. Whether it managed is visible per check: the recorder
(recorder.py) reads :func:`totals` before and after each check (:func:`since`). A check whose Triton
kernels were all compiled by the warm-up shows only their loads (milliseconds per variant); one that
compiled shows seconds, named by kernel in the report. This covers every kernel Triton's JIT launches
(``@triton.jit`` and Gluon kernels) and every torch.compile graph (flex_attention's). A backend whose
compiler no hook sees reports its builds itself (:func:`record_build`: FlashInfer's JIT modules); FA4's
CuTe DSL compiles through its own path and is not counted.

The hooks are Triton's own (``triton.knobs.runtime.jit_cache_hook`` before a variant is built and
``jit_post_compile_hook`` after); hooks already installed there keep working. Nothing is installed until
Triton has been imported by someone else, and a Triton without these hooks is left alone.
"""
from __future__ import annotations

import sys
import time

_totals = {"variants": 0, "seconds": 0.0}
_per_kernel: dict[str, list] = {}  # kernel name -> [variants, seconds]
_started: dict[str, tuple[float, str]] = {}
_installed = False
_reported: dict[str, list] = {}  # what a backend reported building (record_build): kind -> [builds, seconds]


def record_build(kind: str, seconds: float) -> None:
    """A backend's own compiler made one ``kind`` artifact (or loaded it from its cache) in ``seconds``,
    during the check running in this process: for compilers the Triton and torch.compile hooks do not see
    (FlashInfer's nvcc JIT). Counted like a Triton variant: in the check's ``jit`` record, the report's
    compiling-in-checks seconds and its list of checks that compiled."""
    entry = _reported.setdefault(str(kind), [0, 0.0])
    entry[0] += 1
    entry[1] += max(0.0, float(seconds))


def _name(kwargs) -> str:
    fn = kwargs.get("fn")
    name = getattr(fn, "name", None)
    if name:
        return str(name).rsplit(".", 1)[-1]
    text = str(kwargs.get("repr") or "?")
    return text.split("[", 1)[0]


def before_build(**kwargs):
    """Triton calls this (``jit_cache_hook``) as a variant is about to be compiled or loaded."""
    _started[str(kwargs.get("key"))] = (time.perf_counter(), _name(kwargs))
    return None  # (a true value would tell Triton to skip the variant)


def after_build(**kwargs):
    """Triton calls this (``jit_post_compile_hook``) once the variant is ready."""
    start = _started.pop(str(kwargs.get("key")), None)
    if start is None:
        return None
    seconds = time.perf_counter() - start[0]
    _totals["variants"] += 1
    _totals["seconds"] += seconds
    entry = _per_kernel.setdefault(start[1], [0, 0.0])
    entry[0] += 1
    entry[1] += seconds
    return None


def _chain(mine, theirs):
    """``mine`` then the hook installed before (whose answer is Triton's); ``mine`` never raises."""
    def both(**kwargs):
        try:
            mine(**kwargs)
        except Exception:  # noqa: BLE001 - watching must never break a launch
            pass
        return None if theirs is None else theirs(**kwargs)

    return both


def install() -> bool:
    """Install the hooks if Triton is imported and has them (once per process); True when watching."""
    global _installed
    if _installed:
        return True
    if "triton" not in sys.modules:
        return False
    try:
        from triton import knobs
        runtime = knobs.runtime
        if not hasattr(runtime, "jit_cache_hook") or not hasattr(runtime, "jit_post_compile_hook"):
            return False
        runtime.jit_cache_hook = _chain(before_build, runtime.jit_cache_hook)
        runtime.jit_post_compile_hook = _chain(after_build, runtime.jit_post_compile_hook)
    except Exception:  # noqa: BLE001 - an older or different Triton: nothing is watched
        return False
    _installed = True
    return True


def _graphs() -> tuple[int, float]:
    """(graphs, seconds) torch.compile has compiled in this process (dynamo's own tallies), (0, 0) before
    dynamo is imported or where its tallies are not found."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0, 0.0
    try:
        graphs = int(utils.counters["stats"]["unique_graphs"])
        seconds = float(sum(utils.compilation_time_metrics.get("_compile.compile_inner", ())))
    except Exception:  # noqa: BLE001 - another torch's internals: nothing counted
        return 0, 0.0
    return graphs, seconds


def totals() -> tuple:
    """What this process has compiled since it started watching: (Triton variants, their seconds, per kernel
    name (variants, seconds), torch.compile graphs, their seconds, per kind of what backends reported
    (builds, seconds))."""
    graphs, graph_seconds = _graphs()
    return (_totals["variants"], _totals["seconds"], {k: (v[0], v[1]) for k, v in _per_kernel.items()},
            graphs, graph_seconds, {k: (v[0], v[1]) for k, v in _reported.items()})


def since(before) -> dict | None:
    """What was compiled between ``before`` (a :func:`totals`) and now, as a record's ``jit`` entry:
    ``{"seconds", "builds", "triton": {"variants", "seconds", "kernels": {name: {"variants", "seconds"}}},
    "torch_compile": {"graphs", "seconds"}, "reported": {kind: {"builds", "seconds"}}}`` with the parts
    that saw anything; None when nothing was."""
    variants, seconds, kernels, graphs, graph_seconds, reported = totals()
    out: dict = {}
    if variants > before[0]:
        changed = {}
        for name, (n, s) in kernels.items():
            n0, s0 = before[2].get(name, (0, 0.0))
            if n > n0:
                changed[name] = {"variants": n - n0, "seconds": round(s - s0, 3)}
        out["triton"] = {"variants": variants - before[0], "seconds": round(seconds - before[1], 3),
                         "kernels": changed}
    if graphs > before[3]:
        out["torch_compile"] = {"graphs": graphs - before[3], "seconds": round(max(0.0, graph_seconds - before[4]), 3)}
    kinds = {}
    for kind, (n, s) in reported.items():
        n0, s0 = before[5].get(kind, (0, 0.0))
        if n > n0:
            kinds[kind] = {"builds": n - n0, "seconds": round(s - s0, 3)}
    if not out and not kinds:
        return None
    out["seconds"] = round(sum(part["seconds"] for part in out.values()) + sum(k["seconds"] for k in kinds.values()), 3)
    out["builds"] = (out.get("triton", {}).get("variants", 0) + out.get("torch_compile", {}).get("graphs", 0)
                     + sum(k["builds"] for k in kinds.values()))
    if kinds:
        out["reported"] = kinds
    return out
