"""Merges the shard runs of the H200 dev report into report.json, summary.md and index.html here.

Each shard is one ``jfa-conformance run`` directory (see FINDINGS.md for the commands). Before merging,
this makes the shards fit for the repository:

* every replay artifact moves to ``failures/`` here, and the replay commands name it by its path in the
  repository (the shards wrote paths of the machine they ran on);
* the shards stopped by ``--time-limit`` were written before the command-line fix that gives every
  unrun check that reason, so their unrun checks get it here (``complete_records(stopped=True)``).

    PYTHONPATH=. python reports/examples/h200/assemble.py SHARD_DIR... [--out reports/examples/h200]
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from conformance import report as rp
from conformance.cli import write_run_dir

HERE = Path("reports/examples/h200")


def prepare(shard_dir: Path, out: Path) -> dict:
    report = rp.load(shard_dir / "report.json")
    stopped = report["run"].get("stopped")
    if stopped:
        report["records"] = rp.complete_records([], report["records"], f"never ran: {stopped}", stopped=True)
    (out / "failures").mkdir(parents=True, exist_ok=True)
    for r in report["records"]:
        replay = r.get("replay")
        if not replay or not replay.get("artifact"):
            continue
        name = Path(replay["artifact"]).name
        shutil.copyfile(shard_dir / "failures" / name, out / "failures" / name)
        where = str(HERE / "failures" / name)
        r["replay"] = {"artifact": where, "command": re.sub(r"\S*" + re.escape(name), where, replay["command"])}
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--name", default="h200-dev")
    ns = parser.parse_args()
    merged = rp.merge([prepare(s, ns.out) for s in ns.shards], name=ns.name)
    merged["run"]["exit_code"] = rp.exit_code(merged)
    write_run_dir(ns.out, merged)
    counts: dict[str, int] = {}
    for r in merged["records"]:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    print(json.dumps({"checks": len(merged["records"]), **counts}))


if __name__ == "__main__":
    main()
