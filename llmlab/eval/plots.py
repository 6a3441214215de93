"""PNG figures for eval, attention analysis and sweep reports.

Matplotlib's object API with the Agg canvas: no pyplot state, no display needed, safe in
worker processes and on headless machines.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font-cache notice is not ours to print


def _save(fig: Figure, path: Path) -> Path:
    import io

    from llmlab.files import atomic_write_bytes

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()  # written whole under a fresh name and renamed: a link at ``path`` is replaced
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())
    return path


def per_position_plot(per_position: dict, path: Path, title: str) -> Path:
    """Loss against position in the context window."""
    pos = np.asarray(per_position["position"])
    loss = np.asarray([np.nan if v is None else v for v in per_position["loss"]], dtype=float)
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    ax.plot(pos + 1, loss, lw=1.2)
    ax.set_xlabel("tokens of context (position + 1)")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if len(pos) > 16:
        ax.set_xscale("log")
    return _save(fig, path)


def curves_plot(curves: dict[str, dict], path: Path, xlabel: str, ylabel: str, title: str) -> Path:
    """One line per label, ``{"x", "mean", "lo", "hi"}``; the band from lo to hi is shaded."""
    fig = Figure(figsize=(7.5, 4.5))
    ax = fig.add_subplot()
    colors = [f"C{i % 10}" for i in range(len(curves))]
    for (label, c), color in zip(curves.items(), colors):
        ax.plot(c["x"], c["mean"], color=color, lw=1.5, label=label)
        if c.get("lo") is not None:
            ax.fill_between(c["x"], c["lo"], c["hi"], color=color, alpha=0.2, lw=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def histograms_plot(samples: dict[str, np.ndarray], path: Path, xlabel: str, title: str,
                    bins: np.ndarray | None = None) -> Path:
    """Overlaid density histograms, one per label (train vs val, say)."""
    bins = np.linspace(0, 1, 41) if bins is None else bins
    fig = Figure(figsize=(6.5, 4))
    ax = fig.add_subplot()
    for i, (label, values) in enumerate(samples.items()):
        ax.hist(values, bins=bins, density=True, alpha=0.5, color=f"C{i}", label=f"{label} (mean {np.mean(values):.3f})")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("density")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)


def grid_histograms_plot(grid: list[list[dict[str, np.ndarray]]], path: Path, xlabel: str, title: str,
                         bins: np.ndarray | None = None) -> Path:
    """A layer x head grid; each cell overlays its labels' histograms."""
    bins = np.linspace(0, 1, 21) if bins is None else bins
    rows, cols = len(grid), max(len(r) for r in grid)
    fig = Figure(figsize=(1.9 * cols + 0.6, 1.5 * rows + 0.6))
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True)
    for i, row in enumerate(grid):
        for j in range(cols):
            ax = axes[i][j]
            if j >= len(row):
                ax.axis("off")
                continue
            for k, (label, values) in enumerate(row[j].items()):
                ax.hist(values, bins=bins, density=True, alpha=0.5, color=f"C{k}", label=label)
            ax.set_yticks([])
            ax.tick_params(labelsize=6)
            if i == 0:
                ax.set_title(f"head {j}", fontsize=8)
            if j == 0:
                ax.set_ylabel(f"layer {i}", fontsize=8)
    axes[0][0].legend(fontsize=6)
    fig.supxlabel(xlabel, fontsize=9)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def heatmaps_plot(weights: np.ndarray, labels: Sequence[str], path: Path, title: str) -> Path:
    """weights: (H, T, T) attention of one layer on one example; query rows, key columns."""
    H, T = weights.shape[0], weights.shape[1]
    cols = min(H, 4)
    rows = (H + cols - 1) // cols
    size = max(3.0, min(7.0, 0.16 * T))
    fig = Figure(figsize=(size * cols, size * rows + 0.5))
    axes = fig.subplots(rows, cols, squeeze=False)
    ticks = np.arange(T)
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= H:
            ax.axis("off")
            continue
        ax.imshow(weights[h], cmap="viridis", vmin=0, vmax=max(float(weights[h].max()), 1e-9), aspect="equal")
        ax.set_title(f"head {h}", fontsize=9)
        if T <= 64:
            ax.set_xticks(ticks, labels, rotation=90, fontsize=5)
            ax.set_yticks(ticks, labels, fontsize=5)
        ax.set_xlabel("key", fontsize=7)
        ax.set_ylabel("query", fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def scaling_plot(series: dict[str, dict], path: Path) -> Path:
    """Loss against training FLOPs, one colour per variant: measured runs as points, the fitted
    compute-optimal loss L*(C) as a line, its bootstrap band shaded, and the frontier (the best
    loss per budget's power law, no floor) dashed."""
    fig = Figure(figsize=(7.5, 4.5))
    ax = fig.add_subplot()
    for i, (label, s) in enumerate(series.items()):
        color = f"C{i % 10}"
        ax.scatter(*s["points"], color=color, s=14, alpha=0.7, label=f"{label}: runs")
        if "fit" in s:
            ax.plot(s["x"], s["fit"], color=color, lw=1.5, label=f"{label}: fitted L*(C)")
            if "lo" in s:
                ax.fill_between(s["x"], s["lo"], s["hi"], color=color, alpha=0.18, lw=0)
        if "frontier" in s:
            ax.plot(s["x"], s["frontier"], color=color, lw=1.2, ls="--", label=f"{label}: frontier, no floor")
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs (model card)")
    ax.set_ylabel("final validation loss")
    ax.set_title("loss vs compute: runs, compute-optimal fit with its 95% bootstrap band, frontier (dashed)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    # below the axes: variant labels are whole override lists, and would cover the runs
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.14), frameon=False)
    return _save(fig, path)
