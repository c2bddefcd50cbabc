"""matplotlib figures of a report, returned as PNG bytes (embedded in index.html, so no files to lose)."""
from __future__ import annotations

import io
import math
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # no display on CI runners
import matplotlib.pyplot as plt  # noqa: E402

BUDGET_CLIP = 2.0  # budgets beyond twice the allowance (NaN, inf) are drawn at the clip, labelled


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _dtype(record) -> str | None:
    return record.get("dtype") or (record.get("problem") or {}).get("dtype")


def budget_by_backend_and_dtype(records) -> bytes | None:
    """Grouped bars: the largest error budget used per backend and dtype (1.0 = edge of the tolerance)."""
    worst: dict[tuple[str, str], float] = defaultdict(float)
    for r in records:
        if r.get("budget_used") is not None and _dtype(r):
            key = (r["backend"], _dtype(r))
            worst[key] = max(worst[key], r["budget_used"])
    if not worst:
        return None
    backends = sorted({b for b, _ in worst})
    dtypes = [d for d in ("float32", "float16", "bfloat16") if any(k[1] == d for k in worst)]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(backends) + 2), 3.6))
    width = 0.8 / len(dtypes)
    for i, dtype in enumerate(dtypes):
        xs, heights, labels = [], [], []
        for j, backend in enumerate(backends):
            if (backend, dtype) not in worst:
                continue
            value = worst[backend, dtype]
            xs.append(j + (i - (len(dtypes) - 1) / 2) * width)
            heights.append(min(value, BUDGET_CLIP) if math.isfinite(value) else BUDGET_CLIP)
            labels.append(f"{value:.0%}" if math.isfinite(value) else "inf")
        bars = ax.bar(xs, heights, width, label=dtype)
        ax.bar_label(bars, labels=labels, fontsize=7, padding=1)
    ax.axhline(1.0, color="#b00020", linestyle="--", linewidth=1)
    ax.text(len(backends) - 0.5, 1.02, "tolerance", color="#b00020", ha="right", va="bottom", fontsize=8)
    ax.set_xticks(range(len(backends)), backends)
    top = max(min(value, BUDGET_CLIP) if math.isfinite(value) else BUDGET_CLIP for value in worst.values())
    ax.set_ylim(0, max(1.2, top) * 1.12)
    ax.set_ylabel("largest error budget used\n(observed / allowed)")
    ax.set_title("Error budget by backend and dtype (worst check)")
    ax.legend(title="dtype", fontsize=8, loc="upper left")
    return _png(fig)


def tflops_vs_skew(timings) -> bytes | None:
    """TFLOP/s on useful FLOPs against length skew (longest / mean sequence), one line per backend; each
    shape is labelled at its skew."""
    if not timings:
        return None
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.0), layout="constrained")
    for ax, direction in zip(axes, ("forward", "backward")):
        rows = [t for t in timings if t["direction"] == direction]
        for backend in sorted({t["backend"] for t in rows}):
            points = sorted((t["length_skew"], t["tflops"]) for t in rows if t["backend"] == backend)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", linewidth=1, label=backend)
        for shape in sorted({t["shape"] for t in rows}):
            at = [t for t in rows if t["shape"] == shape]
            ax.annotate(shape, (at[0]["length_skew"], max(t["tflops"] for t in at)), textcoords="offset points",
                        xytext=(0, 6), ha="center", fontsize=7, color="#555")
        ax.set_xscale("log")
        skews = [t["length_skew"] for t in rows] or [1.0]
        ax.set_xticks([x for x in (1, 2, 3, 5, 10, 20, 50, 100, 200, 500) if min(skews) / 1.5 <= x <= max(skews) * 1.5])
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("length skew: longest / mean key length (log scale)")
        ax.set_ylabel("TFLOP/s on useful FLOPs")
        ax.set_title(f"{direction.capitalize()}: throughput vs length skew")
        ax.grid(True, alpha=0.3)
        ax.margins(x=0.08, y=0.15)
        ax.set_ylim(bottom=0)
        if rows:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no timings", transform=ax.transAxes, ha="center")
    return _png(fig)
