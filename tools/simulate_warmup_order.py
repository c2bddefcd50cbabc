"""When each backend's gate would open under two warm-up orders, simulated from a report's measured jobs.

    python tools/simulate_warmup_order.py reports/examples/h100/2026-12-05/flashinfer/report.json [--workers 15]

A report lists every warm-up job with its seconds (``backends.<name>.time.warmup``). The simulation hands
the jobs, in order, to the first free of ``--workers`` workers (as the warm-up's pool does) and prints the
time each backend's last job ends (its gate: its checks wait for it) under the warm-up's order
(``conformance.warmup.order``, given the measured seconds, as a run that compiles again after an upgrade
is) and under longest-job-first over all backends. It is a model: it leaves out the workers' start-up and
the contention of many compilers on the CPU cores, which made the real gates open later: it gives each job
one core, while one FlashInfer build runs nvcc on every core (for the H100 run of 2026-12-06 it put
FlashInfer's gates near 130 s; on the H200 the same day they opened at 311 s, and the others' at 275-310 s).

Jobs the report gives one ``build`` (``Backend.build_key``) share a compiled artifact: the first makes it
in its measured seconds, a later one costs ``--load-s`` once it is made. The warm-up's order holds such a
job back while its build is being made (``conformance.warmup.next_job``); longest-job-first starts it at
once, to wait for the build (as a process waiting on FlashInfer's JIT lock does).
"""
from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conformance import warmup  # noqa: E402


def gates(jobs, seconds: dict[str, float], workers: int, load_s: float, hold_back: bool) -> dict[str, float]:
    free = [0.0] * workers
    ends: dict[str, float] = {}
    made: dict[str, float] = {}  # build key -> when its first job ends
    pending = list(jobs)
    while pending:
        start = heapq.heappop(free)
        building = {key for key, end in made.items() if end > start}
        index = warmup.next_job(pending, building) if hold_back else 0
        if index is None:  # every pending job waits for a build: this worker idles until the next ends
            heapq.heappush(free, min(end for end in made.values() if end > start))
            continue
        job = pending.pop(index)
        if job.build_key in made:
            end = max(start, made[job.build_key]) + load_s
        else:
            end = start + seconds[f"{job.backend} | {job.config.key}"]
            made[job.build_key] = end
        if job.gate:  # a job only the timings use opens no gate
            ends[job.backend] = max(ends.get(job.backend, 0.0), end)
        heapq.heappush(free, end)
    return ends


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report")
    parser.add_argument("--workers", type=int, default=15)
    parser.add_argument("--load-s", type=float, default=4.0,
                        help="seconds of a job whose build an earlier job made (default 4: FlashInfer's on an H100)")
    args = parser.parse_args(argv)
    report = json.loads(Path(args.report).read_text())
    jobs, seconds = [], {}
    for name, entry in (report.get("backends") or {}).items():
        for w in ((entry.get("time") or {}).get("warmup") or []):
            job = SimpleNamespace(backend=name, name=name, config=SimpleNamespace(key=w["key"]),
                                  build_key=w.get("build") or f"{name} | {w['key']}", background=False,
                                  gate=w.get("for") != "timings")
            jobs.append(job)
            seconds[f"{name} | {w['key']}"] = float(w["seconds"])
    if not jobs:
        print("the report lists no warm-up jobs", file=sys.stderr)
        return 2
    orders = {"warm-up order": warmup.order(jobs, seconds),
              "longest job first": sorted(jobs, key=lambda j: -seconds[f"{j.backend} | {j.config.key}"])}
    names = sorted({j.backend for j in jobs})
    print(f"{len(jobs)} jobs, {sum(seconds.values()):.0f} compile-seconds, {args.workers} workers")
    print("order".ljust(20) + "".join(n.rjust(20) for n in names))
    for label, jobs_in_order in orders.items():
        ends = gates(jobs_in_order, seconds, args.workers, args.load_s, hold_back=label == "warm-up order")
        print(label.ljust(20) + "".join(f"{ends[n]:.0f} s".rjust(20) for n in names))
    measured = (report.get("run") or {}).get("warmup", {}).get("ready_s") or {}
    if measured:
        print("measured".ljust(20) + "".join((f"{measured[n]:.0f} s" if n in measured else "").rjust(20) for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
