"""matplotlib figures of a report, returned as SVG text (inlined in index.html, so no files to lose; vector
text stays sharp when zoomed and searchable, and the page holds no encoded binary)."""
from __future__ import annotations

import io
import math
import re
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # no display on CI runners
import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

BUDGET_CLIP = 2.0  # budgets beyond twice the allowance (NaN, inf) are drawn at the clip, labelled


def _svg(fig) -> str:
    """The figure as an ``<svg>`` element, without the XML prolog, and the same bytes for the same figure
    (no date, fixed ids)."""
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "jfa-conformance", "svg.fonttype": "none"}):
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buffer.getvalue()
    svg = text[text.index("<svg"):].strip()
    # scale with the page down from its natural size (the viewBox keeps the aspect ratio)
    return re.sub(r'<svg([^>]*?) width="([\d.]+)pt" height="[\d.]+pt"',
                  r'<svg\1 style="width:100%;max-width:\2pt;height:auto"', svg, count=1)


def _dtype(record) -> str | None:
    return record.get("dtype") or (record.get("problem") or {}).get("dtype")


def budget_by_backend_and_dtype(records, order=()) -> str | None:
    """Grouped bars: the largest error budget used per backend and dtype (1.0 = edge of the tolerance).
    Crashes and timeouts are left out: their verdicts are of examples that ran before the process died."""
    worst: dict[tuple[str, str], float] = defaultdict(float)
    for r in records:
        if r.get("budget_used") is not None and _dtype(r) and r.get("outcome") not in ("crash", "timeout"):
            key = (r["backend"], _dtype(r))
            worst[key] = max(worst[key], r["budget_used"])
    if not worst:
        return None
    present = {b for b, _ in worst}
    backends = [b for b in order if b in present] + sorted(present - set(order))
    dtypes = [d for d in ("float32", "float16", "bfloat16") if any(k[1] == d for k in worst)]
    fig, ax = plt.subplots(figsize=(min(14.0, max(6.0, 0.75 * len(backends) + 2)), 3.8), layout="constrained")
    width = 0.8 / len(dtypes)
    for i, dtype in enumerate(dtypes):
        xs, heights, labels = [], [], []
        for j, backend in enumerate(backends):
            if (backend, dtype) not in worst:
                continue
            value = worst[backend, dtype]
            xs.append(j + (i - (len(dtypes) - 1) / 2) * width)
            heights.append(min(value, BUDGET_CLIP) if math.isfinite(value) else BUDGET_CLIP)
            # only bars past the tolerance are labelled: with many backends the labels would overlap
            labels.append((f"{value:.0%}" if math.isfinite(value) else "inf") if value >= 1 else "")
        bars = ax.bar(xs, heights, width, label=dtype)
        ax.bar_label(bars, labels=labels, fontsize=7, padding=1, rotation=90)
    ax.axhline(1.0, color="#b00020", linestyle="--", linewidth=1)
    ax.text(len(backends) - 0.5, 1.02, "tolerance", color="#b00020", ha="right", va="bottom", fontsize=8)
    ax.set_xticks(range(len(backends)), backends, rotation=35, ha="right", fontsize=8)
    top = max(min(value, BUDGET_CLIP) if math.isfinite(value) else BUDGET_CLIP for value in worst.values())
    ax.set_ylim(0, max(1.2, top) * 1.25)
    ax.set_ylabel("largest error budget used\n(observed / allowed)")
    ax.set_title("Error budget by backend and dtype (worst check; bars past the tolerance are labelled)", fontsize=10)
    ax.legend(title="dtype", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _svg(fig)


def throughput_by_shape(table, backends: list[str], baseline: str | None) -> str | None:
    """Grouped bars per shape, one panel per direction: TFLOP/s on useful FLOPs of every backend, the
    baseline's bar outlined. ``table``: :func:`conformance.reporting.perf.rows`."""
    if not table:
        return None
    directions = [d for d in ("forward", "backward") if any(r.direction == d for r in table)]
    fig, axes = plt.subplots(len(directions), 1, figsize=(min(15.0, 4 + 0.25 * len(backends) * len(table) / max(1, len(directions))),
                                                          3.2 * len(directions)), layout="constrained", squeeze=False)
    colours = plt.get_cmap("tab20").colors
    for ax, direction in zip(axes[:, 0], directions):
        shown = [r for r in table if r.direction == direction]
        width = 0.84 / max(1, len(backends))
        for j, name in enumerate(backends):
            xs, ys = [], []
            for i, row in enumerate(shown):
                cell = row.cells.get(name)
                if cell is not None:
                    xs.append(i + (j - (len(backends) - 1) / 2) * width)
                    ys.append(cell.row["tflops"])
            if xs:
                ax.bar(xs, ys, width, label=name, color=colours[j % len(colours)],
                       edgecolor="#111" if name == baseline else "none", linewidth=1.2 if name == baseline else 0)
        rates = [c.row["tflops"] for r in shown for c in r.cells.values() if (c.row.get("tflops") or 0) > 0]
        if rates and max(rates) > 100 * min(rates):  # (an interpreter next to a kernel: linear bars hide it)
            ax.set_yscale("log")
        ax.set_xticks(range(len(shown)), [f"{r.shape}\nskew {r.length_skew:.1f}" if r.length_skew else r.shape
                                          for r in shown], fontsize=8)
        ax.set_ylabel("TFLOP/s (useful FLOPs" + (", log scale)" if ax.get_yscale() == "log" else ")"), fontsize=9)
        ax.set_title(f"{direction.capitalize()}" + (f" (outlined: {baseline}, the speedup baseline)" if baseline else ""),
                     fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    axes[0, 0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _svg(fig)


def check_timeline(records, phase: dict | None, ready: dict | None = None) -> str | None:
    """Each worker process's checks over the check phase, coloured by backend (``phase``: the run's
    ``checks``, which holds the phase's start); dashed lines where a backend's warm-up ended (``ready``:
    seconds from the same start, the warm-up having started with the checks). Gaps are start-up, waiting at a
    gate, or idle."""
    if not phase or phase.get("started_at") is None:
        return None
    spans = [(r.get("worker") or "?", r["backend"], r["started_at"] - phase["started_at"], r["duration_s"])
             for r in records if r.get("started_at") is not None and r.get("duration_s") is not None]
    if not spans:
        return None

    def worker_key(name):
        digits = "".join(ch for ch in name if ch.isdigit())
        return (int(digits) if digits else -1, name)

    workers = sorted({w for w, *_ in spans}, key=worker_key)
    backends = list(dict.fromkeys(b for _, b, *_ in sorted(spans, key=lambda s: s[2])))
    colours = plt.get_cmap("tab20")
    colour = {b: colours(i % 20) for i, b in enumerate(backends)}
    fig, ax = plt.subplots(figsize=(12.0, 1.4 + 0.28 * len(workers)), layout="constrained")
    for row, worker in enumerate(workers):
        for backend in backends:
            bars = [(start, max(seconds, 0.05)) for w, b, start, seconds in spans if w == worker and b == backend]
            if bars:
                ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=colour[backend], edgecolor="none")
    for i, (backend, seconds) in enumerate(sorted((ready or {}).items(), key=lambda kv: kv[1])):
        ax.axvline(seconds, color=colour.get(backend, "#555555"), linestyle="--", linewidth=1)
        ax.text(seconds, 1.0 + 0.03 * (i % 2), backend, transform=ax.get_xaxis_transform(), ha="center",
                va="bottom", fontsize=7, color=colour.get(backend, "#555555"))
    ax.set_yticks(range(len(workers)), workers, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, max(phase.get("wall_s") or 0, max(start + seconds for _, _, start, seconds in spans)))
    ax.set_xlabel("seconds since the checks started")
    handles = [matplotlib.patches.Patch(color=colour[b], label=b) for b in backends]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title("Checks over time, per worker process (dashed: a backend's warm-up done; gaps: start-up, "
                 "waiting for a warm-up, idle)", fontsize=9, pad=22)
    return _svg(fig)
