"""Triton compile keys of interpreted launches, as an sm_90 GPU would key them.

On a GPU, Triton compiles one binary per (kernel, constexpr values, argument specialisation, launch
options): an integer argument equal to 1 becomes a constant, one divisible by 16 and a 16-byte-aligned
pointer get their own variant, unless the kernel lists the argument in ``do_not_specialize``. Under
``TRITON_INTERPRET=1`` nothing is compiled, but every launch still passes the arguments the GPU would key
on, and Triton's own specialiser (``native_specialize_impl``) runs without a GPU given an sm_90 backend
object. So a CPU run can tell which compiled variants a GPU run of the same calls would need.

Used by tests/test_compile_keys.py: the run's warm-up must launch every variant its checks launch,
otherwise a check compiles under its timeout (the cost the warm-up exists to take out of the checks).

As a pytest plugin (``-p triton_keys``, this folder on ``PYTHONPATH``), it records per test and writes the
keys to the path in ``JFA_TRITON_KEYS_OUT`` at the end of the session.
"""
from __future__ import annotations

import inspect
import json
import os
from collections import defaultdict

LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def _backend():
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    return CUDABackend(GPUTarget("cuda", 90, 32))


def _names(fn, listed) -> set[str]:
    """``do_not_specialize`` entries (names or positions) as parameter names."""
    params = list(inspect.signature(fn).parameters)
    return {params[x] if isinstance(x, int) else x for x in (listed or ())}


def available() -> str:
    """Why keys cannot be read with this Triton ("" if they can)."""
    try:
        from triton.runtime.jit import native_specialize_impl  # noqa: F401
        from triton.runtime.interpreter import InterpretedFunction  # noqa: F401
        _backend()
    except Exception as exc:  # noqa: BLE001 - another Triton's internals
        return f"this Triton's specialiser cannot be reached ({type(exc).__name__}: {exc})"
    return ""


def launch_key(function, args: tuple, kwargs: dict, backend=None) -> tuple:
    """``(kernel name, ((parameter, specialisation...), ...), ((option, value), ...))`` of one launch of an
    interpreted kernel (``triton.runtime.interpreter.InterpretedFunction``)."""
    from triton.runtime.jit import native_specialize_impl

    backend = backend or _backend()
    fn = function.fn
    kwargs = dict(kwargs)
    options = tuple(sorted((k, kwargs.pop(k)) for k in list(kwargs) if k in LAUNCH_OPTIONS))
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    annotations = {k: str(v) for k, v in inspect.get_annotations(fn).items()}
    fixed = _names(fn, function.kwargs.get("do_not_specialize"))
    unaligned = _names(fn, function.kwargs.get("do_not_specialize_on_alignment"))
    spec = []
    for name, value in bound.arguments.items():
        if "constexpr" in annotations.get(name, ""):
            spec.append((name, "constexpr", repr(value)))
        else:
            kind = native_specialize_impl(backend, value, False, name not in fixed, name not in unaligned)
            spec.append((name,) + tuple(str(x) for x in kind))
    return fn.__name__, tuple(spec), options


class KeyRecorder:
    """While active, every interpreted launch adds its :func:`launch_key` to ``keys`` (key -> set of the
    ``label`` values current at its launches)."""

    def __init__(self):
        self.keys: dict[tuple, set[str]] = defaultdict(set)
        self.label = ""
        self._backend = _backend()
        self._saved = None

    def __enter__(self):
        from triton.runtime.interpreter import InterpretedFunction

        original = InterpretedFunction.run
        recorder = self

        def run(function, *args, grid, warmup, **kwargs):
            recorder.keys[launch_key(function, args, kwargs, recorder._backend)].add(recorder.label)
            return original(function, *args, grid=grid, warmup=warmup, **kwargs)

        self._saved = original
        InterpretedFunction.run = run
        return self

    def __exit__(self, *exc):
        from triton.runtime.interpreter import InterpretedFunction
        InterpretedFunction.run = self._saved
        return False

    def dump(self, path) -> None:
        dump(self.keys, path)


def dump(keys: dict[tuple, set[str]], path) -> None:
    """Write keys (with their labels) as JSON; :func:`load` reads them back."""
    rows = [{"kernel": k[0], "args": [list(a) for a in k[1]], "options": [list(o) for o in k[2]],
             "labels": sorted(labels)} for k, labels in keys.items()]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(rows, f)


def load(path) -> dict[tuple, set[str]]:
    """What :func:`dump` wrote, keyed as :func:`launch_key` keys."""
    with open(path, encoding="utf-8") as f:
        rows = json.load(f)
    return {(r["kernel"], tuple(tuple(a) for a in r["args"]), tuple(tuple(o) for o in r["options"])): set(r["labels"])
            for r in rows}


def has_ptxas() -> bool:
    """Whether this Triton bundles ptxas, which compiling for sm_90 without a GPU needs."""
    import triton
    return os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))


def compile_key(function, key: tuple):
    """Compile the variant ``key`` (a :func:`launch_key`) of ``function`` (the kernel's JIT function) for
    sm_90, as a GPU's first launch of it would: same constexprs, specialisations and launch options. Needs
    Triton's bundled ptxas, not a GPU, and a process that has not run the interpreter (it leaves Triton's
    language patched). Returns the compiled kernel."""
    import ast

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    backend = _backend()
    signature, constexprs, attrs = {}, {}, {}
    for i, (name, kind, *spec) in enumerate(key[1]):
        value = spec[0] if spec else ""
        if kind == "constexpr":
            signature[name] = "constexpr"
            constexprs[name] = ast.literal_eval(value)
        else:
            signature[name] = kind
            if value not in ("", "None"):
                attrs[(i,)] = backend.parse_attr(value)
    return triton.compile(ASTSource(function, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(key[2]))


def warm_keys(profile: str = "ci", seed: int = 0) -> dict[tuple, set[str]]:
    """Keys the run's warm-up launches for triton-jfa's run set under ``profile`` and ``seed`` (the jobs
    `jfa-conformance run` sends its warm-up workers, run here in-process), each with the configurations
    that launched it. Run under ``TRITON_INTERPRET=1``."""
    from conformance import profiles, registry
    from conformance.warmup import warm, warm_configs

    backend = registry.resolve("triton-jfa")
    configs = warm_configs(backend, seed, profiles.extra_kernel_configs(profile) or 0)
    with KeyRecorder() as recorder:
        for config in configs:
            recorder.label = config.key
            warm(backend, config, "cpu")
    return recorder.keys


def difference(key: tuple, others) -> list[str]:
    """How ``key`` differs from the nearest key of the same kernel among ``others`` (for failure messages)."""
    best = None
    for other in others:
        if other[0] != key[0]:
            continue
        diff = [f"{mine[0]}: {'/'.join(mine[1:])} (nearest warm-up launch: {'/'.join(theirs[1:])})"
                for mine, theirs in zip(key[1], other[1]) if mine != theirs]
        if other[2] != key[2]:
            diff.append(f"options {dict(key[2])} (nearest: {dict(other[2])})")
        if best is None or len(diff) < len(best):
            best = diff
    return best if best is not None else ["no warm-up launch of this kernel at all"]


# -- the pytest plugin --------------------------------------------------------------------------------
_RECORDER: KeyRecorder | None = None


def pytest_configure(config):
    global _RECORDER
    if os.environ.get("JFA_TRITON_KEYS_OUT"):
        _RECORDER = KeyRecorder().__enter__()


def pytest_runtest_setup(item):
    if _RECORDER is not None:
        _RECORDER.label = item.nodeid


def pytest_unconfigure(config):
    if _RECORDER is not None:
        _RECORDER.__exit__(None, None, None)
        _RECORDER.dump(os.environ["JFA_TRITON_KEYS_OUT"])
