"""How long a run's checks phase would take under each check order, simulated from a report's records.

    python tools/simulate_check_order.py reports/examples/h200/2026-12-05/warm/report.json [--workers 15]

The records give each check's seconds and, in each worker's order, what a worker's first check of a backend
cost beyond a later one (conformance/check_order.py: first_call_seconds). Each check's own seconds are its
measured ones less that cost where it was its worker's first. The simulation runs pytest-xdist's own
worksteal scheduler (the one a run uses) with workers that pay a backend's first-call cost on their first
check of it (tests/test_check_order.py), for three orders: longest expected first without first-call costs
(the order before they were known), with the measured costs (home shares), and with the priors a run uses
before it has measured any (half of each backend's declared compile cost). It is a model of a run, not a
measurement of one.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from conformance import check_order, registry  # noqa: E402
from conformance.check_order import Check, Measured  # noqa: E402
from conformance.plugin import check_key  # noqa: E402
from test_check_order import simulate  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--workers", type=int, default=15)
    parser.add_argument("--cap", default=None, metavar="BACKEND=SECONDS",
                        help="also simulate with every check of one backend capped at this many seconds "
                             "(e.g. triton-jfa=9: as if its checks had not compiled)")
    parser.add_argument("--compile-s", action="append", default=[], metavar="BACKEND=SECONDS",
                        help="a backend's declared compile cost (Capabilities.compile_s) where the report and the "
                             "backends installed here do not give it (flex declares it on a GPU only)")
    ns = parser.parse_args(argv)
    records = json.loads(ns.report.read_text())["records"]
    ran = [r for r in records if r.get("outcome") != "not-run" and isinstance(r.get("duration_s"), (int, float))]
    first_call = check_order.first_call_seconds(records)
    own = [max(0.0, r["duration_s"] - (first_call.get(r["backend"], 0.0) if first else 0.0))
           for r, first in zip(ran, check_order.first_in_worker(ran))]
    checks = [Check(check_key(r["id"]), r["backend"], r.get("test") != "test_edge_case") for r in ran]
    backends = [c.backend for c in checks]
    declared = {name: (info.get("capabilities") or {}).get("compile_s")
                for name, info in (json.loads(ns.report.read_text()).get("backends") or {}).items()}
    for name in set(backends):
        if declared.get(name) is None:
            try:
                declared[name] = registry.resolve(name).capabilities.compile_s
            except Exception:  # noqa: BLE001 - a backend not installed here: no prior
                pass
    for item in ns.compile_s:
        name, _, seconds = item.partition("=")
        declared[name] = float(seconds)
    priors = {name: check_order.first_call_prior(declared.get(name)) for name in set(backends)}
    print(f"{len(ran)} checks; first-call costs: "
          + ", ".join(f"{b} {s:.1f} s" for b, s in sorted(first_call.items(), key=lambda kv: -kv[1])))
    print(f"check seconds {sum(r['duration_s'] for r in ran):.0f}, of which first calls "
          f"{sum(r['duration_s'] for r in ran) - sum(own):.0f}")
    n = ns.workers
    cases = [("", own)]
    if ns.cap:
        name, _, limit = ns.cap.partition("=")
        cases.append((f" ({name} capped at {float(limit):g} s)",
                      [min(s, float(limit)) if b == name else s for s, b in zip(own, backends)]))
    rows = [("longest first, first calls unknown", {}), ("homes from the measured first calls", first_call),
            ("homes from the priors", {b: s for b, s in priors.items() if s})]
    for suffix, seconds in cases:
        table = {c.key: Measured(s, c.backend) for c, s in zip(checks, seconds)}
        for label, costs in rows:
            wall = simulate(check_order.arrange(checks, table, n, costs), seconds, n, backends, first_call)
            print(f"{label}{suffix}: {wall:.0f} s ({n} workers)")
        print(f"lower bound without first calls{suffix}: {max(sum(seconds) / n, max(seconds)):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
