"""The warm-up compiles what the checks launch: every Triton kernel variant (compile key, as sm_90 keys it)
that the ci profile's checks of triton-jfa launch is launched by the run's warm-up of the same run set.

A variant the warm-up misses is compiled inside a check, under the per-check timeout, on every cold GPU
run: on the H200 such compiles cost triton-jfa's checks up to a minute each. The keys are taken under
Triton's interpreter (tests/triton_keys.py), so this runs on the CPU; the Gluon kernels, which the
interpreter does not run, are outside it.
"""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import triton_keys

pytestmark = [
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                       reason="the keys are read from interpreted launches (TRITON_INTERPRET=1)"),
    pytest.mark.skipif(bool(triton_keys.available()), reason=triton_keys.available() or "-"),
]

ROOT = Path(__file__).resolve().parent.parent
SEED = 0


def _check_keys(tmp_path, profile="ci") -> dict:
    """Keys the profile's triton-jfa checks launch (a pytest session of the spec in a subprocess)."""
    out = tmp_path / "check-keys.json"
    env = {**os.environ, "JFA_TRITON_KEYS_OUT": str(out),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "pytest", str(ROOT / "conformance" / "spec"), "-p", "conformance.plugin",
               "-p", "triton_keys", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "--backend", "triton-jfa",
               "--device", "cpu", "--hypothesis-profile", profile, f"--hypothesis-seed={SEED}"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return triton_keys.load(out)


def test_warmup_launches_every_variant_the_checks_launch(tmp_path):
    checks = _check_keys(tmp_path)
    warm = triton_keys.warm_keys("ci", SEED)
    assert checks and warm
    kernels = {key[0] for key in checks}
    assert {"_fwd_kernel", "_bwd_kv_kernel", "_bwd_q_kernel", "_order_kernel"} <= kernels  # forward, backward, builders
    missing = {key: labels for key, labels in checks.items() if key not in warm}
    lines = [f"{key[0]} in {sorted(labels)[:3]}: " + "; ".join(triton_keys.difference(key, warm))
             for key, labels in missing.items()]
    assert not missing, f"{len(missing)} of {len(checks)} kernel variants are compiled inside checks:\n" + \
        "\n".join(lines)
    # and the warm-up stays within its compile budget: each variant is one sm_90 compile on a cold GPU run (75
    # here, for the seed-0 configurations; 121 while head counts and flags were specialized on being 1)
    assert len(warm) <= 90, f"the ci warm-up launches {len(warm)} Triton variants (tools/compile_census.py)"


def test_launch_key_follows_tritons_specialisation():
    """The recorder's keys separate what sm_90 compiles apart (and nothing else): integers equal to 1 or
    divisible by 16, 16-byte-aligned pointers, constexpr values, launch options; ``do_not_specialize``
    arguments are keyed by type only."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["n"])
    def kernel(X, stride, n, BLOCK: tl.constexpr):
        tl.store(X + tl.arange(0, BLOCK) * 0, tl.load(X) + stride * 0 + n * 0)

    x = torch.zeros(64, dtype=torch.float32)
    with triton_keys.KeyRecorder() as recorder:
        for stride, n, view, block, warps in ((32, 5, x, 4, 4), (48, 7, x, 4, 4),  # one variant
                                              (1, 5, x, 4, 4), (17, 5, x, 4, 4),   # stride 1; stride not /16
                                              (32, 5, x[1:], 4, 4),                # pointer not 16-byte aligned
                                              (32, 5, x, 8, 4), (32, 5, x, 4, 8)):  # constexpr; num_warps
            kernel[(1,)](view, stride, n, BLOCK=block, num_warps=warps)
    assert len(recorder.keys) == 6
    stride_kinds = {dict((a[0], a[1:]) for a in key[1])["stride"] for key in recorder.keys}
    assert stride_kinds == {("i32", "D"), ("constexpr", "1"), ("i32", "")}
    assert {dict((a[0], a[1:]) for a in key[1])["n"] for key in recorder.keys} == {("i32", "None")}


def test_kernel_view_gives_degenerate_dimensions_dense_strides():
    """Strides that address nothing (size-1 dimensions; every dimension of an empty tensor) are made the
    dense ones, so that such views launch the variants a dense tensor does; the elements are the same."""
    import torch
    from kernels.launch import kernel_view

    base = torch.arange(3 * 5, dtype=torch.float32)
    one_row_one_head = torch.empty(8, 1, 1).permute(2, 1, 0)  # [1, 1, 8], strides (1, 1, 1)
    one_row_one_head.copy_(base[:8].view(1, 1, 8))
    cases = [
        (one_row_one_head, (8, 8, 1)),
        (torch.empty(0, 3, 4).as_strided((0, 3, 4), (1, 1, 3)), (12, 4, 1)),  # what an empty dO can carry
        (torch.arange(24.0).as_strided((6, 1, 4), (4, 1, 1)), (4, 4, 1)),    # one head (set values: a NaN
                                                                              # in empty memory is != itself)
        (base.view(3, 5)[:, :4].unsqueeze(1), (5, 4, 1)),                     # strided rows stay strided
    ]
    for t, strides in cases:
        view = kernel_view(t)
        assert view.stride() == strides, (t.stride(), view.stride())
        assert view.shape == t.shape and torch.equal(view, t)
    dense = torch.zeros(4, 2, 8)
    assert kernel_view(dense) is dense  # nothing to change: no copy, no new view


def test_head_counts_and_call_flags_select_no_variant():
    """Within one kernel configuration, the only compile-key differences between calls are constexprs: head
    counts (1 included), the GQA group (1 included) and the builders' flags (causal, broadcast, tile sizes)
    are runtime values. Each "equal to 1" specialisation would otherwise double a configuration's compiles."""
    import torch
    from kernels import jagged_flash_attention

    lens = [5, 0, 17, 3]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    total = int(cu[-1])
    with triton_keys.KeyRecorder() as recorder:
        for hq, hkv in ((1, 1), (3, 3), (4, 2), (6, 1)):
            for causal in (False, True):
                g = torch.Generator().manual_seed(hq * 10 + hkv)
                q = torch.randn(total, hq, 16, generator=g, dtype=torch.float16).requires_grad_()
                k, v = (torch.randn(total, hkv, 16, generator=g, dtype=torch.float16).requires_grad_()
                        for _ in range(2))
                out, _ = jagged_flash_attention(q, k, v, cu, cu, None, None, causal=causal)
                out.float().sum().backward()
    from kernels import schedule, tl

    def constexprs(function):  # the parameters a kernel declares tl.constexpr
        return {n for n, a in inspect.get_annotations(function.fn).items() if "constexpr" in str(a)}

    declared = {name: constexprs(getattr(module, name)) for module in (tl, schedule) for name in dir(module)
                if hasattr(getattr(module, name), "fn")}
    by_constexprs: dict[tuple, list] = {}
    for key in recorder.keys:
        fixed = tuple(a for a in key[1] if a[0] in declared[key[0]]) + key[2]
        by_constexprs.setdefault((key[0], fixed), []).append(key)
    kernels = {name for name, _ in by_constexprs}
    assert {"_fwd_kernel", "_bwd_kv_kernel", "_bwd_q_kernel", "_order_kernel", "_lists_kernel"} <= kernels
    split = {name: [triton_keys.difference(k, [keys[0]]) for k in keys[1:]]
             for (name, _), keys in by_constexprs.items() if len(keys) > 1}
    assert not split, f"calls of one configuration compile apart: {split}"
    assert len({fixed for name, fixed in by_constexprs if name == "_fwd_kernel"}) == 2  # CAUSAL is a constexpr


def test_compile_census_compiles_each_recorded_variant_for_sm90(tmp_path):
    """tools/compile_census.py compiles every recorded key for sm_90, each into its own binary (in its own
    process: the interpreter leaves Triton's language patched in the process that ran it)."""
    import torch
    from kernels import jagged_flash_attention

    if not triton_keys.has_ptxas():
        pytest.skip("this Triton has no bundled ptxas")
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    with triton_keys.KeyRecorder() as recorder:
        for hq in (1, 2):
            q, k, v = (torch.randn(10, hq, 16, dtype=torch.float16) for _ in range(3))
            jagged_flash_attention(q, k, v, cu, cu, None, None, causal=hq == 2)
    keys = tmp_path / "keys.json"
    triton_keys.dump(recorder.keys, keys)
    out = tmp_path / "census.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_census.py"), "--keys", str(keys),
                           "--json", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    import json
    rows = json.loads(out.read_text())["variants"]
    assert len(rows) == len(recorder.keys) >= 4  # the builders and the forward, causal or not
    assert len({r["hash"] for r in rows}) == len(rows)
    assert all(r["seconds"] > 0 and r["ptx_target"] in ("sm_90", "sm_90a") for r in rows)
    assert "_fwd_kernel" in done.stdout


def test_views_with_unaligned_bases_are_copied_not_compiled_apart():
    """A dense view one element into its buffer (no 16-byte aligned base) gets the aligned tensors' answers and
    gradients, bit for bit, and launches their variants: the kernels copy it rather than compile for it."""
    import torch
    from kernels import JaggedPlan, jagged_flash_attention

    cu = torch.tensor([0, 5, 5, 22], dtype=torch.int32)
    g = torch.Generator().manual_seed(3)
    base = [torch.randn(22, 2, 16, generator=g, dtype=torch.float16) for _ in range(3)]

    def offset_view(t):
        buffer = torch.full((1 + t.numel(),), float("nan"), dtype=t.dtype)
        view = buffer[1:].view(t.shape)
        view.copy_(t)
        return view.requires_grad_()

    results = []
    for make in (lambda t: t.clone().requires_grad_(), offset_view):
        q, k, v = (make(t) for t in base)
        with triton_keys.KeyRecorder() as recorder:
            out, lse = jagged_flash_attention(q, k, v, cu, cu, None, None, causal=True)
            grads = torch.autograd.grad(out.float().sum(), (q, k, v))
            plan_out, _ = JaggedPlan(q, k, v, cu, cu, None, None, causal=True)(q, k, v)
        results.append((out, lse, grads, plan_out, set(recorder.keys)))
    (out_a, lse_a, grads_a, plan_a, keys_a), (out_m, lse_m, grads_m, plan_m, keys_m) = results
    assert base[0].data_ptr() % 16 == 0
    assert keys_m == keys_a, f"{len(keys_m - keys_a)} variants launched for the unaligned views alone"
    assert torch.equal(out_a, out_m) and torch.equal(lse_a, lse_m) and torch.equal(plan_a, plan_m)
    assert all(torch.equal(a, m) for a, m in zip(grads_a, grads_m))
