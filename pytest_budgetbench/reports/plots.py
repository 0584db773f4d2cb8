"""PNG plots of a summary table (matplotlib, Agg: no display needed)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_budgetbench.reports.stats import pareto_front

if TYPE_CHECKING:
    import pandas as pd

DPI = 110


@dataclass(frozen=True)
class Plot:
    """One written figure: what it shows (for captions) and where it is."""

    kind: str
    task: str
    title: str
    path: Path


def _pyplot() -> Any:
    import matplotlib

    # Agg before pyplot: reports run in CI and on servers with no display.
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def safe_name(text: str, index: int) -> str:
    """A file name from a task name (data, so never trusted as a path)."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "_", text).strip("_")[:40] or "task"
    return f"{index:02d}_{slug}"


def write_plots(summary: pd.DataFrame, out_dir: Path) -> list[Plot]:
    """Quality against tokens and against latency, and a violation heatmap, per task.
    (Report extensions add their own figures; see reports.extensions.)"""
    if summary.empty:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    plots: list[Plot] = []
    for index, (task, cells) in enumerate(summary.groupby("task", sort=True)):
        stem = safe_name(str(task), index)
        plots.append(tradeoff_plot(cells, str(task), "tokens_mean", "mean counted prompt tokens",
                               out_dir / f"{stem}_quality_tokens.png", "quality_tokens"))
        plots.append(tradeoff_plot(cells, str(task), "latency_s_p50", "median latency (s)",
                               out_dir / f"{stem}_quality_latency.png", "quality_latency"))
        plots.append(_heatmap(cells, str(task), out_dir / f"{stem}_violations.png"))
    return plots


def with_processing_tokens(cells: pd.DataFrame) -> pd.DataFrame:
    """``cells`` with ``processing_tokens_mean``: the prompt's tokens plus the auxiliary
    calls' input and output tokens (none counts as zero), per cell on average."""
    out = cells.copy()
    aux = [out[c].fillna(0.0) for c in ("aux_input_tokens_mean", "aux_output_tokens_mean")
           if c in out]
    out["processing_tokens_mean"] = out["tokens_mean"] + sum(aux, 0.0 * out["tokens_mean"])
    return out


def tradeoff_plot(
    cells: pd.DataFrame, task: str, x_column: str, x_label: str, path: Path, kind: str
) -> Plot:
    """Mean quality (with its interval) against ``x_column``, one series per strategy,
    budgets annotated and the Pareto frontier drawn; written to ``path``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 4.6))
    x = cells[x_column].to_numpy(dtype=np.float64)
    y = cells["quality_mean"].to_numpy(dtype=np.float64)
    for strategy, group in cells.groupby("strategy", sort=True):
        gx = group[x_column].to_numpy(dtype=np.float64)
        gy = group["quality_mean"].to_numpy(dtype=np.float64)
        yerr = np.vstack([gy - group["quality_lo"], group["quality_hi"] - gy])
        ax.errorbar(gx, gy, yerr=np.nan_to_num(yerr), fmt="o", capsize=3,
                    label=_plain(str(strategy)))
        for bx, by, budget in zip(gx, gy, group["budget"], strict=True):
            if not (np.isnan(bx) or np.isnan(by)):
                ax.annotate(str(budget), (bx, by), textcoords="offset points", xytext=(4, 4),
                            fontsize=7, color="0.35")
    front = pareto_front(x, y)
    if front.any():
        order = np.argsort(x[front])
        ax.step(x[front][order], y[front][order], where="post", color="black", lw=1.2,
                ls="--", label="Pareto frontier")
        ax.scatter(x[front], y[front], s=140, facecolors="none", edgecolors="black", lw=1.2)
    ax.set_xlabel(x_label)
    ax.set_ylabel("mean quality (95% bootstrap CI)")
    title = f"{task}: quality vs {x_label.split(' (')[0]}"
    # Titles and legends show data strings as plain text (matplotlib never interprets HTML),
    # but mathtext would treat '$' specially, so it is escaped.
    _finish_chart(plt, fig, ax, title, path)
    return Plot(kind, task, title, path)


def _heatmap(cells: pd.DataFrame, task: str, path: Path) -> Plot:
    plt = _pyplot()
    grid = cells.pivot_table(index="strategy", columns="budget", values="violation_rate",
                             aggfunc="mean", dropna=False)
    values = grid.to_numpy(dtype=np.float64)
    # Room for the longest strategy name on the left, one inch per budget column.
    label_width = 0.08 * max((len(str(s)) for s in grid.index), default=8)
    fig, ax = plt.subplots(
        figsize=(2.4 + label_width + 0.9 * grid.shape[1], 1.6 + 0.5 * grid.shape[0])
    )
    image = ax.imshow(np.ma.masked_invalid(values), cmap="Reds", vmin=0.0, vmax=1.0,
                      aspect="auto")
    ax.set_xticks(range(grid.shape[1]), [str(b) for b in grid.columns])
    ax.set_yticks(range(grid.shape[0]), [_plain(str(s)) for s in grid.index])
    for (row, col), value in np.ndenumerate(values):
        label = "–" if np.isnan(value) else f"{value:.0%}"
        ax.text(col, row, label, ha="center", va="center", fontsize=8,
                color="white" if value > 0.6 else "black")
    ax.set_xlabel("budget (tokens)")
    title = f"{task}: violation rate"
    ax.set_title(_plain(title))
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return Plot("violations", task, title, path)


def safe_budget_plots(records: Sequence[Mapping[str, Any]], out_dir: Path) -> list[Plot]:
    """Per task: each strategy's evidence retention at the budgets its search probed, the
    retention floor, and the safe budget each found, marked (a budget search's figure).
    ``records`` are safe_budgets.jsonl's (records.safe_budgets.SafeBudgetRecord)."""
    plots: list[Plot] = []
    tasks = sorted({record["task"] for record in records})
    if tasks:
        out_dir.mkdir(parents=True, exist_ok=True)
    for index, task in enumerate(tasks):
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(7.0, 4.6))
        mine = [record for record in records if record["task"] == task]
        for record in mine:
            probes = sorted(record["probes"], key=lambda probe: probe["budget"])
            x = [probe["budget"] for probe in probes]
            y = [np.nan if probe["retention"] is None else probe["retention"]
                 for probe in probes]
            safe = record["safe_budget"]
            label = f"{record['strategy']} (safe: {safe if safe is not None else 'none'})"
            # Dashed: between two probes nothing was measured.
            (line,) = ax.plot(x, y, "o--", ms=4, lw=0.8, label=_plain(label))
            if safe is not None:
                kept = next(p["retention"] for p in probes if p["budget"] == safe)
                ax.axvline(safe, color=line.get_color(), ls=":", lw=1)
                ax.scatter([safe], [np.nan if kept is None else kept], s=150, marker="*",
                           color=line.get_color(), zorder=3)
        floor = mine[0]["min_retention"]
        if floor is not None:
            ax.axhline(floor, color="black", ls="--", lw=1, label=f"floor {floor:g}")
        first = mine[0]
        ax.set_xlim(first["lo"] - first["step"], first["hi"] + first["step"])
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("budget (tokens)")
        ax.set_ylabel("mean evidence retention (admitted items)")
        title = f"{task}: retention against budget, safe budgets marked"
        path = out_dir / f"{safe_name(task, index)}_safe_budget.png"
        _finish_chart(plt, fig, ax, title, path)
        plots.append(Plot("safe_budget", task, title, path))
    return plots


def _finish_chart(plt: Any, fig: Any, ax: Any, title: str, path: Path) -> None:
    """A line chart's title, grid and legend, written to ``path`` and closed."""
    ax.set_title(_plain(title))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _plain(text: str) -> str:
    return text.replace("$", r"\$")
