"""Poisoned memory: NaN guards around inputs, and (on CUDA) NaN in the caching allocator's free blocks,
so that output a kernel never writes reads back as NaN and is caught."""
from __future__ import annotations

import pytest
import torch

from conformance import harness, mutants
from conformance.backend import Backend
from conformance.harness import call_backend, judge_forward, run_backend
from conformance.poison import bitwise_equal, guarded, poison_free_memory
from conformance.problem import Output, Problem, laid_out, make_grad_out, make_inputs

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_guarded_view_is_the_tensor_between_nan_rows():
    t = torch.randn(5, 2, 3, dtype=torch.float16)
    buffer, view = guarded(t, rows=2)
    assert torch.equal(view, t) and view.is_contiguous() and view.storage_offset() == 2 * 2 * 3
    assert buffer[:2].isnan().all() and buffer[-2:].isnan().all()
    assert view.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()


@pytest.mark.parametrize("layout", ["row_strided", "head_strided"])
def test_a_strided_tensor_is_guarded_with_its_strides_and_nan_in_its_gaps(layout):
    t = laid_out(torch.randn(5, 3, 8), layout)
    buffer, view = guarded(t)
    assert view.stride() == t.stride() and torch.equal(view, t)
    written = torch.zeros(buffer.numel(), dtype=torch.bool)
    written[torch.as_strided(torch.arange(buffer.numel()), view.shape, view.stride(), view.storage_offset()).flatten()] = True
    assert buffer[~written].isnan().all() and not buffer[written].isnan().any()
    assert written.nonzero().min() >= 4 * t.stride(0)  # NaN rows before the first row, as for a packed tensor


def test_an_expanded_tensor_is_guarded_with_its_zero_strides():
    # broadcast-Q emulated for a backend: one query row per sequence, q expanded without a copy
    problem = Problem(seqlens_q=(1, 1), seqlens_k=(1, 1), broadcast_q=True, dtype="bfloat16",
                      causal="bottom_right")
    q = make_inputs(problem).with_broadcast_q_expanded().q
    assert 0 in q.stride()
    buffer, view = guarded(q)
    assert view.stride() == q.stride() and torch.equal(view, q)
    row = q[0].numel()
    assert view.storage_offset() == 4 * row  # four rows' worth of NaN before, as for a packed tensor
    assert buffer[: 4 * row].isnan().all() and buffer[-4 * row :].isnan().all()
    assert buffer.isnan().sum() == buffer.numel() - row


def test_bitwise_equal_sees_nan_payloads_and_signed_zeros():
    a = torch.tensor([0.0, float("nan")])
    assert bitwise_equal(a, a.clone())
    assert not bitwise_equal(a, torch.tensor([-0.0, float("nan")]))
    assert not bitwise_equal(a, a.double())


def test_poisoning_is_a_no_op_off_cuda():
    assert poison_free_memory("cpu") == 0


def test_unwritten_rows_are_caught_on_cpu():
    """On CPU the allocator cannot be poisoned, so the mutant fills its buffer with NaN itself: the rows
    it never writes fail the forward check, whatever else is right."""
    problem = Problem((7, 4), (5, 9))  # 11 rows: with 16-row blocks none is ever written
    verdicts = judge_forward(problem, run_backend(mutants.UnwrittenTail(), problem, "cpu"))
    assert not verdicts[0].ok and verdicts[0].observed == float("inf")
    assert verdicts[1].ok  # its LSE is right: only the unwritten output betrays it


class EmptyTail(Backend):
    """Writes every output row but the last into a ``torch.empty`` buffer: the bug as a GPU kernel has it."""

    name = "empty-tail"
    capabilities = mutants.Unmutated.capabilities

    def forward(self, args):
        correct = mutants.Unmutated().forward(args)
        out = torch.empty_like(correct.out)
        out[:-1] = correct.out[:-1]
        return Output(out, correct.lse)


@needs_cuda
def test_free_blocks_read_back_as_nan():
    stale = torch.ones(1 << 20, device="cuda")
    del stale  # its block is now free in the cache, still holding ones
    assert poison_free_memory("cuda") >= 4 << 20
    reused = torch.empty(1 << 20, device="cuda")
    assert reused.isnan().all()


@needs_cuda
def test_poisoning_does_not_grow_reserved_memory():
    torch.empty(3 << 20, device="cuda")
    reserved = torch.cuda.memory_reserved()
    poison_free_memory("cuda")
    assert torch.cuda.memory_reserved() <= reserved + (2 << 20)


@needs_cuda
def test_unwritten_rows_are_caught_on_cuda():
    """A correct result computed just before leaves its block in the cache; without poisoning the
    kernel's ``torch.empty`` would likely hand that stale, plausible row back."""
    problem = Problem((33, 31), (40, 20), heads_q=2, heads_kv=2, head_dim=32)
    run_backend(mutants.Unmutated(), problem, "cuda")
    verdicts = judge_forward(problem, run_backend(EmptyTail(), problem, "cuda"))
    assert not verdicts[0].ok and verdicts[0].observed == float("inf")


def test_harness_poisons_before_forward_and_backward(monkeypatch):
    calls = []
    monkeypatch.setattr(harness, "poison_free_memory", lambda device: calls.append(torch.device(device).type))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    problem = Problem((3,), (3,))
    call_backend(mutants.Unmutated(), make_inputs(problem, device), make_grad_out(problem, device))
    assert calls == [device, device]
