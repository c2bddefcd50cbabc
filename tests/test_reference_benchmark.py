"""pytest-benchmark timings: the vectorised oracle against a per-block Python loop (the blockwise
online-softmax algorithm of the project's source document, single head, block 16).

Skipped in ordinary runs (``--benchmark-skip`` in the pytest config); run with
``python -m pytest tests/test_reference_benchmark.py --benchmark-only``.
"""
from __future__ import annotations

import pytest
import torch

from conformance import oracle
from conformance.problem import Problem, make_inputs

BLOCK = 16
def _problem() -> Problem:
    """B=64 sequences with lengths in [192, 320] (mean about 256), one head of dim 64, non-causal."""
    lengths = tuple(int(n) for n in torch.randint(192, 321, (64,), generator=torch.Generator().manual_seed(0)))
    return Problem(lengths, lengths, head_dim=64, dtype="float32")


def blockwise_loop(q, k, v, cu):
    """One head, one (query block, key block) pair per Python iteration."""
    scale = q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    for b in range(len(cu) - 1):
        s, e = int(cu[b]), int(cu[b + 1])
        for i0 in range(s, e, BLOCK):
            qi = q[i0 : min(i0 + BLOCK, e)]
            m = torch.full((qi.shape[0],), float("-inf"))
            l = torch.zeros(qi.shape[0])
            acc = torch.zeros(qi.shape[0], v.shape[1])
            for j0 in range(s, e, BLOCK):
                scores = qi @ k[j0 : min(j0 + BLOCK, e)].T * scale
                m_new = torch.maximum(m, scores.max(-1).values)
                alpha = torch.exp(m - m_new)
                p = torch.exp(scores - m_new[:, None])
                l = alpha * l + p.sum(-1)
                acc = acc * alpha[:, None] + p @ v[j0 : min(j0 + BLOCK, e)]
                m = m_new
            out[i0 : i0 + qi.shape[0]] = acc / l[:, None]
    return out


@pytest.fixture(scope="module")
def inputs():
    return make_inputs(_problem())


def test_bench_blockwise_loop(benchmark, inputs):
    out = benchmark.pedantic(
        blockwise_loop, args=(inputs.q[:, 0], inputs.k[:, 0], inputs.v[:, 0], inputs.cu_seqlens_q), rounds=2, iterations=1
    )
    assert torch.allclose(out, oracle.attention(inputs).out[:, 0].float(), atol=1e-5)


def test_bench_vectorised_oracle(benchmark, inputs):
    result = benchmark.pedantic(oracle.attention, args=(inputs,), rounds=5, iterations=1)
    assert result.out.dtype == torch.float64
