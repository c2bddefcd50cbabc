"""Plain callables are first-class backends: a correct one passes the spec, a planted bug is caught with a
shrunk, readable counterexample, and NotImplementedError means "unsupported"."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conformance.callable import CallableBackend
from conformance.registry import resolve
from conformance.harness import Unsupported, run_backend
from conformance.problem import Problem

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/plain_callable.py"


def run_spec(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "conformance/spec", "-q", "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_correct_callable_passes_the_spec():
    result = run_spec("--backend", f"{EXAMPLE}:attention")
    assert result.returncode == 0, result.stdout[-3000:]
    assert " passed" in result.stdout


def test_top_left_bug_is_caught_with_a_shrunk_counterexample():
    result = run_spec("--backend", f"{EXAMPLE}:attention_top_left", "-k", "test_forward", "--max-examples", "200")
    assert result.returncode == 1, result.stdout[-3000:]
    out = result.stdout
    assert "Draw 1 (problem): Problem(" in out
    assert "causal='bottom_right'" in out
    # Shrunk: a single sequence with more queries than keys is the smallest case where alignments differ.
    assert "seqlens_k=(1,)" in out and "observed error" in out and "budget used" in out


def test_edge_cases_catch_the_top_left_bug_under_the_default_profile():
    result = run_spec("--backend", f"{EXAMPLE}:attention_top_left", "-k", "test_edge_case")
    assert result.returncode == 1
    assert "causal_more_keys_than_queries" in result.stdout


def _raises_for_causal(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, softmax_scale=None):
    if causal:
        raise NotImplementedError("causal masking is not implemented")
    from examples.plain_callable import attention

    return attention(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, softmax_scale=softmax_scale)


def test_not_implemented_error_means_unsupported_with_its_message():
    backend = CallableBackend(_raises_for_causal, "raises-for-causal")
    with pytest.raises(Unsupported, match="causal masking is not implemented"):
        run_backend(backend, Problem((3,), (3,), causal="bottom_right"), "cpu")
    run_backend(backend, Problem((3,), (3,)), "cpu")  # the supported part still runs


def test_broadcast_q_keyword_makes_broadcast_native(tmp_path):
    module = tmp_path / "native_bq.py"
    module.write_text(textwrap.dedent("""
        def fn(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, softmax_scale=None, broadcast_q=False):
            raise NotImplementedError
        def plain(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, softmax_scale=None):
            raise NotImplementedError
    """))
    assert resolve(f"{module}:fn").capabilities.broadcast_q == "native"
    assert resolve(f"{module}:plain").capabilities.broadcast_q == "emulated"


def test_output_without_graph_is_unsupported_backward():
    def no_grad_fn(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, softmax_scale=None):
        from examples.plain_callable import attention

        out, lse = attention(q.detach(), k.detach(), v.detach(), cu_q, cu_k, max_q, max_k, causal=causal,
                             softmax_scale=softmax_scale)
        return out, lse

    with pytest.raises(Unsupported, match="autograd graph"):
        run_backend(CallableBackend(no_grad_fn, "no-grad"), Problem((3,), (4,)), "cpu", gradients=True)
