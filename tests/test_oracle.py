"""The oracle against a naive per-sequence computation, against the independent online-softmax reference,
and its memory bound."""
from __future__ import annotations

import torch
from hypothesis import given, settings

from conformance.reference_online import ReferenceOnline
from conformance import oracle
from conformance.harness import call_backend, oracle_call
from conformance.problem import Problem, key_visible, make_grad_out, make_inputs
from conformance.strategies import problems
from conformance.backend import Capabilities
from conformance.problem import CAUSAL_MODES
from conformance.tolerance import magnitude, max_error

ALL = Capabilities(causal_modes=CAUSAL_MODES, broadcast_q="native", dtypes=("float32",))


def naive(args):
    """Per-sequence softmax(QK^T)V in float64, written as plainly as possible."""
    args = args.with_broadcast_q_expanded()
    q, k, v = (t.double() for t in (args.q, args.k, args.v))
    group = q.shape[1] // k.shape[1]
    outs, lses = [], []
    for b, (lq, lk) in enumerate(zip(args.seqlens_q, args.seqlens_k)):
        q0, k0 = int(args.cu_seqlens_q[b]), int(args.cu_seqlens_k[b])
        qb = q[q0 : q0 + lq].transpose(0, 1)
        kb = k[k0 : k0 + lk].repeat_interleave(group, 1).transpose(0, 1)
        vb = v[k0 : k0 + lk].repeat_interleave(group, 1).transpose(0, 1)
        s = qb @ kb.transpose(1, 2) * args.softmax_scale
        s = s.masked_fill(~key_visible(torch.arange(lq)[:, None], torch.arange(lk)[None, :], lq, lk, args.causal), float("-inf"))
        lse = torch.logsumexp(s, -1)
        p = torch.nan_to_num(torch.softmax(s, -1))
        outs.append((p @ vb).transpose(0, 1))
        lses.append(lse)
    hq, dv = q.shape[1], v.shape[2]
    return (torch.cat(outs) if outs else q.new_zeros(0, hq, dv)), (torch.cat(lses, 1) if lses else q.new_zeros(hq, 0))


@settings(max_examples=30, deadline=None)
@given(problem=problems(ALL))
def test_oracle_matches_naive_attention(problem):
    args = make_inputs(problem)
    out, lse = naive(args)
    result = oracle.attention(args)
    # float64 rounding of the scores, which grows with their size (shifted-score values put them near
    # -6.5e4; the LSE is as large as the largest score)
    bound = 1e-12 * max(1.0, magnitude(lse))
    assert max_error(result.out, out) < bound
    assert max_error(result.lse, lse) < bound


@settings(max_examples=8, deadline=None)
@given(problem=problems(ALL))
def test_online_reference_agrees_with_the_oracle_including_gradients(problem):
    args, grad_out = make_inputs(problem), make_grad_out(problem)
    expected = oracle_call(args, torch.float64, grad_out)
    online = call_backend(ReferenceOnline(), args, grad_out)
    for name in ("out", "lse", "dq", "dk", "dv"):
        # both are float64 computations returned in float32: they agree to float32 rounding
        reference = getattr(expected, name)
        assert max_error(getattr(online, name), reference) < 1e-5 * max(1.0, magnitude(reference)), name


def test_chunking_keeps_results_and_bounds_memory():
    problem = Problem((700, 3, 0), (650, 5, 2), heads_q=4, heads_kv=2, head_dim=16, causal="bottom_right")
    args = make_inputs(problem)
    whole = oracle.attention(args, budget=1 << 30)
    chunked = oracle.attention(args, budget=1 << 14)  # forces query slices of a few rows
    # padding changes the matmul blocking, so agreement is to float64 rounding, not bitwise
    assert max_error(chunked.out, whole.out) < 1e-13
    assert max_error(chunked.lse, whole.lse) < 1e-13
    items = oracle._work_items(list(problem.seqlens_q), list(problem.seqlens_k), 4, 1 << 14)
    assert all((q1 - q0) * max(1, problem.seqlens_k[b]) * 4 <= 1 << 14 for b, q0, q1 in items)


def test_empty_rows_give_zero_output_minus_inf_lse_and_zero_gradients():
    problem = Problem((4, 3), (2, 0), causal="bottom_right", head_dim=16)
    args, grad_out = make_inputs(problem), make_grad_out(problem)
    run = oracle_call(args, torch.float64, grad_out)
    # rows 0 and 1 of sequence 0 see no key (Lq=4 > Lk=2); sequence 1 has no keys at all
    empty = torch.tensor([True, True, False, False, True, True, True])
    assert torch.all(run.out[empty] == 0)
    assert torch.all(run.lse[:, empty] == float("-inf"))
    assert torch.all(run.dq[empty] == 0)
    for t in (run.out, run.dq, run.dk, run.dv):
        assert not torch.isnan(t).any()
