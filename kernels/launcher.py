"""Launching Triton kernels with less host time: ``launch(kernel, grid, *args, **kwargs)`` does what
``kernel[grid](*args, **kwargs)`` does, through the kernel's compiled handle once it has one.

Triton's own launch path (``JITFunction.run``) binds the arguments, specializes each one, builds a cache key
from them and looks the compiled kernel up, every call: on an H100 host about 60 us for a kernel of thirty
arguments, against a few microseconds for the launch itself; a plain call makes four such launches.  Here
each kernel keeps its compiled handles by the *classes* of its arguments, the properties Triton specializes
on: a tensor's dtype and whether its address is a multiple of 16, whether an int is 1, a multiple of 16,
or beyond int32, the type of a float or a bool, a descriptor's dtype, block and layout, and every constexpr
and launch option by value.  An argument list of the same classes gets the same compiled kernel from Triton,
so the handle is launched directly (``CompiledKernel.run``, as ``JITFunction.run`` itself ends).

Every ``VERIFY_EVERY``-th launch of a kernel, and every launch whose classes are new, takes Triton's own
path, and a sampled launch whose handle differs from the one kept raises ``RuntimeError``: a class this
module does not see would show as an error in a test run, not as a wrong kernel.  Under the interpreter,
with a Triton launch hook or pre-run hook installed, or for an argument of a type not listed above, every
launch takes Triton's path.
"""
from __future__ import annotations

import inspect

import torch

from .tl import INTERPRET

VERIFY_EVERY = 64
_I32_LO, _I32_HI, _U64 = -(2 ** 31), 2 ** 31, 2 ** 63
_CONST, _SPECIALIZED, _PLAIN, _NO_ALIGN = 0, 1, 2, 3  # how Triton treats a parameter
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")

try:  # Triton >= 3.4: launch hooks live in knobs
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - older Triton: Triton's path every time
    _knobs = None


class Unknown(Exception):
    """An argument this module cannot classify: the launch takes Triton's path."""


def _cls(value, how):
    """The class of one argument: what Triton's specialization of it depends on."""
    if how == _CONST:
        return value
    t = type(value)
    if t is int:
        wide = (value < _I32_LO or value >= _I32_HI, value >= _U64)
        if how == _SPECIALIZED:
            return 1 if value == 1 else (wide, value % 16 == 0)
        return wide
    if t is float or t is bool or value is None:
        return t
    if isinstance(value, torch.Tensor):
        return value.dtype, how == _NO_ALIGN or value.data_ptr() % 16 == 0
    block = getattr(value, "block_shape", None)
    if block is not None and hasattr(value, "base") and hasattr(value, "layout"):  # a TMA tensor descriptor
        return (t, value.base.dtype, tuple(block), id(value.layout), getattr(value, "padding", None),
                getattr(value, "round_f32_to_tf32", None))
    raise Unknown(t.__name__)


class _Kernel:
    """One JIT function's parameter kinds and its compiled handles by argument classes."""

    def __init__(self, fn):
        self.fn = fn
        self.names = [p.name for p in fn.params]
        self.kinds = tuple(_CONST if p.is_constexpr else _PLAIN if p.do_not_specialize
                           else _NO_ALIGN if getattr(p, "do_not_specialize_on_alignment", False) else _SPECIALIZED
                           for p in fn.params)
        self.defaults = {name: p.default for name, p in inspect.signature(fn.fn).parameters.items()
                         if p.default is not inspect.Parameter.empty}
        self.handles = {}
        self.calls = 0  # launches through launch()
        self.direct = 0  # of them, straight to a kept handle

    def values(self, args, kwargs):
        """Every parameter's value in signature order (constexprs included, as Triton's launcher takes them)."""
        if len(args) == len(self.names):
            return args
        rest = self.names[len(args):]
        try:
            return args + tuple(kwargs[n] if n in kwargs else self.defaults[n] for n in rest)
        except KeyError as exc:
            raise TypeError(f"{self.fn.__name__}: no value for parameter {exc.args[0]!r}") from None


_KERNELS: dict = {}


def stats() -> dict:
    """Per kernel name: (launches through launch(), of them straight to a kept handle, handles kept)."""
    return {k.fn.__name__: (k.calls, k.direct, len(k.handles)) for k in _KERNELS.values()}


def _hook_set(hook) -> bool:
    # None, or (Triton >= 3.6) a chain of hooks that may be empty
    return hook is not None and (not hasattr(hook, "calls") or bool(hook.calls))


def _hooked() -> bool:
    """A launch hook (a profiler's) is installed: Triton's path, which calls it."""
    return _knobs is None or _hook_set(_knobs.runtime.launch_enter_hook) or \
        _hook_set(getattr(_knobs.runtime, "launch_exit_hook", None))


def launch(fn, grid, *args, **kwargs):
    """``fn[grid](*args, **kwargs)``, through the compiled handle where the argument classes have one."""
    if INTERPRET or getattr(fn, "pre_run_hooks", None):
        return fn[grid](*args, **kwargs)
    kernel = _KERNELS.get(fn)
    if kernel is None:
        kernel = _KERNELS[fn] = _Kernel(fn)
    options = {k: kwargs.pop(k) for k in _OPTIONS if k in kwargs}
    vals = kernel.values(args, kwargs)
    device = torch.cuda.current_device()
    try:
        key = (device, tuple(sorted(options.items())),
               tuple(map(_cls, vals, kernel.kinds)))
    except Unknown:
        return fn[grid](*vals, **options)
    kernel.calls += 1
    handle = kernel.handles.get(key)
    if handle is None or kernel.calls % VERIFY_EVERY == 0 or _hooked():
        got = fn[grid](*vals, **options)
        if handle is None:
            kernel.handles[key] = got
        elif got is not handle:
            raise RuntimeError(f"{fn.__name__}: Triton compiled another kernel for arguments of the same classes "
                               f"({key[2]}); kernels/launcher.py misses a specialization")
        return got
    kernel.direct += 1
    g = tuple(grid) + (1, 1)
    stream = torch._C._cuda_getCurrentRawStream(device)  # what Triton's own launch asks torch for
    handle.run(g[0], g[1], g[2], stream, handle.function, handle.packed_metadata, None, None, None, *vals)
    return handle
