"""Named problems every backend meets in every run, whatever hypothesis draws: the shapes where jagged
kernels are known to break."""
from conformance.problem import Problem

TILE_EDGES = (15, 16, 17, 63, 64, 65, 127, 128, 129)

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
}
