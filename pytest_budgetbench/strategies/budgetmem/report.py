"""BudgetMem in the report, as a report extension: the tier-selection table and the
quality-vs-processing-cost plot. The generic report never imports this module; the
``budgetbench.reports`` entry point (pyproject.toml) names :data:`EXTENSION`.

A BudgetMem cell records ``strategy_info["budgetmem"]``: the tier each module ran at,
its compute seconds and its auxiliary tokens. This table gives, per task x strategy x
budget x module, the share of cells that ran the module at LOW, MID and HIGH, with the
module's mean compute seconds and auxiliary tokens, so a router's choices can be read
next to the fixed-tier controls'. For each task with BudgetMem strategies the plot puts
quality against the tokens processed per cell (prompt plus auxiliary input and output),
where the modules' auxiliary calls show.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.reports.extensions import ExtraTable
from pytest_budgetbench.reports.plots import Plot, safe_name, tradeoff_plot, with_processing_tokens
from pytest_budgetbench.reports.render import Column, col, integer, num, percent
from pytest_budgetbench.strategies.budgetmem.tiers import MODULES

if TYPE_CHECKING:
    import pandas as pd

STRATEGY_PREFIX = "budgetmem"
"""Strategies named so (the controls and the routers) are BudgetMem's."""
TIERS_TABLE = "tiers"

TIER_COLUMNS: tuple[str, ...] = ("task", "strategy", "budget", "module", "n", "low", "mid",
                                 "high", "module_s_mean", "aux_tokens_mean")
TIER_VIEW: tuple[Column, ...] = (
    col("task", "task"),
    col("strategy", "strategy"),
    col("budget", "budget", integer),
    col("module", "module"),
    col("cells", "n", integer),
    col("LOW", "low", percent),
    col("MID", "mid", percent),
    col("HIGH", "high", percent),
    col("compute s mean", "module_s_mean", num(4)),
    col("aux tokens mean", "aux_tokens_mean", num(1)),
)


def _budgetmem_info(value: Any) -> dict[str, Any] | None:
    if isinstance(value, dict) and isinstance(value.get("budgetmem"), dict):
        info: dict[str, Any] = value["budgetmem"]
        return info
    return None


def tier_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Tier shares per task x strategy x budget x module (empty without BudgetMem rows)."""
    import pandas as pd

    groups: dict[tuple[str, str, int, str], list[tuple[str, float, float]]] = defaultdict(list)
    if "strategy_info" in rows:
        for task, strategy, budget, value in zip(rows["task"], rows["strategy"], rows["budget"],
                                                 rows["strategy_info"], strict=True):
            info = _budgetmem_info(value)
            if info is None:
                continue
            for module, tier in (info.get("tiers") or {}).items():
                seconds = float((info.get("module_s") or {}).get(module, 0.0))
                tokens = float((info.get("module_aux_input_tokens") or {}).get(module, 0)) + float(
                    (info.get("module_aux_output_tokens") or {}).get(module, 0))
                groups[(str(task), str(strategy), int(budget), str(module))].append(
                    (str(tier), seconds, tokens))
    records = []
    for (task, strategy, budget, module), cells in groups.items():
        n = len(cells)
        records.append({
            "task": task, "strategy": strategy, "budget": budget, "module": module, "n": n,
            "low": sum(t == "LOW" for t, _s, _k in cells) / n,
            "mid": sum(t == "MID" for t, _s, _k in cells) / n,
            "high": sum(t == "HIGH" for t, _s, _k in cells) / n,
            "module_s_mean": sum(s for _t, s, _k in cells) / n,
            "aux_tokens_mean": sum(k for _t, _s, k in cells) / n,
        })
    table = pd.DataFrame.from_records(records, columns=list(TIER_COLUMNS))
    if table.empty:
        return table
    order = {m: i for i, m in enumerate(MODULES)}  # pipeline order
    table["_order"] = table["module"].map(lambda m: order.get(m, len(order)))
    table = table.sort_values(["task", "strategy", "budget", "_order"]).drop(columns="_order")
    return table.reset_index(drop=True)


def cost_plots(summary: pd.DataFrame, out_dir: Path) -> list[Plot]:
    """Quality against processing cost, for each task that has BudgetMem strategies."""
    plots: list[Plot] = []
    if summary.empty:
        return plots
    # The same task order and file stems as the generic plots (plots.write_plots).
    for index, (task, cells) in enumerate(summary.groupby("task", sort=True)):
        if not cells["strategy"].astype(str).str.startswith(STRATEGY_PREFIX).any():
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = safe_name(str(task), index)
        plots.append(tradeoff_plot(
            with_processing_tokens(cells), str(task), "processing_tokens_mean",
            "mean tokens processed per cell (prompt + auxiliary in/out)",
            out_dir / f"{stem}_quality_cost.png", "quality_cost"))
    return plots


class BudgetMemReport:
    """The report extension: the tier table and the processing-cost plot."""

    name = "budgetmem"
    row_fields = ("strategy_info",)

    def tables(self, rows: pd.DataFrame) -> list[ExtraTable]:
        return [ExtraTable(
            TIERS_TABLE, "BudgetMem tier selection",
            "Share of cells that ran each module at each tier, with the module's mean compute "
            "seconds (heuristic and embedding tiers included) and auxiliary tokens "
            "(input + output).",
            tier_table(rows), TIER_VIEW)]

    def plots(self, summary: pd.DataFrame, out_dir: Path) -> list[Plot]:
        return cost_plots(summary, out_dir)


EXTENSION = BudgetMemReport()
