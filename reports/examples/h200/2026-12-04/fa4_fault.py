"""Which FA4 inputs fault the device? Each candidate runs in its own process with CUDA_LAUNCH_BLOCKING=1,
so a fault names its kernel launch and cannot spill into the next candidate.

    PYTHONPATH=. python3 reports/examples/h200/2026-12-04/fa4_fault.py [--json PATH]

The first two candidates are the problems two FA4 checks were running when they died in the first run;
the others change one thing at a time (causal, GQA, value head dim, broadcast-Q path).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import subprocess
import sys

from conformance.problem import Problem

RUNNING_AT_LSE_FAULT = Problem((127, 65, 129, 129, 128), (127, 65, 129, 129, 128), heads_q=3, head_dim=16,
                               head_dim_v=128, dtype="bfloat16", causal="bottom_right")
RUNNING_AT_PERMUTATION_FAULT = Problem((33,), (102,), heads_q=16, heads_kv=2, head_dim=16, head_dim_v=40,
                                       dtype="float16", broadcast_q=True)
CANDIDATES = {
    "lse_fault_problem": RUNNING_AT_LSE_FAULT,
    "permutation_fault_problem": RUNNING_AT_PERMUTATION_FAULT,
    "lse_problem_no_causal": dataclasses.replace(RUNNING_AT_LSE_FAULT, causal="none"),
    "lse_problem_no_gqa": dataclasses.replace(RUNNING_AT_LSE_FAULT, heads_kv=3),
    "lse_problem_dv16": dataclasses.replace(RUNNING_AT_LSE_FAULT, head_dim_v=16),
    "lse_problem_d64": dataclasses.replace(RUNNING_AT_LSE_FAULT, head_dim=64),
    "one_seq_d16_dv128": Problem((64,), (64,), heads_q=1, head_dim=16, head_dim_v=128, dtype="bfloat16"),
    "one_seq_d128_dv16": Problem((64,), (64,), heads_q=1, head_dim=128, head_dim_v=16, dtype="bfloat16"),
    "one_seq_d16_dv40": Problem((64,), (64,), heads_q=1, head_dim=16, head_dim_v=40, dtype="float16"),
    "permutation_problem_replicated_q": dataclasses.replace(RUNNING_AT_PERMUTATION_FAULT, broadcast_q=False),
    "permutation_problem_dv16": dataclasses.replace(RUNNING_AT_PERMUTATION_FAULT, head_dim_v=16),
    "control_d16": Problem((64, 9), (64, 9), heads_q=2, heads_kv=2, head_dim=16, dtype="bfloat16"),
}

CHILD = """
import json, sys
from backends.fa4 import FA4
from conformance.harness import judge_forward, judge_gradients, run_backend
from conformance.problem import Problem
fields = json.loads(sys.argv[1])
p = Problem(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
for gradients in (False, True):
    run = run_backend(FA4(), p, "cuda", gradients=gradients)
    verdicts = judge_forward(p, run) + (judge_gradients(p, run) if gradients else [])
    bad = [f"{v.quantity} {v.observed:.3g} > {v.allowed:.3g}" for v in verdicts if not v.ok]
    print(("grad " if gradients else "fwd ") + ("FAIL " + ", ".join(bad) if bad else "ok"), flush=True)
"""


def run_one(name: str, problem: Problem) -> dict:
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(dataclasses.asdict(problem))], env=env,
                          capture_output=True, text=True, timeout=300)
    lines = proc.stdout.split()
    fault = [l for l in proc.stderr.splitlines() if "error" in l.lower()][-3:]
    return {"name": name, "problem": repr(problem), "rc": proc.returncode, "stdout": proc.stdout.strip(),
            "error": "\n".join(fault), "stderr_tail": proc.stderr[-3000:], "ok": proc.returncode == 0 and
            "FAIL" not in lines}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--jobs", type=int, default=6)
    ns = parser.parse_args()
    with concurrent.futures.ThreadPoolExecutor(ns.jobs) as pool:
        results = list(pool.map(lambda item: run_one(*item), CANDIDATES.items()))
    for r in results:
        outcome = r["stdout"].replace("\n", "; ") or "-"
        print(f"{r['name']:34} rc={r['rc']:<3} {outcome}  {r['error'].splitlines()[-1][:150] if r['error'] else ''}")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
