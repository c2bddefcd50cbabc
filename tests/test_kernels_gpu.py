"""The kernels on a GPU: lengths spanning several blocks, the Gluon (sm_90) kernels on every shape class they
take, poisoned neighbours, the split forward, torch.compile with inductor.  Skipped without a CUDA GPU; the
helpers and the float64 reference are tests/test_kernels.py's."""
import math

import pytest
import torch

from kernels import Config, JaggedPlan, jagged_flash_attention
from kernels import plan as kplan
from kernels.gluon import dkdv
from test_kernels import (DEVICE, TL_ONLY, TOL, _HAS_CUDA, _first_sequence_alone, make_inputs, needs_cuda, needs_kernels,
                          reference, rel, run_case)


# ---------------------------------------------------------------------------
# GPU: lengths spanning several of the GPU kernels' blocks
# ---------------------------------------------------------------------------
def _gluon_probe():
    if not _HAS_CUDA:
        return "needs a CUDA GPU"
    t = torch.zeros(8, 2, 128, device=DEVICE, dtype=torch.bfloat16)
    return kplan.gluon_refusal(t, t, t, 8)


_GLUON_WHY = _gluon_probe()
needs_gluon = pytest.mark.skipif(bool(_GLUON_WHY), reason=f"the Gluon kernels cannot run here: {_GLUON_WHY}")


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("config", [Config(), TL_ONLY], ids=["default", "tl"])
def test_gpu_multiblock(dtype, causal, config):
    # the default kernels (on sm_90 for bf16/fp16: the Gluon forward for sequences with >= 512 keys, the Gluon
    # dK/dV and dQ kernels at the head dims of dkdv.HEAD_DIMS; tl elsewhere) and the tl kernels alone
    gluon = config.gluon and not _GLUON_WHY and dtype != torch.float32
    for lens_q, lens_k, heads, d in (([300, 0, 513, 129, 64, 700], [257, 5, 513, 400, 0, 200], (4, 2), 128),
                                     ([129, 384], [700, 1], (2, 2), 64)):
        paths = run_case(lens_q, lens_k, hq=heads[0], hkv=heads[1], d=d, causal=causal, dtype=dtype, config=config)[3]
        bwd = "gluon" if gluon and d in dkdv.HEAD_DIMS else "tl"
        assert paths[:4] == ("gluon+tl" if gluon else "tl", bwd, bwd,
                             "dq kernel" if bwd == "gluon" else "preprocess"), paths


@needs_cuda
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("config", [Config(), TL_ONLY], ids=["default", "tl"])
def test_gpu_broadcast_multiblock(causal, config):
    paths = run_case([256], [300, 0, 1, 513, 64, 200, 999, 128] * 3, hq=4, hkv=4, d=128, causal=causal,
                     dtype=torch.bfloat16, broadcast=True, config=config)[3]
    assert paths.dq == "tl" and paths.delta == "preprocess"  # broadcast-Q's dQ sums over the batch: tl


def check_grads_beside_a_poisoned_sequence(poison, *, poisoned_first, d, tol, dtype=torch.bfloat16, config=None):
    """Two sequences of 150 and 140 rows, one filled with inf or NaN (Q, K, V and dO): the clean one's
    gradients must be finite and match the float64 reference.  Ragged blocks of either sequence read or write
    rows of the other, so this finds a kernel that lets them leak.  Returns the paths that ran."""
    la, lb = 150, 140
    q, k, v, cu_q, cu_k = make_inputs([la, lb], [la, lb], 2, 2, d, d, dtype, seed=4)
    do = torch.randn(la + lb, 2, d, generator=torch.Generator().manual_seed(5)).to(dtype)
    bad, good = (slice(0, la), slice(la, None)) if poisoned_first else (slice(la, None), slice(0, la))
    for t in (q, k, v, do):
        t[bad] = float(poison)
    qd, kd, vd = (t.to(DEVICE).requires_grad_() for t in (q, k, v))
    args = (qd, kd, vd, cu_q.to(DEVICE), cu_k.to(DEVICE), la, la)
    out, _ = jagged_flash_attention(*args, config=config)
    out.backward(do.to(DEVICE))
    q64, k64, v64 = (t[good].detach().double().requires_grad_() for t in (q, k, v))
    cu = torch.tensor([0, q64.shape[0]], dtype=torch.int32)
    ref_o, _ = reference(q64, k64, v64, cu, cu, False, 1 / math.sqrt(d), False)
    ref_o.backward(do[good].double())
    for name, got, want in (("dq", qd.grad, q64.grad), ("dk", kd.grad, k64.grad), ("dv", vd.grad, v64.grad)):
        got = got[good].cpu()
        assert torch.isfinite(got).all(), name
        assert rel(got, want) < tol, name
    return JaggedPlan(*args, config=config).paths


GLUON_CASES = [
    # (lens_q, lens_k, hq, hkv, d, dv, broadcast): tiles whose second 64-row half is empty (64, 1, 65),
    # no keys, Lq > Lk and Lq < Lk, ragged tails against BLOCK_N 128, GQA, Dv != D
    ([300, 0, 513, 129, 64, 700, 1, 65], [257, 5, 513, 400, 0, 200, 1, 64], 4, 2, 128, 128, False),
    ([256], [300, 0, 1, 513, 64, 200, 129], 4, 4, 128, 128, True),
    ([200, 7, 130], [190, 300, 1], 2, 1, 64, 64, False),
    ([100, 257], [129, 80], 2, 2, 128, 64, False),
    ([300, 0, 65, 129, 1], [257, 5, 64, 400, 1], 2, 1, 128, 128, False),
    # head dim 64's 64-row query blocks in the dK/dV kernel, under broadcast-Q and GQA, ragged against 64
    ([130], [300, 0, 1, 129, 64, 65], 4, 2, 64, 64, True),
]


def run_gluon_case(case, causal, programs=3, dtype=None):
    """GLUON_CASES[case] with every sequence on the Gluon forward, on ``programs`` programs per kernel (few:
    rings, double buffers and item hand-offs run on across items); fp16 for cases 2 and 4, else bf16."""
    lens_q, lens_k, hq, hkv, d, dv, broadcast = GLUON_CASES[case]
    dtype = dtype or (torch.float16 if case in (2, 4) else torch.bfloat16)
    config = Config(gluon_split_keys=0, gluon_programs=programs)
    return run_case(lens_q, lens_k, hq=hq, hkv=hkv, d=d, dv=dv, causal=causal, dtype=dtype, broadcast=broadcast,
                    config=config)


@needs_gluon
@pytest.mark.parametrize("case", range(len(GLUON_CASES)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("programs", [3, 0], ids=["3-programs", "one-per-sm"])
def test_gpu_gluon_kernels(case, causal, programs):
    # the Gluon forward on every shape class it takes, and the Gluon dK/dV and dQ kernels where they run (D == Dv
    # in dkdv.HEAD_DIMS; dQ not for broadcast-Q), against the float64 reference's outputs and gradients
    paths = run_gluon_case(case, causal, programs)[3]
    lens_q, lens_k, hq, hkv, d, dv, broadcast = GLUON_CASES[case]
    bwd = "gluon" if d == dv and d in dkdv.HEAD_DIMS else "tl"
    assert paths[:3] == ("gluon", bwd, "tl" if broadcast else bwd), paths


@needs_gluon
@pytest.mark.parametrize("case", [0, 2, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_gluon_answers_do_not_depend_on_the_grid(case, causal):
    # one writer per output element: the same bits whichever program takes an item
    runs = [run_gluon_case(case, causal, programs) for programs in (1, 3, 0)]
    for a in runs[1:]:
        assert torch.equal(a[0], runs[0][0]) and torch.equal(a[1], runs[0][1])
        assert all(torch.equal(a[2][n], runs[0][2][n]) for n in ("dq", "dk", "dv"))


@needs_gluon
@pytest.mark.parametrize("scale", [0.01, 2.0])
def test_gpu_gluon_forward_scales(scale):
    # the scale is folded into one FMA per score after the row maximum: flat and sharp softmaxes
    config = Config(gluon_split_keys=0)
    for causal, idx in ((False, torch.int32), (True, torch.int64)):
        paths = run_case([150, 40], [300, 129], hq=2, hkv=2, d=64, causal=causal, dtype=torch.float16, scale=scale,
                         idx=idx, config=config)[3]
        assert paths.forward == "gluon"


@needs_gluon
@pytest.mark.parametrize("poison", ["huge", "inf", "nan"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_gluon_rows_past_lk_never_leak(poison, causal):
    """TMA reads the next sequence's rows past a ragged end; the loader zeroes those value rows and the
    scores are masked, so nothing they hold may reach the first sequence."""
    # 150: a full 128-key block and a ragged one; the second tile's q rows past 150 are read too
    _first_sequence_alone(150, 140, 64, torch.bfloat16, poison, causal, poisoned=("q", "k", "v"),
                          config=Config(gluon_split_keys=0))


@needs_gluon
@pytest.mark.parametrize("d", [128, 64])
@pytest.mark.parametrize("poisoned_first", [True, False])
@pytest.mark.parametrize("poison", ["inf", "nan"])
def test_gpu_gluon_backward_rows_past_the_end_never_leak(poison, poisoned_first, d):
    """A ragged last query block reads the next sequence's Q, dO (and, computing delta, O) rows, a ragged key
    block its K and V rows: none of them may reach the clean sequence's gradients."""
    paths = check_grads_beside_a_poisoned_sequence(poison, poisoned_first=poisoned_first, d=d,
                                                   tol=2 * TOL[torch.bfloat16], config=Config(gluon_split_keys=0))
    assert paths[:4] == ("gluon", "gluon", "gluon", "dq kernel"), paths


@needs_gluon
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_default_forward_is_split_at_512_keys(causal):
    # the default on sm_90: sequences with >= 512 keys on Gluon, the rest on tl, nothing configured
    assert Config().gluon_split_keys == 512
    paths = run_case([300, 0, 513, 129, 64, 700, 3], [257, 5, 513, 400, 0, 200, 600], hq=4, hkv=2, d=128,
                     causal=causal, dtype=torch.bfloat16)[3]
    assert paths[:4] == ("gluon+tl", "gluon", "gluon", "dq kernel"), paths


@needs_gluon
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_split_forward(causal):
    # long sequences on the Gluon forward, short ones on the tl kernel, in one call (split at 256 keys)
    config = Config(gluon_split_keys=256)
    assert run_case([300, 0, 513, 129, 64, 700, 3], [257, 5, 513, 400, 0, 200, 300], hq=4, hkv=2, d=128,
                    causal=causal, dtype=torch.bfloat16, config=config)[3].forward == "gluon+tl"
    assert run_case([200], [300, 0, 1, 129, 700], hq=2, hkv=2, d=64, causal=causal, dtype=torch.float16,
                    broadcast=True, config=config)[3].forward == "gluon+tl"


@needs_gluon
@pytest.mark.parametrize("broadcast", [False, True])
def test_gpu_plan_on_the_split_forward(broadcast):
    # a plan runs the default kernels bit for bit as a plain call
    lens_q, lens_k = ([256], [700, 3, 0, 513, 64]) if broadcast else ([700, 3, 513, 64], [700, 600, 513, 64])
    q, k, v, cu_q, cu_k = (t.cuda() for t in make_inputs(lens_q, lens_k, 4, 2, 128, 128, torch.bfloat16, broadcast))
    args = (q, k, v, cu_q, cu_k, max(lens_q), max(lens_k))
    plain = jagged_flash_attention(*args, causal=True, broadcast_q=broadcast)
    plan = JaggedPlan(*args, causal=True, broadcast_q=broadcast)
    assert plan.paths.forward == "gluon+tl"
    planned = plan(q, k, v)
    assert torch.equal(plain[0], planned[0]) and torch.equal(plain[1], planned[1])


@needs_gluon
def test_gpu_torch_compile_with_inductor_runs_the_gluon_kernels():
    # the default backend (inductor) on a GPU, at a size where every Gluon kernel runs: the same bits as eager
    torch._dynamo.reset()
    lens = [700, 129, 300]
    q, k, v, cu_q, cu_k = (t.to(DEVICE) for t in make_inputs(lens, lens, 4, 2, 128, 128, torch.bfloat16))
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).to(DEVICE)
    # (700 keys: Gluon forward; 129 and 300: the tl forward)
    assert JaggedPlan(q, k, v, cu_q, cu_k, 700, 700, causal=True).paths[:3] == ("gluon+tl", "gluon", "gluon")

    def model(a, b, c):
        return jagged_flash_attention(a, b, c, cu_q, cu_k, 700, 700, causal=True)
    runs = []
    for fn in (model, torch.compile(model, fullgraph=True)):
        a, b, c = (t.detach().clone().requires_grad_() for t in (q, k, v))
        out, lse = fn(a, b, c)
        runs.append((out, lse) + torch.autograd.grad(out, (a, b, c), do))
    assert all(torch.equal(x, y) for x, y in zip(*runs))


@needs_gluon
def test_gpu_gluon_backward_takes_a_do_that_tma_cannot_load():
    # dO as a view whose heads do not merge into one row: the backward copies it and still runs the Gluon
    # kernels, with the same gradients as from a contiguous dO
    lens = [300, 129]
    q, k, v, cu_q, cu_k = (t.to(DEVICE) for t in make_inputs(lens, lens, 2, 2, 128, 128, torch.bfloat16))
    wide = torch.randn(sum(lens), 2, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).to(DEVICE)
    do = wide[..., :128]
    assert kplan.tma_refusal(do, 64)
    plan = JaggedPlan(q, k, v, cu_q, cu_k, 300, 300, causal=True)
    assert plan.paths[1:3] == ("gluon", "gluon")
    grads = []
    for d_out in (do, do.contiguous()):
        a, b, c = (t.detach().clone().requires_grad_() for t in (q, k, v))
        out, _ = plan(a, b, c)
        grads.append(torch.autograd.grad(out, (a, b, c), d_out))
    assert all(torch.equal(x, y) for x, y in zip(*grads))


@needs_kernels
def test_broadcast_q_gradients_of_an_empty_batch_are_zero():
    # No sequence, so no chunk partial of dQ to reduce: dQ of the shared q is zeros (found by the spec's
    # gradient check on a drawn empty batch; it raised IndexError).
    dev = "cuda" if _HAS_CUDA else "cpu"
    q = torch.randn(3, 2, 16, device=dev, requires_grad=True)
    k = torch.randn(0, 2, 16, device=dev, requires_grad=True)
    v = torch.randn(0, 2, 16, device=dev, requires_grad=True)
    cu = torch.zeros(1, dtype=torch.int32, device=dev)
    out, _ = jagged_flash_attention(q, k, v, torch.tensor([0, 3], dtype=torch.int32, device=dev), cu, 3, 0,
                                    broadcast_q=True)
    out.sum().backward()
    assert out.shape == (0, 2, 16) and q.grad.shape == q.shape and not q.grad.any()


@needs_cuda
def test_gpu_a_graph_captured_after_eager_calls_builds_its_own_lists():
    # eager warm-up calls keep their lists (kernels/reuse.py); a CUDA graph captured afterwards must still
    # contain the builders, so that a replay after new offsets are copied into the static buffers is right
    from kernels import reuse
    lens = [300, 0, 513, 129, 64, 700]
    q, k, v, cu_q, cu_k = (t.to(DEVICE) for t in make_inputs(lens, lens, 4, 2, 128, 128, torch.bfloat16))
    call = lambda: jagged_flash_attention(q, k, v, cu_q, cu_k, 1024, 1024, causal=True)[0]  # noqa: E731
    reuse.clear()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(side)
    assert reuse.stats()["hits"] == 1
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    assert reuse.stats()["hits"] == 1  # nothing looked up while capturing
    new = [700, 64, 129, 513, 0, 300]
    _, _, _, new_q, new_k = (t.to(DEVICE) for t in make_inputs(new, new, 4, 2, 128, 128, torch.bfloat16))
    cu_q.copy_(new_q)
    cu_k.copy_(new_k)
    graph.replay()
    want = jagged_flash_attention(q, k, v, new_q, new_k, 1024, 1024, causal=True, config=Config(reuse_lists=False))[0]
    assert torch.equal(out, want)
