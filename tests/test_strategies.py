"""Meta-tests of the spec's own helpers: drawn problems stay inside the declared capabilities."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.backend import Capabilities
from conformance.problem import Problem, make_inputs
from conformance.strategies import lengths, problems
from conformance.validation import validate_packed_inputs

NARROW = Capabilities(
    dtypes=("float16",), head_dims=(64, 128), causal_modes=("none",), gqa=False, cross_attention=False,
    zero_length=False, broadcast_q="none", value_dim_differs=False,
)


@settings(max_examples=60, deadline=None)
@given(problem=problems(NARROW))
def test_problems_respect_capabilities(problem):
    assert problem.dtype == "float16"
    assert problem.head_dim in (64, 128) and problem.value_dim == problem.head_dim
    assert problem.causal == "none" and problem.heads_q == problem.heads_kv
    assert not problem.broadcast_q and problem.seqlens_q == problem.seqlens_k
    assert 0 not in problem.seqlens_k


@settings(max_examples=60, deadline=None)
@given(problem=problems(Capabilities(broadcast_q="native", max_drawn_rows=100)))
def test_drawn_problems_are_valid_inputs_and_honour_the_size_hint(problem):
    args = make_inputs(problem)
    seqlens_q, seqlens_k = validate_packed_inputs(
        args.q, args.k, args.v, args.cu_seqlens_q, args.cu_seqlens_k, args.max_seqlen_q, args.max_seqlen_k,
        broadcast_q=args.broadcast_q, softmax_scale=args.softmax_scale,
    )
    assert tuple(seqlens_q) == problem.seqlens_q and tuple(seqlens_k) == problem.seqlens_k
    rows = (problem.dense_lq if problem.broadcast_q else sum(problem.seqlens_q)) + sum(problem.seqlens_k)
    assert rows <= 100 + 2 * problem.batch  # lengths are floored at 1 where non-zero
    assert problem.heads_q <= 4


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_tile_edge_law_hits_tile_edges(data):
    drawn = data.draw(lengths(6, "tile_edges", "lens"))
    assert set(drawn) <= {1, 15, 16, 17, 63, 64, 65, 127, 128, 129}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(seqlens_q=(1,), seqlens_k=(1, 2)), "seqlens_q has 1 entries"),
        (dict(seqlens_q=(-1,), seqlens_k=(1,)), "non-negative"),
        (dict(seqlens_q=(1,), seqlens_k=(1,), heads_q=3, heads_kv=2), "multiple of heads_kv"),
        (dict(seqlens_q=(1,), seqlens_k=(1,), dtype="int8"), "dtype"),
        (dict(seqlens_q=(1,), seqlens_k=(1,), causal="diagonal"), "causal"),
        (dict(seqlens_q=(1,), seqlens_k=(1,), scale=float("nan")), "scale"),
        (dict(seqlens_q=(1, 2), seqlens_k=(1, 2), broadcast_q=True), "broadcast_q"),
    ],
)
def test_problem_rejects_malformed_descriptions(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Problem(**kwargs)


def test_visible_pairs_counts_bottom_right_causal():
    # Lq=2, Lk=3: row 0 sees keys 0..1, row 1 sees 0..2 -> 5 pairs; top-left: 1 + 2 = 3
    assert Problem((2,), (3,), causal="bottom_right").visible_pairs() == 5
    assert Problem((2,), (3,), causal="top_left").visible_pairs() == 3
    assert Problem((2,), (3,)).visible_pairs() == 6


def test_a_shrunk_counterexample_has_the_simplest_configuration_that_fails():
    """Configurations are offered simplest first, the run's whole list before the ones only drawn examples
    run, so shrinking (toward the front) lands on the simplest configuration that still fails."""
    from hypothesis import find

    from conformance.configs import ConfigSet, KernelConfig
    from conformance.strategies import problems, simplicity

    plain = KernelConfig("float32", 64, None, 1, 1, "none", False, None)
    fancy = KernelConfig("bfloat16", 128, 64, 8, 2, "bottom_right", False, 0.3, "int64")
    gqa = KernelConfig("float16", 32, None, 4, 2, "none", False, None)
    assert sorted([fancy, gqa, plain], key=simplicity) == [plain, gqa, fancy]
    configs = ConfigSet([fancy, gqa, plain], fresh=[fancy, gqa])
    # any problem with a sequence fails: the shrunk one has the plain configuration, though it is no fresh one
    found = find(problems(configs=configs, min_batch=1), lambda p: sum(p.seqlens_k) > 0)
    assert KernelConfig.of(found) == plain


def test_long_sequences_are_drawn_where_the_oracle_stays_cheap():
    # past 512 keys kernels switch paths; the mega law reaches there, but only for problems of at most
    # LONG_MAX_WIDTH query heads x head dim, and never for a backend that caps its drawn rows
    from hypothesis import find
    from conformance.strategies import LONG_LENGTHS, LONG_MAX_WIDTH

    long = find(problems(Capabilities()), lambda p: max(p.seqlens_k, default=0) > 512,
                settings=settings(max_examples=2000, database=None))
    assert long.length_law == "mega_plus_tiny" and max(long.seqlens_k) <= LONG_LENGTHS[1]

    @settings(max_examples=300, deadline=None, database=None)
    @given(problem=problems(Capabilities()))
    def width_capped(problem):
        if max(problem.seqlens_q + problem.seqlens_k, default=0) > 512:
            assert problem.heads_q * max(problem.head_dim, problem.value_dim) <= LONG_MAX_WIDTH

    @settings(max_examples=300, deadline=None, database=None)
    @given(problem=problems(Capabilities(max_drawn_rows=160)))
    def capped_backends_never(problem):
        assert max(problem.seqlens_q + problem.seqlens_k, default=0) <= 320

    width_capped()
    capped_backends_never()
