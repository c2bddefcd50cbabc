"""The run report: assembling ``report.json`` (schema in reports/README.md), gating, compare and merge.

A report is plain JSON data; everything here reads and writes dicts so that reports from other machines
and older runs load without the code that made them. Rendering (summary.md, index.html, plots) lives in
:mod:`conformance.reporting`.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

SCHEMA = "jfa-conformance-report"
SCHEMA_VERSION = 1
OUTCOMES = ("pass", "fail", "crash", "timeout", "not-run", "expected-fail", "unsupported")
FAILING = ("fail", "crash", "timeout", "not-run")
# Worst first: a matrix cell shows the worst outcome among its records.
SEVERITY = {"crash": 0, "timeout": 1, "fail": 2, "not-run": 3, "expected-fail": 4, "pass": 5, "unsupported": 6}
DEFAULT_TIMING_THRESHOLD = 0.10


_UMASK = os.umask(0)
os.umask(_UMASK)


class ReportError(ValueError):
    """A file that is not a report this code can read; the message names the file and the problem."""


# -- atomic files ---------------------------------------------------------------------------------------
def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a torn one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; a report is as readable as any written file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, data) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=1, sort_keys=False, default=str) + "\n")


def load(path: str | Path) -> dict:
    """Read and check a report.json (or a run directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{path}: no such report") from None
    except ValueError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ReportError(f"{path}: not a jfa-conformance report (field 'schema' is not {SCHEMA!r})")
    if data.get("schema_version", 0) > SCHEMA_VERSION:
        raise ReportError(
            f"{path}: schema_version {data['schema_version']} is newer than this tool reads ({SCHEMA_VERSION})"
        )
    for key in ("run", "records"):
        if key not in data:
            raise ReportError(f"{path}: field {key!r} is missing")
    return data


# -- records and timings --------------------------------------------------------------------------------
def read_record_stream(path: str | Path) -> tuple[list[dict], list[dict], bool]:
    """``(collected checks, records, finished)`` from the recorder's JSON lines; a torn last line (the
    writer was killed mid-line) is ignored."""
    collected, records, finished = [], [], False
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return collected, records, finished
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        kind = entry.pop("kind", None)
        if kind == "collected" and not collected:
            collected = entry["checks"]
        elif kind == "record":
            records.append(entry)
        elif kind == "finished":
            finished = True
    return collected, records, finished


def complete_records(collected: list[dict], records: list[dict], reason: str, *, stopped: bool = False) -> list[dict]:
    """Every collected check gets a record: the ones that never reported are ``not-run`` with ``reason``.
    ``stopped``: the caller stopped the run and knows why, so ``reason`` also replaces the generic one the
    plugin gives the checks it saw go unrun."""
    if stopped:
        records = [{**r, "reason": reason} if r["outcome"] == "not-run" else r for r in records]
    seen = {r["id"] for r in records}
    missing = [
        {"id": c["id"], "backend": c["backend"], "test": c.get("test"), "feature": c["feature"],
         "dtype": c.get("dtype"), "outcome": "not-run", "reason": reason, "message": None, "verdicts": [],
         "problem": None, "counterexample": None}
        for c in collected if c["id"] not in seen
    ]
    return records + missing


def coverage_columns(report: dict) -> list[str]:
    """The backends of the coverage table in the report's backend order (the records' order is the order
    the checks finished in)."""
    coverage = report.get("coverage") or {}
    listed = [b for b in report.get("backends") or {} if b in coverage]
    return listed + [b for b in coverage if b not in listed]


def verdicts_complete(collected: list[dict], records: list[dict], finished: bool) -> bool:
    """Whether every check of the run has a verdict (``records`` as ``complete_records`` left them). A stop
    that comes after the last verdict, while pytest closes its session, takes nothing away: such a run is
    complete; the stop is still reported (``run.stopped``)."""
    return (finished or bool(collected)) and all(r["outcome"] != "not-run" for r in records)


HOST_BOUND_SHARE = 0.9  # host time per call at least this share of the time per call: host-bound


def home_relative(text: str) -> str:
    """``text`` with the user's home directory written ``~``: a report is shared, its machine's paths are not."""
    home = os.path.expanduser("~").rstrip(os.sep)
    return text.replace(home + os.sep, "~" + os.sep) if home else text


def timing_method(timing: dict) -> str:
    """How a timing row was taken: "back to back" (several calls per round, one wait) or "one call" (a call
    and a wait per round: every CPU timing, a GPU call slower than a round, and reports made before rounds
    held several calls)."""
    return "back to back" if (timing.get("calls_per_round") or 1) > 1 else "one call"


def timings_from_benchmark(bench: dict) -> list[dict]:
    """One timing row per pytest-benchmark entry: seconds per call (a round's statistics over its
    ``calls_per_round`` calls back to back, benchmarks.py), TFLOP/s on useful FLOPs, one call's latency, the
    host's time per call and whether the host bounds the time (``host_bound``)."""
    rows = []
    for entry in bench.get("benchmarks", []):
        info, stats = entry.get("extra_info", {}), entry.get("stats", {})
        calls = info.get("calls_per_round") or 1
        median = stats.get("median")
        if not info.get("backend") or not median:
            continue
        median /= calls
        per_call = {f"{k}_s": stats[k] / calls if stats.get(k) is not None else None for k in ("min", "q1", "q3")}
        host = info.get("host_s")
        rows.append({
            "backend": info["backend"], "shape": info["shape"], "direction": info["direction"],
            "median_s": median, **per_call, "rounds": stats.get("rounds"), "calls_per_round": calls,
            "latency_s": info.get("latency_s"), "host_s": host,
            "host_bound": host is not None and host >= HOST_BOUND_SHARE * median,
            "first_call_s": info.get("first_call_s"),
            "useful_flops": info["useful_flops"], "tflops": info["useful_flops"] / median / 1e12,
            "padding_waste": info["padding_waste"], "length_skew": info["length_skew"], "problem": info["problem"],
        })
    return rows


def check_phase(records: list[dict], started_at: float, wall_s: float, workers: int) -> dict:
    """Where the check phase's wall time went: ``busy_s`` (the checks' own seconds, summed), the share of
    ``workers`` x ``wall_s`` that is, the seconds before the first check started (worker start-up and
    collection) and after the last one ended, and the worker processes used (more than ``workers`` when
    some were replaced after a device fault or a hang)."""
    ran = [r for r in records if r.get("started_at") is not None and r.get("duration_s") is not None]
    busy = sum(r["duration_s"] for r in ran)
    phase = {"started_at": round(started_at, 3), "wall_s": round(wall_s, 1), "workers": workers, "busy_s": round(busy, 1),
             "busy_share": round(busy / (workers * wall_s), 3) if workers and wall_s > 0 else None,
             "worker_processes": len({r.get("worker") for r in ran})}
    if ran:
        phase["before_first_check_s"] = round(min(r["started_at"] for r in ran) - started_at, 1)
        phase["after_last_check_s"] = round(started_at + wall_s - max(r["started_at"] + r["duration_s"] for r in ran), 1)
    return phase


def check_phase_text(phase: dict | None) -> str | None:
    """One line on the check phase (:func:`check_phase`), or None when there is nothing to say."""
    if not phase or phase.get("busy_share") is None:
        return None
    return (f"checks: {phase['wall_s']:.0f} s wall on {phase['workers']} workers, {phase['busy_share']:.0%} of it busy "
            f"({phase['busy_s']:.0f} s of checks); the first check started after {phase.get('before_first_check_s', 0):.0f} s, "
            f"the last ended {phase.get('after_last_check_s', 0):.0f} s before the end; "
            f"{phase['worker_processes']} worker processes")


def timing_phase_text(phase: dict | None) -> str | None:
    """One line on the timing phase (``pytest_session.timing_phase``), or None when there was none."""
    if not phase or not phase.get("wall_s"):
        return None
    slowest = "; ".join(f"{t['backend']} {t['shape']} {t['direction']} {t['seconds']:.1f} s"
                        for t in phase.get("slowest", []))
    text = (f"timings: {phase['wall_s']:.0f} s wall, {phase['timings_s']:.0f} s of it in {phase['timings']} timings "
            f"(set-up, first call, rounds) and {phase['outside_timings_s']:.0f} s outside them (pytest's own work, and "
            f"the start-up not done beside the checks)" + (f"; slowest: {slowest}" if slowest else ""))
    beside = phase.get("beside_checks")
    if beside:
        firsts = ", ".join(f"{name} {s:.1f} s" for name, s in sorted(beside.get("prelude_s", {}).items(),
                                                                      key=lambda kv: -kv[1]) if s >= 0.1)
        text += (f"; started beside the checks, its start-up and first calls took {beside['ready_s']:.0f} s"
                 + (f" ({firsts})" if firsts else "") + f", then it waited {beside['waited_s']:.0f} s for them to end")
    return text


def timing_key(row: dict) -> tuple:
    return row["backend"], row["shape"], row["direction"]


# -- summaries ------------------------------------------------------------------------------------------
def outcome_counts(records) -> dict[str, Counter]:
    counts: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        counts[r["backend"]][r["outcome"]] += 1
    return counts


VERDICTS = ("failing", "incomplete", "supports nothing", "conformant")


def backend_verdict(counts: Counter) -> str:
    """``failing`` (any failure, crash or timeout), ``incomplete`` (no failure, but checks that never ran:
    they say nothing about the backend), ``supports nothing`` (every check was unsupported) or
    ``conformant``."""
    if any(counts[o] for o in ("fail", "crash", "timeout")):
        return "failing"
    if counts["not-run"]:
        return "incomplete"
    if counts["unsupported"] == sum(counts.values()):
        return "supports nothing"
    return "conformant"


def summarize_backends(report: dict) -> dict[str, dict]:
    counts = outcome_counts(report["records"])
    names = list(report.get("backends", {})) + sorted(set(counts) - set(report.get("backends", {})))
    summary = {}
    for name in names:
        c = counts.get(name, Counter())
        budgets = [r["budget_used"] for r in report["records"]
                   if r["backend"] == name and r.get("budget_used") is not None]
        summary[name] = {
            "counts": {o: c[o] for o in OUTCOMES}, "checks": sum(c.values()),
            "verdict": backend_verdict(c) if c else "supports nothing",
            "worst_budget": max(budgets, default=None),
        }
    return summary


def failures(report: dict, *, unrun: bool = True) -> list[dict]:
    """Failing records, by backend (report order), feature (matrix order) and dtype; ``unrun=False``
    leaves out the ``not-run`` ones (which reports list apart: see :func:`unrun_checks`)."""
    order = {name: i for i, name in enumerate(report.get("backends", {}))}
    bad = [r for r in report["records"] if r["outcome"] in FAILING and (unrun or r["outcome"] != "not-run")]
    return sorted(bad, key=lambda r: (order.get(r["backend"], len(order)), r["backend"],
                                      _feature_sort_key(r["feature"]), r.get("dtype") or ""))


def unrun_checks(report: dict) -> tuple[dict[str, list[str]], list[str]]:
    """The checks without a verdict (``not-run``) as labels per backend, and the distinct reasons given.
    Reports list them apart from the failures: they say nothing about a backend."""
    by_backend: dict[str, list[str]] = {}
    reasons: dict[str, None] = {}
    for r in failures(report):
        if r["outcome"] == "not-run":
            by_backend.setdefault(r["backend"], []).append(r["feature"] + (f" [{r['dtype']}]" if r.get("dtype") else ""))
            reasons[r.get("reason") or "never ran"] = None
    return by_backend, list(reasons)


def problem_label(record: dict) -> str:
    """How to introduce a failure's problem: hypothesis's shrunk example, the call a dead process was
    running, or the (fixed) problem of the check."""
    return {"shrunk": "minimal counterexample", "running": "problem it was running"}.get(
        record.get("problem_source"), "failing problem")


def exit_code(report: dict, regressions: list[dict] | None = None) -> int:
    """0 when every check passed or was unsupported / an expected failure; 1 on any failure, crash,
    timeout, check that never ran, backend that supports nothing, or baseline regression."""
    if not report["run"].get("complete", True) or failures(report) or regressions:
        return 1
    if any(b["verdict"] != "conformant" for b in summarize_backends(report).values()):
        return 1
    return 1 if not report["records"] else 0


FEATURE_ORDER = ("forward", "lse", "gradients")


def _feature_sort_key(feature: str) -> tuple:
    """Oracle checks first, then the other properties, then the named edge cases."""
    if feature in FEATURE_ORDER:
        return 0, FEATURE_ORDER.index(feature), feature
    return (2 if feature.startswith("edge_case:") else 1), 0, feature


def matrix(records, order=()) -> tuple[list[str], list[str], dict[tuple[str, str], list[dict]]]:
    """backends (first-seen order), features (oracle checks, properties, edge cases) and the records of
    each (backend, feature) cell."""
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    backends, features = [b for b in order if any(r["backend"] == b for r in records)], []
    for r in records:
        if r["backend"] not in backends:
            backends.append(r["backend"])
        if r["feature"] not in features:
            features.append(r["feature"])
        cells[r["backend"], r["feature"]].append(r)
    return backends, sorted(features, key=_feature_sort_key), cells


def cell_outcome(records) -> str:
    return min((r["outcome"] for r in records), key=lambda o: SEVERITY.get(o, 0))


def cell_label(records, labels: dict[str, str]) -> str:
    """A matrix cell's text: the worst outcome, with how many of the cell's checks (dtypes) have it when
    that is not all of them (``FAIL 1/3``; ``pass 2/3`` when the rest is unsupported)."""
    outcome = cell_outcome(records)
    count = sum(r["outcome"] == outcome for r in records)
    return labels[outcome] + (f" {count}/{len(records)}" if count < len(records) or
                              (len(records) > 1 and outcome in FAILING) else "")


# -- baseline gating and compare ------------------------------------------------------------------------
def _spreads_apart(before: dict, after: dict) -> bool | None:
    """Whether ``after``'s rounds are slower than ``before``'s beyond both runs' spread (its first quartile
    above the other's third); None when either row has no quartiles (reports from before they were kept)."""
    if before.get("q3_s") is None or after.get("q1_s") is None:
        return None
    return after["q1_s"] > before["q3_s"]


def compare(old: dict, new: dict, threshold: float = DEFAULT_TIMING_THRESHOLD) -> dict:
    """Differences from ``old`` to ``new``: checks that newly fail or were fixed, error-budget changes,
    and timing changes.  A timing is a regression when its median grew by more than ``threshold`` (e.g.
    0.10 = 10%) and its rounds lie apart from the baseline's (interquartile ranges not overlapping), so
    that one noisy run does not fail a gate; a slowdown past the threshold inside the spread is kept as a
    change with ``within_spread`` set."""
    old_by_id = {r["id"]: r for r in old["records"]}
    new_by_id = {r["id"]: r for r in new["records"]}
    new_failures, fixed, budget_changes = [], [], []
    for cid, r in new_by_id.items():
        before = old_by_id.get(cid)
        if r["outcome"] in FAILING and (before is None or before["outcome"] not in FAILING):
            new_failures.append({"id": cid, "backend": r["backend"], "feature": r["feature"], "dtype": r.get("dtype"),
                                 "before": before["outcome"] if before else "absent", "after": r["outcome"],
                                 "reason": r.get("reason")})
        if before is not None and before["outcome"] in FAILING and r["outcome"] not in FAILING:
            fixed.append({"id": cid, "backend": r["backend"], "feature": r["feature"], "dtype": r.get("dtype"),
                          "before": before["outcome"], "after": r["outcome"]})
        b0, b1 = (before or {}).get("budget_used"), r.get("budget_used")
        if b0 is not None and b1 is not None and abs(b1 - b0) >= 0.05:
            budget_changes.append({"id": cid, "backend": r["backend"], "feature": r["feature"],
                                   "dtype": r.get("dtype"), "before": b0, "after": b1})
    old_timings = {timing_key(t): t for t in old.get("timings", [])}
    timing_changes, regressions = [], []
    for t in new.get("timings", []):
        before = old_timings.get(timing_key(t))
        if before is None:
            continue
        change = t["median_s"] / before["median_s"] - 1.0
        apart = _spreads_apart(before, t)
        # a time per call over calls back to back and one of a lone call differ by the host's share: not a
        # change of the backend's speed, so not gated
        method_changed = timing_method(before) != timing_method(t)
        row = {"backend": t["backend"], "shape": t["shape"], "direction": t["direction"],
               "before_s": before["median_s"], "after_s": t["median_s"], "change": change,
               "regression": change > threshold and apart is not False and not method_changed,
               "within_spread": change > threshold and apart is False and not method_changed,
               "method_changed": method_changed}
        timing_changes.append(row)
        if row["regression"]:
            regressions.append(row)
    # a timing the baseline made that this run lists as failed or not made (out of memory, say): lost
    lost = [{"backend": g["backend"], "shape": g["shape"], "direction": g["direction"],
             "before_s": old_timings[key]["median_s"], "outcome": g["outcome"], "message": g.get("message", "")}
            for g in new.get("timing_gaps", []) if (key := (g["backend"], g["shape"], g["direction"])) in old_timings]
    gone = sorted(set(old_by_id) - set(new_by_id))
    return {"new_failures": new_failures, "fixed": fixed,
            "budget_changes": sorted(budget_changes, key=lambda c: -abs(c["after"] - c["before"])),
            "timing_changes": timing_changes, "timing_regressions": regressions, "timings_lost": lost,
            "threshold": threshold,
            "only_in_old": gone, "only_in_new": sorted(set(new_by_id) - set(old_by_id))}


def regressions_of(comparison: dict) -> list[dict]:
    """What ``--baseline`` gates on: new failures, timing regressions and timings the baseline made that this run
    lost (failed, or not made: out of memory), as readable rows."""
    rows = [{"kind": "new failure", "what": f"{f['backend']} {f['feature']}" + (f" [{f['dtype']}]" if f["dtype"] else ""),
             "detail": f"{f['before']} -> {f['after']}" + (f": {f['reason']}" if f.get("reason") else "")}
            for f in comparison["new_failures"]]
    rows += [{"kind": "timing regression", "what": f"{t['backend']} {t['shape']} {t['direction']}",
              "detail": f"median {t['before_s'] * 1e3:.3f} ms -> {t['after_s'] * 1e3:.3f} ms "
                        f"(+{t['change']:.0%}, threshold {comparison['threshold']:.0%})"}
             for t in comparison["timing_regressions"]]
    rows += [{"kind": "timing lost", "what": f"{t['backend']} {t['shape']} {t['direction']}",
              "detail": f"median {t['before_s'] * 1e3:.3f} ms -> {t['outcome']}: {t['message']}"}
             for t in comparison.get("timings_lost", [])]
    return rows


# -- merge ----------------------------------------------------------------------------------------------
def _merge_rank(record: dict) -> tuple[int, int]:
    return record["outcome"] == "not-run", SEVERITY.get(record["outcome"], 0)


def merge(reports: list[dict], name: str = "merged") -> dict:
    """One report from shards (runs of parts of the matrix on other GPUs or machines). A check present in
    several shards keeps its worst outcome among the shards that ran it (``not-run`` says nothing about
    the backend, so a shard that ran the check outranks it); every shard's run metadata is kept under
    ``run.shards``."""
    if not reports:
        raise ReportError("merge needs at least one report")
    by_id: dict[str, dict] = {}
    for shard_index, rep in enumerate(reports):
        for r in rep["records"]:
            r = {**r, "shard": shard_index}
            kept = by_id.get(r["id"])
            if kept is None or _merge_rank(r) < _merge_rank(kept):
                by_id[r["id"]] = r
    backends: dict[str, dict] = {}
    for rep in reports:
        for bname, info in rep.get("backends", {}).items():
            backends.setdefault(bname, info)
    timings: dict[tuple, dict] = {}
    for shard_index, rep in enumerate(reports):
        for t in rep.get("timings", []):
            timings.setdefault(timing_key(t), {**t, "shard": shard_index})
    first = reports[0]["run"]
    profiles = sorted({rep["run"].get("profile") for rep in reports} - {None})
    seeds = {str(rep["run"].get("seed")) for rep in reports}
    run = {
        "name": name, "profile": profiles[0] if len(profiles) == 1 else ",".join(profiles),
        # the shards' seed where they agree; else each shard's stays under "shards"
        "seed": reports[0]["run"].get("seed") if len(seeds) == 1 else "mixed",
        "started": min((rep["run"].get("started") or "") for rep in reports) or None,
        "finished": max((rep["run"].get("finished") or "") for rep in reports) or None,
        "duration_s": sum(rep["run"].get("duration_s") or 0 for rep in reports),
        # complete: every check ran in some shard (a shard cut short can be completed by a rerun)
        "complete": all(r["outcome"] != "not-run" for r in by_id.values()),
        "environment": first.get("environment", {}),
        "shards": [{"name": rep["run"].get("name"), "environment": rep["run"].get("environment", {}),
                    "profile": rep["run"].get("profile"), "seed": rep["run"].get("seed"),
                    "complete": rep["run"].get("complete", True), "checks": len(rep["records"])}
                   for rep in reports],
    }
    # a timing one shard could not make is a gap only if no other shard made it
    gaps: dict[tuple, dict] = {}
    for rep in reports:
        for g in rep.get("timing_gaps", []):
            key = (g["backend"], g["shape"], g["direction"])
            if key not in timings:
                gaps.setdefault(key, g)
    merged = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "run": run, "backends": backends,
              "records": list(by_id.values()), "timings": list(timings.values()), "timing_gaps": list(gaps.values())}
    merged["summary"] = summarize_backends(merged)
    return merged
