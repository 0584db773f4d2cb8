"""build_report: records in, every report file out. The plugin calls it at session end and
``budgetbench report`` calls it on any set of run directories."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.redact import redact
from pytest_budgetbench.reports import load, render, report_json, tables, tiers
from pytest_budgetbench.reports.plots import Plot, write_plots
from pytest_budgetbench.reports.stats import CONFIDENCE, DEFAULT_RESAMPLES

if TYPE_CHECKING:
    import pandas as pd

SUMMARY_CSV = "summary.csv"
PAIRED_CSV = "paired.csv"
CATEGORIES_CSV = "categories.csv"
TIERS_CSV = "tiers.csv"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
PLOTS_DIR = "plots"


@dataclass(frozen=True)
class ReportSettings:
    reference: str | None = None
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0
    prices: tables.PriceTable | None = None
    confidence: float = CONFIDENCE

    def public(self) -> dict[str, Any]:
        prices: Any = None
        if isinstance(self.prices, tables.Prices):
            prices = vars(self.prices)
        elif self.prices is not None:
            prices = {model: vars(p) for model, p in self.prices.items()}
        return {"reference": self.reference, "resamples": self.resamples, "seed": self.seed,
                "confidence": self.confidence, "prices": prices}


@dataclass
class Report:
    """The tables of a report, the files written, and the report.json document."""

    run_dirs: list[Path]
    out_dir: Path
    settings: ReportSettings
    rows: pd.DataFrame
    items: pd.DataFrame
    summary: pd.DataFrame
    paired: pd.DataFrame
    categories: pd.DataFrame
    plots: list[Plot] = field(default_factory=list)
    paths: dict[str, Path] = field(default_factory=dict)
    document: dict[str, Any] = field(default_factory=dict)
    tiers: pd.DataFrame | None = None
    """BudgetMem tier-selection ratios per module (empty without BudgetMem cells)."""


def build_report(
    run_dirs: Sequence[Path],
    out_dir: Path,
    *,
    reference: str | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    prices: tables.PriceTable | None = None,
    plots: bool = True,
) -> Report:
    """Read the runs' cells.jsonl (shards and repeats merged, resumed cells' last row kept)
    and write summary.csv, paired.csv, categories.csv, plots/, report.json/.md/.html.

    ``reference`` is "strategy@budget" or "strategy" (its largest budget); by default
    full_context (else a strategy flagged as a reference) at its largest budget, per task.
    Raises ReportError for a missing run directory and ValueError for a malformed reference.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    settings = ReportSettings(reference, resamples, seed, prices)
    ref = tables.Reference.parse(reference)
    run_dirs = [Path(p) for p in run_dirs]
    rows = load.load(run_dirs)
    if ref.strategy is not None and not rows.empty and not (rows["strategy"] == ref.strategy).any():
        raise ValueError(
            f"reference {reference!r} names no strategy in these records; "
            f"give one of {', '.join(sorted(set(rows['strategy'])))} (as strategy@budget)"
        )
    items = tables.item_table(rows)
    summary = tables.summary_table(rows, items, resamples=resamples, seed=seed, prices=prices)
    paired = tables.paired_table(items, ref, resamples=resamples, seed=seed)
    categories = tables.category_table(rows, items, ref, resamples=resamples, seed=seed,
                                       prices=prices)
    report = Report(run_dirs, Path(out_dir), settings, rows, items, summary, paired, categories,
                    tiers=tiers.tier_table(rows))
    _write(report, with_plots=plots)
    return report


def _write(report: Report, *, with_plots: bool) -> None:
    out = report.out_dir
    out.mkdir(parents=True, exist_ok=True)
    paths = report.paths
    for name, table in ((SUMMARY_CSV, report.summary), (PAIRED_CSV, report.paired),
                        (CATEGORIES_CSV, report.categories)):
        paths[name.removesuffix(".csv")] = out / name
        _write_text(out / name, table.to_csv(index=False))
    if report.tiers is not None and not report.tiers.empty:
        paths["tiers"] = out / TIERS_CSV
        _write_text(paths["tiers"], report.tiers.to_csv(index=False))
    if with_plots:
        report.plots = write_plots(report.summary, out / PLOTS_DIR)
        if report.plots:
            paths["plots"] = out / PLOTS_DIR
    report.document = _document(report)
    paths["json"] = out / REPORT_JSON
    report_json.write_report_json(paths["json"], report.document)
    doc = _view(report)
    paths["md"] = out / REPORT_MD
    _write_text(paths["md"], render.render_markdown(doc, out))
    paths["html"] = out / REPORT_HTML
    _write_text(paths["html"], render.render_html(doc))


def _write_text(path: Path, text: str) -> None:
    """Every report file passes the redaction layer: rows and run.json already did, this
    keeps a secret from reaching a published report by any other way."""
    path.write_text(redact(text), encoding="utf-8")


def _run_ids(rows: pd.DataFrame) -> list[str]:
    return sorted({str(r) for r in rows["run_id"].dropna()}) if not rows.empty else []


def _document(report: Report) -> dict[str, Any]:
    return {
        "generated_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "run_dirs": [str(p) for p in report.run_dirs],
        "run_ids": _run_ids(report.rows),
        "runs": load.read_run_info(report.run_dirs),
        "settings": report.settings.public(),
        "rows": len(report.rows),
        "summary": report_json.records(report.summary),
        "paired": report_json.records(report.paired),
        "categories": report_json.records(report.categories),
        "tiers": [] if report.tiers is None else report_json.records(report.tiers),
        "items": report_json.item_cells(report.items),
        "plots": [
            {"kind": p.kind, "task": p.task, "title": p.title,
             "file": p.path.relative_to(report.out_dir).as_posix()}
            for p in report.plots
        ],
    }


def _distinct(rows: pd.DataFrame, column: str) -> str:
    if rows.empty or column not in rows:
        return ""
    return ", ".join(sorted({str(v) for v in rows[column].dropna()}))


def _view(report: Report) -> render.Document:
    rows = report.rows
    ref = report.settings.reference or "full_context (largest budget) by default"
    facts = [
        ("runs", _distinct(rows, "run_id")),
        ("rows (cells after merging)", str(len(rows))),
        ("tasks", _distinct(rows, "task")),
        ("model", _distinct(rows, "model")),
        ("tokenizer", _distinct(rows, "tokenizer")),
        ("reference", ref),
        ("bootstrap", f"{report.settings.resamples} resamples, seed {report.settings.seed}, "
                      "percentile 95% intervals over items (repeats averaged per item)"),
    ]
    sections = [
        ("Summary", "Quality is averaged over admitted items; violation rate is "
         "violations / (admitted + violations). Tokens and model latency cover admitted "
         "prompts.", render.view(report.summary, render.SUMMARY_VIEW)),
        ("Paired against the reference", "Deltas over items admitted and scored in both "
         "cells; excluded counts show the items each side lost, and the reference's "
         "quality on the items this cell lost to violations.",
         render.view(report.paired, render.PAIRED_VIEW)),
        ("Categories", "The same statistics per item category.",
         render.view(report.categories, render.CATEGORY_VIEW)),
    ]
    if report.tiers is not None and not report.tiers.empty:
        sections.append(
            ("BudgetMem tier selection", "Share of cells that ran each module at each tier, "
             "with the module's mean compute seconds (heuristic and embedding tiers included) "
             "and auxiliary tokens (input + output).",
             render.view(report.tiers, tiers.TIER_VIEW)))
    return render.Document(
        title="budgetbench report",
        facts=facts,
        sections=sections,
        plots=report.plots,
        errors=render.error_lines(rows),
    )
