"""Turns the record stream of the first H200 run into report.json, summary.md and index.html.

That run (``jfa-conformance run --profile dev -n 14 --timeout 120 --no-bench`` over eleven backends) was
stopped by its wall-clock limit before ``jfa-conformance run`` could write its report: the checks it
finished are in its ``.records.jsonl``; the ones it never reached are ``not-run`` here, and the run is
marked incomplete. The environment is what that run printed (see FINDINGS.md), not this machine's;
file names in tracebacks are made relative to the repository.

    PYTHONPATH=. python reports/examples/h200/first-run/assemble.py RECORDS.jsonl reports/examples/h200/first-run
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from backends import registry
from conformance import report as rp
from conformance.cli import write_run_dir

COMMAND = ("jfa-conformance run --profile dev --device cuda --backend reference --backend sdpa --backend sdpa-flash "
           "--backend sdpa-efficient --backend sdpa-cudnn --backend sdpa-math --backend fa4 --backend flex "
           "--backend varlen-attn --backend njt-sdpa --backend triton-jfa -n 14 --no-bench --timeout 120")
ENVIRONMENT = {  # printed by that run's smoke test on the device
    "python": "3.12", "platform": "Linux x86_64", "torch": "2.11.0+cu130", "triton": None, "cuda": "13.0",
    "cudnn": "9.19.0", "packages": {"flash-attn-4": "4.0.0b36", "nvidia-cutlass-dsl": "4.8.1"},
    "device": "cuda", "device_name": "NVIDIA H200", "compute_capability": "9.0", "gpu_count": 1,
    "triton_interpret": False, "git_commit": None, "git_dirty": True,
}
CHECKOUT = re.compile(r"/[^\s\"']*?/(?=(?:conformance|backends|kernels|tests)/)")  # the checkout's absolute prefix
# Capabilities that depend on the machine, as they were on the H200 (torch 2.11 there).
GPU_SIDE = {"flex": {"backward": True}, "varlen-attn": {"gqa": False}}


def main(records_path: str, out_dir: str) -> None:
    collected, records, finished = rp.read_record_stream(records_path)
    # tracebacks name files under the device's checkout; keep them repository-relative
    records = json.loads(CHECKOUT.sub("", json.dumps(records)))
    records = rp.complete_records(
        collected, records, "never ran: the run was stopped by its wall-clock limit")
    backends = {}
    for name in sorted({c["backend"] for c in collected}, key=registry.known_names().index):
        info = registry.describe(name, "cuda")
        backends[name] = {"source": info.source, "available": True, "reason": None,
                          "capabilities": {**info.capabilities, **GPU_SIDE.get(name, {})}}
    report = {
        "schema": rp.SCHEMA, "schema_version": rp.SCHEMA_VERSION,
        "run": {"name": "h200", "command": COMMAND, "started": None, "finished": None,
                "duration_s": None, "profile": "dev",
                "max_examples": None, "seed": None, "dtypes": None, "xfails_file": None, "timeout_s": 120,
                "workers": 14, "gpus": None, "pytest_exit_code": None, "benchmarks": "not run (--no-bench)",
                "complete": False, "environment": ENVIRONMENT,
                "notes": "stopped by the wall-clock limit of its call; assembled from its record stream"},
        "backends": backends,
        "records": records,
        "timings": [],
    }
    report["run"]["exit_code"] = rp.exit_code(report, [])
    write_run_dir(Path(out_dir), report, [])


if __name__ == "__main__":
    main(*sys.argv[1:3])
