"""kernels/launcher.py: a launch takes the compiled handle only where Triton would pick the same kernel.

Triton itself needs a GPU, so these tests stand a fake JIT function in for it: its ``[grid](...)`` "compiles"
one handle per specialization (the classes Triton specializes on, written out here independently), and the
tests check which launches reach it and which go straight to a handle.  The GPU tests run the real thing.
"""
from __future__ import annotations

import types

import pytest
import torch

from kernels import launcher


class _Param:
    def __init__(self, name, constexpr=False, no_spec=False):
        self.name, self.is_constexpr, self.do_not_specialize = name, constexpr, no_spec
        self.do_not_specialize_on_alignment = False


class _Handle:
    def __init__(self, spec):
        self.spec, self.function, self.packed_metadata, self.runs = spec, object(), object(), []

    def run(self, *args):
        self.runs.append(args)


def _kernel_src(X, n, m, scale, BLOCK=64):
    pass


class FakeJit:
    """Triton's launch as far as these tests need it: one compiled handle per specialization."""

    def __init__(self, wrong_after=None):
        self.params = [_Param("X"), _Param("n"), _Param("m", no_spec=True), _Param("scale"),
                       _Param("BLOCK", constexpr=True)]
        self.fn = _kernel_src
        self.__name__ = "fake_kernel"
        self.pre_run_hooks = []
        self.handles, self.slow = {}, []
        self.wrong_after = wrong_after  # after this many slow launches, "compile" a new handle every time

    @staticmethod
    def specialization(X, n, m, scale, BLOCK, **options):
        n_cls = "1" if n == 1 else ("i32" if -2 ** 31 <= n < 2 ** 31 else "i64", n % 16 == 0)
        m_cls = "i32" if -2 ** 31 <= m < 2 ** 31 else "i64"
        if not isinstance(X, torch.Tensor):
            return (type(X), n_cls)
        return (X.dtype, X.data_ptr() % 16 == 0, n_cls, m_cls, type(scale), BLOCK, tuple(sorted(options.items())))

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            values = dict(zip(("X", "n", "m", "scale", "BLOCK"), args), **kwargs)
            options = {k: values.pop(k) for k in list(values) if k in launcher._OPTIONS}
            values.setdefault("BLOCK", 64)
            spec = self.specialization(**values, **options)
            self.slow.append(spec)
            if self.wrong_after is not None and len(self.slow) > self.wrong_after:
                return _Handle(spec)
            return self.handles.setdefault(spec, _Handle(spec))
        return run


@pytest.fixture
def gpu_less(monkeypatch):
    """The launcher as on a GPU: not interpreting, device 0, a stream handle of 0, no launch hooks."""
    monkeypatch.setattr(launcher, "INTERPRET", False)
    monkeypatch.setattr(launcher.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(launcher.torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
    monkeypatch.setattr(launcher, "_knobs", types.SimpleNamespace(runtime=types.SimpleNamespace(
        launch_enter_hook=None, launch_exit_hook=None)))
    monkeypatch.setattr(launcher, "_KERNELS", {})


def test_a_repeated_launch_goes_straight_to_the_handle_with_every_value_in_signature_order(gpu_less):
    fn = FakeJit()
    x = torch.zeros(64, dtype=torch.int32)
    assert x.data_ptr() % 16 == 0
    first = launcher.launch(fn, (3,), x, 32, 5, 0.5, BLOCK=128, num_warps=4)
    assert len(fn.slow) == 1 and first.runs == []
    second = launcher.launch(fn, (3,), x, 48, 7, 0.25, BLOCK=128, num_warps=4)
    assert second is first and len(fn.slow) == 1  # same classes: no trip through Triton
    (args,) = first.runs
    assert args[:3] == (3, 1, 1) and args[9:] == (x, 48, 7, 0.25, 128)  # grid, then every parameter


@pytest.mark.parametrize("change", ["misaligned tensor", "n == 1", "n not a multiple of 16", "m past int32",
                                    "other dtype", "other constexpr", "other num_warps"])
def test_a_launch_whose_classes_differ_goes_through_triton(gpu_less, change):
    fn = FakeJit()
    buf = torch.zeros(64, dtype=torch.int32)
    args, kwargs = [buf, 32, 5, 0.5], dict(BLOCK=128, num_warps=4)
    launcher.launch(fn, (1,), *args, **kwargs)
    if change == "misaligned tensor":
        args[0] = buf[1:]
    elif change == "n == 1":
        args[1] = 1
    elif change == "n not a multiple of 16":
        args[1] = 33
    elif change == "m past int32":
        args[2] = 2 ** 31
    elif change == "other dtype":
        args[0] = torch.zeros(64, dtype=torch.float32)
    elif change == "other constexpr":
        kwargs["BLOCK"] = 64
    else:
        kwargs["num_warps"] = 8
    handle = launcher.launch(fn, (1,), *args, **kwargs)
    assert len(fn.slow) == 2 and handle.spec == fn.slow[-1]
    assert len(fn.handles) == 2  # Triton's answer, a kernel of its own, is what was launched


def test_an_unspecialized_int_or_a_new_float_value_keeps_the_handle(gpu_less):
    fn = FakeJit()
    x = torch.zeros(64, dtype=torch.int32)
    launcher.launch(fn, (1,), x, 32, 5, 0.5, BLOCK=128)
    launcher.launch(fn, (1,), x, 64, 3, 2.0, BLOCK=128)
    assert len(fn.slow) == 1


def test_a_sampled_launch_checks_the_kept_handle_against_triton(gpu_less):
    fn = FakeJit(wrong_after=1)  # from its second launch on, "Triton" picks another kernel
    x = torch.zeros(64, dtype=torch.int32)
    launcher.launch(fn, (1,), x, 32, 5, 0.5, BLOCK=128)
    for _ in range(launcher.VERIFY_EVERY - 2):
        launcher.launch(fn, (1,), x, 32, 5, 0.5, BLOCK=128)
    assert len(fn.slow) == 1
    with pytest.raises(RuntimeError, match="misses a specialization"):
        launcher.launch(fn, (1,), x, 32, 5, 0.5, BLOCK=128)


def test_with_a_launch_hook_or_an_unknown_argument_every_launch_goes_through_triton(gpu_less, monkeypatch):
    fn = FakeJit()
    x = torch.zeros(64, dtype=torch.int32)
    launcher.launch(fn, (1,), x, 32, 5, 0.5, BLOCK=128)
    monkeypatch.setattr(launcher._knobs.runtime, "launch_enter_hook", types.SimpleNamespace(calls=[print]))
    launcher.launch(fn, (1,), x, 32, 5, 0.5, BLOCK=128)
    assert len(fn.slow) == 2
    monkeypatch.setattr(launcher._knobs.runtime, "launch_enter_hook", types.SimpleNamespace(calls=[]))
    launcher.launch(fn, (1,), x, 32, 5, 0.5, BLOCK=128)
    assert len(fn.slow) == 2  # an empty hook chain is no hook
    for _ in range(2):  # a type the launcher cannot classify: Triton's path, every time
        launcher.launch(fn, (1,), "not a tensor", 32, 5, 0.5, BLOCK=128)
    assert len(fn.slow) == 4


def test_a_missing_parameter_is_a_type_error_naming_it(gpu_less):
    fn = FakeJit()
    x = torch.zeros(64, dtype=torch.int32)
    with pytest.raises(TypeError, match="'scale'"):
        launcher.launch(fn, (1,), x, 32, 5)


def test_under_the_interpreter_every_launch_is_tritons(monkeypatch):
    monkeypatch.setattr(launcher, "INTERPRET", True)
    fn = FakeJit()
    x = torch.zeros(64, dtype=torch.int32)
    for _ in range(3):
        launcher.launch(fn, (1,), x, 32, 5, 0.5, BLOCK=128)
    assert len(fn.slow) == 3
