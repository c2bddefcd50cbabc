"""One small problem per feature on every GPU adapter, before the full spec run: a table of verdicts.

    PYTHONPATH=. python3 reports/examples/h200/smoke.py [--json PATH] [NAME ...]
"""
from __future__ import annotations

import argparse
import json
import time
import traceback
import warnings

import torch

from backends import registry
from conformance.harness import Unsupported, judge_forward, judge_gradients, run_backend
from conformance.problem import Problem

ADAPTERS = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math", "flex", "varlen-attn", "njt-sdpa", "fa4",
            "flash-attn", "tlx-jfa", "triton-jfa")
PROBLEMS = {
    "jagged": Problem((5, 130, 1, 64), (7, 130, 2, 64), heads_q=2, heads_kv=2, head_dim=64, dtype="bfloat16", seed=1),
    "gqa": Problem((17, 40), (33, 40), heads_q=8, heads_kv=2, head_dim=128, dtype="float16", seed=2),
    "causal_cross": Problem((9, 3, 40), (4, 11, 40), heads_q=2, heads_kv=1, head_dim=64, dtype="bfloat16",
                            causal="bottom_right", seed=3),
    "empty_kv": Problem((3, 5, 2), (0, 4, 0), heads_q=2, heads_kv=2, head_dim=64, dtype="bfloat16", seed=4),
    "broadcast_q": Problem((16, 16, 16), (3, 0, 70), heads_q=2, heads_kv=2, head_dim=64, dtype="bfloat16",
                           broadcast_q=True, seed=5),
    "d40_dv72": Problem((20, 9), (31, 9), heads_q=2, heads_kv=2, head_dim=40, head_dim_v=72, dtype="bfloat16", seed=6),
    "d256": Problem((20, 9), (31, 9), heads_q=2, heads_kv=2, head_dim=256, dtype="bfloat16", seed=7),
    "fp32": Problem((20, 9), (31, 9), heads_q=2, heads_kv=2, head_dim=64, dtype="float32", seed=8),
}


def check(backend, problem: Problem) -> str:
    gradients = backend.capabilities.backward
    try:
        run = run_backend(backend, problem, "cuda", gradients=gradients)
    except Unsupported as exc:
        return f"unsupported: {str(exc)[:90]}"
    verdicts = judge_forward(problem, run) + (judge_gradients(problem, run) if gradients else [])
    bad = [f"{v.quantity} {v.observed:.2e}>{v.allowed:.2e}" for v in verdicts if not v.ok]
    budget = max((v.budget_used for v in verdicts), default=0.0)
    return ("FAIL " + ", ".join(bad)) if bad else f"ok ({'+'.join(v.quantity for v in verdicts)}; {budget:.0%})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("names", nargs="*", default=list(ADAPTERS))
    parser.add_argument("--json")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print(f"torch {torch.__version__}, cuda {torch.version.cuda}, cudnn {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()} sm_{''.join(map(str, torch.cuda.get_device_capability()))}")
    rows = []
    for name in args.names:
        backend = registry.resolve(name)
        reason = backend.unavailable_reason("cuda")
        if reason:
            rows.append((name, "-", f"unavailable: {reason}", 0.0))
            print(f"{name:15s} unavailable: {reason}", flush=True)
            continue
        for label, problem in PROBLEMS.items():
            start = time.perf_counter()
            try:
                verdict = check(backend, problem)
            except Exception as exc:  # a crash is a result here
                verdict = f"ERROR {type(exc).__name__}: {str(exc)[:160]}"
                traceback.print_exc(limit=3)
            seconds = time.perf_counter() - start
            rows.append((name, label, verdict, seconds))
            print(f"{name:15s} {label:13s} {seconds:6.1f}s  {verdict}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(zip(("backend", "problem", "verdict", "seconds"), r)) for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
