"""The performance view of a report: shapes x backends with median time per call, TFLOP/s on useful FLOPs,
speedup against a baseline backend, share of the device's peak, rounds, spread, one call's latency, the
host's time per call (host-bound timings named) and first-call time.

Reads the report's ``timings`` rows (see reports/README.md) and, where present, each backend's ``time``
entry (compile and check seconds of the run).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..report import HOST_BOUND_SHARE

# Backends that are not vendor kernels: the oracle's implementations and the project's own kernel. The
# default baseline is the first other built-in adapter of the report (FA4 where it ran).
NOT_VENDOR = ("reference", "reference-online", "triton-jfa")
BUILTIN_PREFIX = "backends."
BENCH_NOT_ASKED = "not run (use --bench)"  # a report's run.benchmarks when the run did not ask for timings

# Nominal dense (no sparsity) tensor-core peaks in TFLOP/s for 16-bit inputs, from NVIDIA's datasheets,
# matched on the device name torch reports. A device not listed has no "share of peak" column.
PEAK_TFLOPS_16BIT = (
    ("H100 PCIe", 756.0),
    ("H200 NVL", None),
    ("H200", 989.4),
    ("H100", 989.4),
    ("A100", 312.0),
)


def peak_tflops(environment: dict | None, dtype: str | None) -> float | None:
    """The nominal dense 16-bit tensor-core peak of the report's device, or None when unknown (also for
    float32 problems, whose rate depends on TF32 settings)."""
    name = (environment or {}).get("device_name") or ""
    if dtype not in ("float16", "bfloat16") or not (environment or {}).get("device", "").startswith("cuda"):
        return None
    for key, peak in PEAK_TFLOPS_16BIT:
        if key in name:
            return peak
    return None


def timed_backends(report: dict) -> list[str]:
    """Backends with timings, in report order."""
    names = {t["backend"] for t in report.get("timings") or []}
    ordered = [b for b in report.get("backends", {}) if b in names]
    return ordered + sorted(names - set(ordered))


def timing_notes(report: dict) -> list[str]:
    """One line per backend an interpreter ran in this run (``Capabilities.interpreted_by``): its timings are
    the interpreter's, or it was left untimed; one per backend host-bound somewhere; one per backend and reason
    for the timings that failed or were not made (``timing_gaps``: out of device memory, say); and one line for
    the backends the benchmarks were to time (``run.timed_backends``) that have no timing, with the benchmarks'
    status (a time limit, a failure)."""
    timed = set(timed_backends(report))
    notes = []
    for name, entry in (report.get("backends") or {}).items():
        by = (entry.get("capabilities") or {}).get("interpreted_by")
        if by and name in timed:
            notes.append(f"{name}: run by {by} here, so its times measure the interpreter, not a kernel")
        elif by:
            notes.append(f"{name}: not timed, since {by} runs it here (name it with --backend to time it anyway)")
    bound: dict[str, list[int]] = {}
    for t in report.get("timings") or []:
        counts = bound.setdefault(t["backend"], [0, 0])
        counts[0] += bool(t.get("host_bound"))
        counts[1] += 1
    for name, (n, total) in bound.items():
        if n:
            notes.append(f"{name}: host-bound in {n} of its {total} timings (the host's time per call is at least "
                         f"{HOST_BOUND_SHARE:.0%} of the time per call): there its times are its host's, not its "
                         "kernels'")
    by_reason: dict[tuple[str, str, str], list[str]] = {}
    for gap in report.get("timing_gaps") or []:
        key = (gap["backend"], gap["outcome"], gap["message"])
        by_reason.setdefault(key, []).append(f"{gap['shape']} {gap['direction']}")
    for (name, outcome, message), where in by_reason.items():
        notes.append(f"{name}: {outcome} on {', '.join(where)}: {message}")
    run = report.get("run") or {}
    missing = [name for name in run.get("timed_backends") or [] if name not in timed]
    status = run.get("benchmarks") or "unknown"
    if missing and status == "ok":
        notes.append(f"no timing for {', '.join(missing)}: each declares every timed shape unsupported, or its "
                     "timings failed (pytest.log says which)")
    elif missing:
        notes.append(f"not timed: {', '.join(missing)} (benchmarks: {status})")
    return notes


def is_vendor(report: dict, name: str) -> bool:
    source = str((report.get("backends", {}).get(name) or {}).get("source") or "")
    return name not in NOT_VENDOR and source.startswith(BUILTIN_PREFIX)


def baseline_backend(report: dict, chosen: str | None = None) -> str | None:
    """The backend speedups are measured against: ``chosen`` (or the run's ``--baseline-backend``) when it
    has timings, else the first vendor kernel with timings, else the first backend with timings."""
    names = timed_backends(report)
    chosen = chosen or report.get("run", {}).get("baseline_backend")
    if chosen in names:
        return chosen
    return next((n for n in names if is_vendor(report, n)), names[0] if names else None)


@dataclass
class Cell:
    """One backend on one shape and direction."""

    row: dict
    speedup: float | None
    peak_share: float | None

    @property
    def median_ms(self) -> float:
        return self.row["median_s"] * 1e3

    @property
    def spread(self) -> float | None:
        """Interquartile range of the rounds relative to the median (0.04 = the middle half of the rounds
        lies within 4% of the median's size)."""
        q1, q3 = self.row.get("q1_s"), self.row.get("q3_s")
        if q1 is None or q3 is None or not self.row.get("median_s"):
            return None
        return (q3 - q1) / self.row["median_s"]


@dataclass
class Row:
    """One shape in one direction, across backends."""

    shape: str
    direction: str
    problem: dict
    length_skew: float | None
    padding_waste: float | None
    cells: dict[str, Cell]
    gaps: dict[str, dict] = field(default_factory=dict)  # backend -> its timing_gaps entry: failed or not timed


def rows(report: dict, baseline: str | None) -> list[Row]:
    """Shapes x directions (forward first), each with every timed backend's cell."""
    env = (report.get("run") or {}).get("environment")
    by_key: dict[tuple[str, str], dict[str, dict]] = {}
    for t in report.get("timings") or []:
        by_key.setdefault((t["shape"], t["direction"]), {})[t["backend"]] = t
    missing: dict[tuple[str, str], dict[str, dict]] = {}
    for g in report.get("timing_gaps") or []:
        missing.setdefault((g["shape"], g["direction"]), {})[g["backend"]] = g
    shape_order = list(dict.fromkeys([t["shape"] for t in report.get("timings") or []]
                                     + [g["shape"] for g in report.get("timing_gaps") or []]))
    out = []
    for direction in ("forward", "backward"):
        for shape in shape_order:
            timings = by_key.get((shape, direction), {})
            row_gaps = missing.get((shape, direction), {})
            if not timings:
                if row_gaps:  # no backend made it: the row still says who tried and why not
                    out.append(Row(shape, direction, {}, None, None, {}, row_gaps))
                continue
            base = timings.get(baseline) if baseline else None
            cells = {}
            for name, t in timings.items():
                speedup = base["median_s"] / t["median_s"] if base and t.get("median_s") else None
                peak = peak_tflops(env, (t.get("problem") or {}).get("dtype"))
                cells[name] = Cell(t, speedup, t["tflops"] / peak if peak and t.get("tflops") is not None else None)
            any_row = next(iter(timings.values()))
            out.append(Row(shape, direction, any_row.get("problem") or {}, any_row.get("length_skew"),
                           any_row.get("padding_waste"), cells, row_gaps))
    return out


def per_call_words(report: dict) -> str:
    """How the report's times per call were taken, in words for the performance section's heading note."""
    timings = report.get("timings") or []
    if timings and all(t.get("calls_per_round") is None for t in timings):
        return ("one call and a wait for the device per round (a report from before timings ran calls back to "
                "back: the host's time per call is in every figure)")
    return ("calls back to back (the host's work overlapping the device's, as in a model's step; on a GPU about "
            "20 ms of calls per round)")


def direction_columns(table: list[Row], backends: list[str], direction: str) -> tuple[list[str], list[str]]:
    """(the backends timed in ``direction``, in order; those of ``backends`` that were not, e.g. without a
    backward)."""
    timed = {name for row in table if row.direction == direction for name in (*row.cells, *row.gaps)}
    return [b for b in backends if b in timed], [b for b in backends if b not in timed]


def geomean_speedups(table: list[Row]) -> dict[tuple[str, str], tuple[float, int]]:
    """``(backend, direction) -> (geometric mean speedup over the shapes both ran, shapes)``."""
    logs: dict[tuple[str, str], list[float]] = {}
    for row in table:
        for name, cell in row.cells.items():
            if cell.speedup and cell.speedup > 0 and math.isfinite(cell.speedup):
                logs.setdefault((name, row.direction), []).append(math.log(cell.speedup))
    return {k: (math.exp(sum(v) / len(v)), len(v)) for k, v in logs.items()}


def backend_times(report: dict) -> dict[str, dict]:
    """Each backend's ``time`` entry (compile and check seconds, warm-up calls) where the run recorded one."""
    return {name: info["time"] for name, info in (report.get("backends") or {}).items()
            if isinstance(info, dict) and isinstance(info.get("time"), dict)}


def time_columns(times: dict[str, dict]) -> tuple[str, ...]:
    """The backend table's time columns: compile and check seconds, and the seconds spent compiling inside
    checks when some backend did (jit_watch.py)."""
    if not times:
        return ()
    compiled = any(t.get("check_jit_s") for t in times.values())
    return ("compile_s", "check_s") + (("check_jit_s",) if compiled else ())


TIME_LABELS = {"compile_s": "compile s", "check_s": "check s", "check_jit_s": "compiling in checks s"}


def jit_in_checks(report: dict, limit: int = 10) -> list[dict]:
    """The checks that compiled (what the warm-up did not prepare), most seconds first:
    ``{"id", "backend", "seconds", "builds", "what"}``, ``what`` naming the Triton kernels (``name xN``),
    torch.compile graphs (``torch.compile graphs xN``) and what backends reported building (``kind xN``)."""
    out = []
    for r in report.get("records") or ():
        jit = r.get("jit")
        if not jit or not jit.get("builds"):
            continue
        what = [f"{k} x{v.get('variants', 0)}" for k, v in ((jit.get("triton") or {}).get("kernels") or {}).items()]
        if jit.get("torch_compile"):
            what.append(f"torch.compile graphs x{jit['torch_compile'].get('graphs', 0)}")
        what += [f"{kind} x{v.get('builds', 0)}" for kind, v in (jit.get("reported") or {}).items()]
        out.append({"id": r["id"], "backend": r["backend"], "seconds": jit.get("seconds") or 0.0,
                    "builds": jit["builds"], "what": what})
    return sorted(out, key=lambda x: -x["seconds"])[:limit]


def shape_text(row: Row) -> str:
    """A shape's defining numbers: batch, heads, head dim, dtype, causal, skew."""
    p = row.problem
    bits = []
    if p.get("batch") is not None:
        bits.append(f"B={p['batch']}")
    if p.get("heads_q") is not None:
        heads = p["heads_q"] if p.get("heads_kv") in (None, p["heads_q"]) else f"{p['heads_q']}/{p['heads_kv']}"
        bits.append(f"H={heads}")
    if p.get("head_dim") is not None:
        bits.append(f"D={p['head_dim']}")
    if p.get("dtype"):
        bits.append(str(p["dtype"]).replace("bfloat16", "bf16").replace("float16", "fp16").replace("float32", "fp32"))
    if p.get("causal") not in (None, "none"):
        bits.append("causal")
    if row.length_skew is not None:
        bits.append(f"skew {row.length_skew:.1f}")
    return ", ".join(bits)


def fmt_tflops(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def fmt_speedup(value: float | None) -> str:
    """Two decimals; below 0.1, two significant digits (an interpreter's 0.0017x is not 0.00x)."""
    if value is None:
        return ""
    return f"{value:.2f}x" if value >= 0.1 or value == 0 else f"{value:.2g}x"


def fmt_spread(value: float | None) -> str:
    return "" if value is None else f"±{value / 2:.0%}"


def fmt_us(seconds) -> str:
    return "" if seconds is None else f"{seconds * 1e6:.0f}"


def fmt_ms(seconds) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.3f}"


def fmt_seconds(value) -> str:
    if value is None:
        return ""
    return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.1f} s"
