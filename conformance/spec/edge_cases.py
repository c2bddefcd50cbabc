"""Named problems every backend meets in every run, whatever hypothesis draws: the shapes where jagged
kernels are known to break."""
from conformance.problem import DTYPES, Problem

TILE_EDGES = (15, 16, 17, 63, 64, 65, 127, 128, 129)
GRID_LIMIT_BATCH = 65_537  # past 65,535, the largest y or z dimension of a CUDA launch grid

EDGE_CASES = {
    "empty_batch": Problem((), ()),
    "all_sequences_empty": Problem((0, 0, 0), (0, 0, 0)),
    "queries_without_keys": Problem((3, 5, 2), (0, 4, 0)),
    "causal_more_queries_than_keys": Problem((9, 2), (4, 6), causal="bottom_right"),
    "causal_more_keys_than_queries": Problem((3, 1), (11, 5), causal="bottom_right"),
    "top_left_cross": Problem((7, 3), (3, 7), causal="top_left"),
    "single_token": Problem((1,), (1,), causal="bottom_right"),
    "tile_edges": Problem(TILE_EDGES, TILE_EDGES, causal="bottom_right"),
    "mega_plus_tiny": Problem((300, 1, 0, 2), (300, 1, 0, 2), heads_q=2, heads_kv=1, causal="bottom_right"),
    "mqa_8_to_1": Problem((5, 33), (7, 33), heads_q=8, heads_kv=1, head_dim=32),
    "gqa_ratio_3": Problem((17, 4), (17, 4), heads_q=6, heads_kv=2, head_dim=40, causal="bottom_right"),
    "broadcast_q_with_empty_kv": Problem((5, 5, 5), (3, 0, 7), heads_q=2, heads_kv=2, broadcast_q=True),
    "broadcast_q_causal": Problem((6, 6), (4, 9), broadcast_q=True, causal="bottom_right"),
    "value_dim_differs": Problem((4, 9), (6, 9), head_dim=64, head_dim_v=32),
    "value_dim_wider": Problem((4, 9), (6, 9), head_dim=32, head_dim_v=64),
    # The cases below reuse the kernel configurations of the ones above: they add no compile to a run.
    # GQA decode: one query per sequence at most, one sequence without a query (fast paths that fold the
    # head group into the sequence axis assume exactly one)
    "gqa_decode_empty_query": Problem((1, 0, 1, 1), (5, 3, 0, 9), heads_q=8, heads_kv=1, head_dim=32),
    # what a caller passes: q, k, v sliced from a fused projection, offsets that are every other element of
    # a longer tensor, and the upstream gradient of out.sum() (expanded, stride 0)
    "fused_views_strided_offsets": Problem((5, 0, 17), (5, 3, 17), heads_q=2, heads_kv=1, causal="bottom_right",
                                           layout="row_strided", offsets_layout="strided", grad_layout="expanded"),
    # q, k and v as dense views one element into their buffers: no base is 16-byte aligned (TMA descriptors and
    # 128-bit loads need it; a kernel must honour such views, not read from the boundary below)
    "misaligned_views": Problem((5, 0, 17), (7, 3, 17), layout="offset_view"),
    # every score of a row near -6.5e4 or +6.5e4 (float32 only): finite running-max sentinels, a running max
    # reset to 0 by a fully masked tile, padded keys scored 0 in the backward, a fixed max subtracted
    "scores_far_below_zero": Problem((1, 9, 40), (1, 9, 40), heads_q=2, heads_kv=1, causal="bottom_right",
                                     values="scores_low"),
    "scores_far_above_zero": Problem((5, 20), (5, 20), causal="bottom_right", values="scores_high"),
    # more sequences than a CUDA grid's y or z axis holds (65,535): a kernel that puts the batch (or batch x
    # heads) there fails to launch, and where the launch error goes unchecked the output is never written.
    # One-token sequences keep it cheap; mega_plus_tiny's configuration (two query heads on one KV head).
    "batch_past_grid_limit": Problem((1,) * GRID_LIMIT_BATCH, (1,) * GRID_LIMIT_BATCH, heads_q=2, heads_kv=1,
                                     causal="bottom_right"),
}
# Cases only a GPU run meets, each in one dtype (what breaks does not depend on it): on the CPU there is no
# launch grid to overflow, and a CPU backend's per-sequence loop would take minutes over them.
GPU_CASES = {"batch_past_grid_limit": "bfloat16"}


def in_dtype(case: str, dtype: str) -> Problem | None:
    """Edge case ``case`` in ``dtype``, or None where the dtype cannot hold its values (shifted scores
    outside float32) or the case is a GPU case of another dtype."""
    if case in GPU_CASES and dtype != GPU_CASES[case]:
        return None
    try:
        return EDGE_CASES[case].replace(dtype=dtype)
    except ValueError:
        return None


def device_reason(case: str, device: str) -> str | None:
    """Why ``case`` is not run on ``device`` (a GPU case on a device that is not CUDA), or None."""
    if case in GPU_CASES and not device.startswith("cuda"):
        return f"{case} is judged on CUDA devices only (a launch grid's limit; no grid on {device})"
    return None


def edge_case_params() -> list[tuple[str, str]]:
    """(case, dtype) pairs: every case in every dtype that can hold its values."""
    return [(case, dtype) for case in EDGE_CASES for dtype in DTYPES if in_dtype(case, dtype) is not None]
