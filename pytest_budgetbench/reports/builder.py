"""Records in, every report file out, in two steps: :func:`compute_report` reads the runs and
computes every table (and the report.json document) without writing a file, and
:func:`write_report` writes them. :func:`build_report` is the two together, for
``budgetbench report`` on any set of run directories; the plugin computes once for its
gates and writes at session end."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.errors import ConfigError, ReportError
from pytest_budgetbench.records import definition, run_json
from pytest_budgetbench.redact import redact
from pytest_budgetbench.reports import load, render, report_json, tables, viewer, viewer_page
from pytest_budgetbench.reports.extensions import ExtraTable, ReportExtension, report_extensions
from pytest_budgetbench.reports.plots import Plot, write_plots
from pytest_budgetbench.reports.stats import CONFIDENCE, DEFAULT_RESAMPLES

if TYPE_CHECKING:
    import pandas as pd

SUMMARY_CSV = "summary.csv"
PAIRED_CSV = "paired.csv"
CATEGORIES_CSV = "categories.csv"
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
    """The merged rows, one per cell: the fields in load.REPORT_FIELDS and those the
    extensions declare (every field if one declares none)."""
    items: pd.DataFrame
    summary: pd.DataFrame
    paired: pd.DataFrame
    categories: pd.DataFrame
    plots: list[Plot] = field(default_factory=list)
    paths: dict[str, Path] = field(default_factory=dict)
    document: dict[str, Any] = field(default_factory=dict)
    extra_tables: dict[str, ExtraTable] = field(default_factory=dict)
    """The report extensions' tables by name (e.g. BudgetMem's ``tiers``); may be empty."""
    extensions: list[ReportExtension] = field(default_factory=list)
    viewer_rows: int = viewer.MAX_ROWS
    """Rows the report.html viewer holds at most (0: no viewer)."""
    reference: tables.Reference = field(default_factory=lambda: tables.Reference.parse(None))
    notes: list[str] = field(default_factory=list)
    """What the merge of several runs did that a reader should know (superseded rows,
    runs of different definitions), and items that declare evidence a retention mean leaves
    out: one line each, for the console command to print."""


def build_report(
    run_dirs: Sequence[Path],
    out_dir: Path,
    *,
    reference: str | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    prices: tables.PriceTable | None = None,
    plots: bool = True,
    extensions: Sequence[ReportExtension] | None = None,
    viewer_rows: int = viewer.MAX_ROWS,
) -> Report:
    """Read the runs' cells.jsonl (shards and repeats merged, resumed cells' last row kept)
    and write summary.csv, paired.csv, categories.csv, plots/, report.json/.md/.html.

    ``reference`` is "strategy@budget" or "strategy" (its largest budget); by default
    full_context (else a strategy flagged as a reference) at its largest budget, per task.
    ``extensions`` add tables and plots; by default the installed and registered ones
    (reports.extensions). ``viewer_rows`` caps the rows report.html's item viewer holds
    (0 leaves the viewer out).
    Raises ReportError for a missing run directory and ConfigError for a malformed reference
    or fewer than 1 resample.
    """
    report = compute_report(run_dirs, out_dir, reference=reference, resamples=resamples,
                            seed=seed, prices=prices, extensions=extensions,
                            viewer_rows=viewer_rows)
    write_report(report, plots=plots)
    return report


def compute_report(
    run_dirs: Sequence[Path],
    out_dir: Path,
    *,
    reference: str | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    prices: tables.PriceTable | None = None,
    extensions: Sequence[ReportExtension] | None = None,
    viewer_rows: int = viewer.MAX_ROWS,
) -> Report:
    """The report of the runs, every table and the report.json document, written nowhere
    (``out_dir`` is where :func:`write_report` will write it). Arguments and errors as
    :func:`build_report`."""
    if resamples < 1:
        raise ConfigError(f"resamples must be at least 1, got {resamples}")
    settings = ReportSettings(reference, resamples, seed, prices)
    ref = tables.Reference.parse(reference)
    run_dirs = [Path(p) for p in run_dirs]
    chosen = report_extensions() if extensions is None else list(extensions)
    notes: list[str] = []
    rows = load.load(run_dirs, row_fields(chosen), notes=notes)
    notes += definition_notes(run_dirs)
    if ref.strategy is not None and not rows.empty and not (rows["strategy"] == ref.strategy).any():
        raise ConfigError(
            f"reference {reference!r} names no strategy in these records; "
            f"give one of {', '.join(sorted(set(rows['strategy'])))} (as strategy@budget)"
        )
    if "evidence_retention" in rows.columns and rows["evidence_retention"].notna().any():
        from pytest_budgetbench.reports.summary import retention_notes

        notes += retention_notes(rows[[*tables.CELL, "item_id", "status", "evidence_retention"]]
                                 .to_dict("records"))
    items = tables.item_table(rows)
    summary = tables.summary_table(rows, resamples=resamples, seed=seed, prices=prices)
    paired = tables.paired_table(items, ref, resamples=resamples, seed=seed)
    categories = tables.category_table(rows, items, ref, resamples=resamples, seed=seed,
                                       prices=prices)
    report = Report(run_dirs, Path(out_dir), settings, rows, items, summary, paired, categories,
                    extra_tables=_extra_tables(chosen, rows), extensions=chosen,
                    viewer_rows=viewer_rows, reference=ref, notes=notes)
    report.document = _document(report)
    return report


def write_report(report: Report, out_dir: Path | None = None, *, plots: bool = True) -> Report:
    """Write a computed report's files to ``out_dir`` (by default its own): summary.csv,
    paired.csv, categories.csv, the extensions' tables, plots/ (unless ``plots`` is
    False), report.json/.md/.html. Fills ``report.paths`` (and ``report.plots``)."""
    if out_dir is not None:
        report.out_dir = Path(out_dir)
    _write(report, with_plots=plots, reference=report.reference)
    return report


def definition_notes(run_dirs: Sequence[Path]) -> list[str]:
    """A line for each run whose definition (run.json) differs from the first run's in what
    defines a cell: merged, their rows would count as one sweep's."""
    infos = [(run, run_json.definition_of(load.run_info(run) or {})) for run in run_dirs]
    defined = [(run, block) for run, block in infos if block is not None]
    notes = []
    for run, block in defined[1:]:
        found = definition.differences(defined[0][1], block)
        if found:
            differ = definition.describe(found, "{what}: {old} in the first, {new} in the second")
            notes.append(f"{defined[0][0]} and {run} are merged as runs of one sweep but differ "
                         f"in {differ}; report them apart, or compare them with budgetbench diff")
    return notes


def row_fields(extensions: Sequence[ReportExtension]) -> list[str] | None:
    """The row fields the extensions read besides the report's own (load.REPORT_FIELDS);
    None, every field, if one of them does not say (it has no ``row_fields``)."""
    fields: list[str] = []
    for extension in extensions:
        declared = getattr(extension, "row_fields", None)
        if declared is None:
            return None
        fields.extend(declared)
    return fields


def _extra_tables(extensions: Sequence[ReportExtension], rows: pd.DataFrame
                  ) -> dict[str, ExtraTable]:
    """Every extension's tables by name (two tables of one name are an error)."""
    extra: dict[str, ExtraTable] = {}
    for extension in extensions:
        for table in extension.tables(rows):
            if table.name in extra:
                raise ReportError(f"report extension '{extension.name}' adds a table named "
                                  f"'{table.name}', which another extension added; rename it")
            extra[table.name] = table
    return extra


def _write(report: Report, *, with_plots: bool, reference: tables.Reference) -> None:
    out = report.out_dir
    out.mkdir(parents=True, exist_ok=True)
    paths = report.paths
    for name, table in ((SUMMARY_CSV, report.summary), (PAIRED_CSV, report.paired),
                        (CATEGORIES_CSV, report.categories)):
        paths[name.removesuffix(".csv")] = out / name
        _write_text(out / name, table.to_csv(index=False))
    for name, extra in report.extra_tables.items():
        if not extra.table.empty:
            paths[name] = out / f"{name}.csv"
            _write_text(paths[name], extra.table.to_csv(index=False))
    if with_plots:
        report.plots = write_plots(report.summary, out / PLOTS_DIR)
        for extension in report.extensions:
            report.plots.extend(extension.plots(report.summary, out / PLOTS_DIR))
        if report.plots:
            paths["plots"] = out / PLOTS_DIR
        report.document = _document(report)  # it lists the plots
    paths["json"] = out / REPORT_JSON
    report_json.write_report_json(paths["json"], report.document)
    doc = _view(report)
    paths["md"] = out / REPORT_MD
    _write_text(paths["md"], render.render_markdown(doc, out))
    paths["html"] = out / REPORT_HTML
    if report.viewer_rows > 0 and not report.summary.empty:
        cells = viewer_cells(report.summary, report.items, reference)
        data = viewer.viewer_data([viewer.Side("", report.run_dirs)], cells,
                                  max_rows=report.viewer_rows)
        doc = replace(doc, viewer=viewer_page.viewer_page(data),
                      row_links={0: [viewer_page.cell_href(i) for i in range(len(cells))]})
    _write_text(paths["html"], render.render_html(doc))


def viewer_cells(summary: pd.DataFrame, items: pd.DataFrame, reference: tables.Reference
                 ) -> list[viewer.ViewerCell]:
    """The summary's cells, in its order, each with the index of its task's reference."""
    refs = {}
    for task, task_items in items.groupby("task", sort=True, observed=True):
        refs[str(task)] = reference.resolve(task_items)
    keys = list(zip(summary["task"].astype(str), summary["strategy"].astype(str),
                    summary["budget"].astype(int), summary["reference"].astype(bool),
                    strict=True))
    index = {(task, strategy, budget): i for i, (task, strategy, budget, _) in enumerate(keys)}
    cells = []
    for task, strategy, budget, is_reference in keys:
        resolved = refs.get(task)
        ref = None if resolved is None else index.get((task, *resolved))
        own = ref == index[(task, strategy, budget)]
        cells.append(viewer.ViewerCell("", task, strategy, budget, is_reference,
                                       None if own else ref))
    return cells


def _write_text(path: Path, text: str) -> None:
    """Every report file passes the redaction layer: rows and run.json already did, this
    keeps a secret from reaching a published report by any other way."""
    path.write_text(redact(text), encoding="utf-8")


def _run_ids(rows: pd.DataFrame) -> list[str]:
    return sorted({str(r) for r in rows["run_id"].dropna()}) if not rows.empty else []


def _document(report: Report) -> dict[str, Any]:
    document: dict[str, Any] = {
        "generated_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "run_dirs": [str(p) for p in report.run_dirs],
        "run_ids": _run_ids(report.rows),
        "runs": load.read_run_info(report.run_dirs),
        "settings": report.settings.public(),
        "rows": len(report.rows),
        "summary": report_json.records(report.summary),
        "paired": report_json.records(report.paired),
        "categories": report_json.records(report.categories),
        "items": report_json.item_cells(report.items),
        "plots": [
            {"kind": p.kind, "task": p.task, "title": p.title,
             "file": p.path.relative_to(report.out_dir).as_posix()}
            for p in report.plots
        ],
    }
    for name, extra in report.extra_tables.items():
        # report_json adds "schema" and "schema_version" in front of the document.
        if name in document or name in ("schema", "schema_version"):
            raise ReportError(f"a report extension adds a table named '{name}', which "
                              "report.json already has; rename the table")
        document[name] = report_json.records(extra.table)
    return document


def _distinct(rows: pd.DataFrame, column: str) -> str:
    if rows.empty or column not in rows:
        return ""
    return ", ".join(sorted({str(v) for v in rows[column].dropna()}))


def report_facts(report: Report) -> list[tuple[str, str]]:
    """Where a report's numbers come from, as report.md and the CI job summary state them:
    the runs, rows, tasks, model, tokenizer, reference and bootstrap."""
    rows = report.rows
    ref = report.settings.reference or "full_context (largest budget) by default"
    return [
        ("runs", _distinct(rows, "run_id")),
        ("rows (cells after merging)", str(len(rows))),
        ("tasks", _distinct(rows, "task")),
        ("model", _distinct(rows, "model")),
        ("tokenizer", _distinct(rows, "tokenizer")),
        ("reference", ref),
        ("bootstrap", f"{report.settings.resamples} resamples, seed {report.settings.seed}, "
                      "percentile 95% intervals over items (repeats averaged per item)"),
    ]


def _view(report: Report) -> render.Document:
    rows = report.rows
    facts = report_facts(report)
    sections = [
        ("Summary", "Quality is averaged over admitted items; violation rate is "
         "violations / (admitted + violations). Tokens, model latency and evidence retention "
         "cover admitted prompts (retention, those whose item declares evidence). Answer "
         "kept is the share of admitted prompts that hold the gold answer outside the "
         "question, over the items whose evidence holds it; (unique), over those whose "
         "history holds it nowhere else.",
         render.view(report.summary, render.SUMMARY_VIEW)),
        ("Paired against the reference", "Deltas over items admitted and scored in both "
         "cells; excluded counts show the items each side lost, and the reference's "
         "quality on the items this cell lost to violations. Retention and answer kept are "
         "paired over the items admitted in both that have them (paired bootstrap).",
         render.view(report.paired, render.PAIRED_VIEW)),
        ("Categories", "The same statistics per item category.",
         render.view(report.categories, render.CATEGORY_VIEW)),
    ]
    sections.extend((extra.title, extra.note, render.view(extra.table, extra.view))
                    for extra in report.extra_tables.values() if not extra.table.empty)
    return render.Document(
        title="budgetbench report",
        facts=facts,
        sections=sections,
        plots=report.plots,
        errors=render.error_lines(rows),
    )
