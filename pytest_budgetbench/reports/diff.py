"""Two runs of the same cells, item by item: ``budgetbench diff RUN_A RUN_B``.

Each cell (task, strategy@budget) that both runs hold is paired by item: the change in
quality over the items scored in both, in tokens and latency over the items admitted in
both, each with a paired interval (as the paired table's: for a 0/1 grader Tango's score
interval with McNemar's flips and exact p, else the per-item differences resampled), the
smallest drop each cell could detect, the items whose status changed and those whose
quality flipped. The change in evidence retention is paired the same way, over the items
admitted in both whose evidence both kept a share of: what a model-free run measures. B
minus A throughout: a negative quality delta is B doing worse.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_budgetbench.errors import DiffError
from pytest_budgetbench.records import definition, run_json
from pytest_budgetbench.redact import redact
from pytest_budgetbench.reports import load, render, report_json, tables, viewer, viewer_page
from pytest_budgetbench.reports.gates.judging import judge_change
from pytest_budgetbench.reports.gates.verdicts import NONINFERIORITY
from pytest_budgetbench.reports.stats import (
    CHANGE_COLUMNS,
    DEFAULT_RESAMPLES,
    PairedChange,
    bootstrap_cis,
    cell_rng,
    paired_changes,
)

if TYPE_CHECKING:
    import pandas as pd

ITEM_KEY = [*tables.CELL, "item_id"]
DIFF_MD, DIFF_JSON, DIFF_HTML = "diff.md", "diff.json", "diff.html"
MAX_FLIPS_SHOWN = 30
"""Flipped items listed in the markdown summary (diff.json lists all)."""

COLUMNS: tuple[str, ...] = (
    "task", "strategy", "budget", "n_items", "n_paired", "quality_a", "quality_b",
    *CHANGE_COLUMNS, "tokens_delta", "tokens_lo", "tokens_hi",
    "latency_delta", "latency_lo", "latency_hi", "retention_delta", "retention_lo",
    "retention_hi", "status_changed", "better", "worse",
)
USAGE = ("tokens", "latency", "retention")
"""The per-item measures a cell's change is bootstrapped for besides quality, over the
items admitted in both runs (their ``*_delta``, ``*_lo`` and ``*_hi`` columns)."""


@dataclass
class RunDiff:
    run_a: Path
    run_b: Path
    table: pd.DataFrame
    """One row per common cell: the columns in COLUMNS."""
    flips: list[dict[str, Any]]
    """Items whose status changed or whose quality moved, per cell."""
    resamples: int
    seed: int
    viewer_cells: list[viewer.ViewerCell] = field(default_factory=list)

    def judge(self, tolerance: float, test: str = NONINFERIORITY
              ) -> tuple[list[str], list[str]]:
        """(failures, warnings): a line per cell whose quality change fails ``test`` with
        margin ``tolerance``, and per cell that passed a harm-shown test it was too small
        to fail (:func:`~pytest_budgetbench.reports.gates.judging.judge_change`, the gates'
        rule)."""
        failures, warnings = [], []
        for row in self.table.to_dict(orient="records"):
            if not row["n_paired"]:
                continue
            label = f"{row['task']}: {row['strategy']}@{row['budget']}"
            failure, warning = judge_change(label, _change(row), tolerance, test)
            failures.extend([failure] if failure else [])
            warnings.extend([warning] if warning else [])
        return failures, warnings

    def regressions(self, tolerance: float, test: str = NONINFERIORITY) -> list[str]:
        """The failure lines of :meth:`judge`."""
        return self.judge(tolerance, test)[0]


def diff_runs(run_a: Path, run_b: Path, *, resamples: int = DEFAULT_RESAMPLES,
              seed: int = 0) -> RunDiff:
    """Pair the cells of two runs item by item. Raises ReportError for a missing run
    directory and DiffError when the runs share no cell."""
    loaded = [load.load([Path(run)]) for run in (run_a, run_b)]
    _check_same_items(Path(run_a), Path(run_b), *loaded)
    frames = [_item_frame(rows) for rows in loaded]
    common = _common_cells(*frames, run_a=run_a, run_b=run_b)
    merged = frames[0].merge(frames[1], on=ITEM_KEY, suffixes=("_a", "_b"))
    records: list[dict[str, Any]] = []
    quality: list[tuple[np.ndarray, np.ndarray, np.random.Generator]] = []
    samples: list[tuple[np.ndarray, np.random.Generator]] = []
    flips: list[dict[str, Any]] = []
    for key, group in merged.groupby(list(tables.CELL), sort=True, observed=True):
        task, strategy, budget = tables.key_values(key)
        if (task, strategy, int(budget)) not in common:
            continue
        record, (scores_b, scores_a), usage = _cell(group)
        records.append({"task": task, "strategy": strategy, "budget": int(budget), **record})
        quality.append((scores_b, scores_a,
                        cell_rng(seed, "diff", "quality", task, strategy, budget)))
        samples.extend((values, cell_rng(seed, "diff", kind, task, strategy, budget))
                       for kind, values in usage)
        flips.extend(_flips(group))
    # The change of every cell at once (their bootstraps in parallel), then the usage's.
    for record, change in zip(records, paired_changes(quality, resamples=resamples),
                              strict=True):
        record.update(change.columns())
    intervals = bootstrap_cis(samples, resamples=resamples)
    for index, record in enumerate(records):
        for offset, name in enumerate(USAGE):
            lo, hi = intervals[len(USAGE) * index + offset]
            record[f"{name}_lo"], record[f"{name}_hi"] = lo, hi
    import pandas as pd

    table = tables.with_optional_counts(
        pd.DataFrame.from_records(records, columns=list(COLUMNS)), records)
    cells = []
    for record in records:
        task, strategy, budget = str(record["task"]), str(record["strategy"]), record["budget"]
        cells.append(viewer.ViewerCell("A", task, strategy, budget))
        cells.append(viewer.ViewerCell("B", task, strategy, budget, ref=len(cells) - 1))
    return RunDiff(Path(run_a), Path(run_b), table, flips, resamples, seed, cells)


SAME_ITEMS = ("diff two runs of the same items (the same tasks, seed, data and task options), "
              "e.g. one sweep with another model or strategy")


def _check_same_items(run_a: Path, run_b: Path, rows_a: pd.DataFrame, rows_b: pd.DataFrame
                      ) -> None:
    """Refuse to pair items that are not the same: the runs' definitions (run.json) must
    agree on what makes the items, and rows of one item id must record one gold."""
    found = definition.differences(_items_definition(run_a), _items_definition(run_b),
                                   items_only=True)
    if found:
        raise DiffError(f"{run_a} and {run_b} hold different items: "
                        f"{definition.describe(found, '{what} {old} in A, {new} in B')}; "
                        f"{SAME_ITEMS}")
    golds_a = _golds(rows_a)
    changed = [(key, gold, golds_a[key]) for key, gold in _golds(rows_b).items()
               if key in golds_a and not definition.same_gold(golds_a[key], gold)]
    if changed:
        (task, item_id), gold_b, gold_a = changed[0]
        more = f" (and {len(changed) - 1} more items)" if len(changed) > 1 else ""
        raise DiffError(f"{run_a} and {run_b} hold different items under the same ids: task "
                        f"{task!r} item {item_id} has gold {definition.show(gold_a)} in A, "
                        f"{definition.show(gold_b)} in B{more}; {SAME_ITEMS}")


def _items_definition(run: Path) -> dict[str, Any]:
    """A run's definition; for a run.json without one, its recorded seed."""
    info = load.run_info(run) or {}
    block = run_json.definition_of(info)
    if block is not None:
        return dict(block)
    settings = run_json.settings_of(info)
    return {"settings": {"seed": settings["seed"]}} if "seed" in settings else {}


def _golds(rows: pd.DataFrame) -> dict[tuple[str, str], Any]:
    """The gold each (task, item) recorded (rows of schema 2 on)."""
    if "gold" not in rows.columns:
        return {}
    return {(task, item): gold for task, item, gold
            in zip(rows["task"], rows["item_id"], rows["gold"], strict=True)
            if gold is not None and not (isinstance(gold, float) and math.isnan(gold))}


def _item_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """Per item of each cell: merged status, mean quality, and the mean tokens, latency and
    evidence retention of its admitted repeats."""
    items = tables.item_table(rows)
    ok = rows.loc[rows["status"] == tables.ADMITTED, ITEM_KEY].copy()
    ok["tokens"] = rows["counted_tokens"]
    ok["latency"] = rows["strategy_s"].fillna(0.0) + rows["model_s"]
    usage = ok.groupby(ITEM_KEY, sort=False, observed=True)[["tokens", "latency"]].mean()
    items = items.rename(columns={"evidence_retention": "retention"})
    return items[[*ITEM_KEY, "status", "quality", "retention"]].merge(
        usage.reset_index(), on=ITEM_KEY, how="left")


def _common_cells(a: pd.DataFrame, b: pd.DataFrame, *, run_a: Path, run_b: Path
                  ) -> set[tuple[str, str, int]]:
    def cells(frame: pd.DataFrame) -> set[tuple[str, str, int]]:
        unique = frame[list(tables.CELL)].drop_duplicates()
        return {(str(t), str(s), int(b)) for t, s, b in unique.itertuples(index=False)}

    mine, theirs = cells(a), cells(b)
    common = mine & theirs
    if not common:
        raise DiffError(
            f"{run_a} ({_describe(mine)}) and {run_b} ({_describe(theirs)}) have no cell "
            "(task, strategy@budget) in common; diff two runs of the same sweep"
        )
    return common


def _describe(cells: set[tuple[str, str, int]], limit: int = 4) -> str:
    if not cells:
        return "no cells"
    names = [f"{task}: {strategy}@{budget}" for task, strategy, budget in sorted(cells)]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _cell(group: pd.DataFrame) -> tuple[dict[str, Any], tuple[np.ndarray, np.ndarray],
                                        list[tuple[str, np.ndarray]]]:
    """A cell's counts and means, its paired quality scores (B, A), and its usage
    differences by kind."""
    scored = group["quality_a"].notna() & group["quality_b"].notna()
    scores_b = group.loc[scored, "quality_b"].to_numpy(dtype=np.float64)
    scores_a = group.loc[scored, "quality_a"].to_numpy(dtype=np.float64)
    quality = scores_b - scores_a
    admitted = (group["status_a"] == tables.ADMITTED) & (group["status_b"] == tables.ADMITTED)
    usage = [(name, _differences(group, name, admitted)) for name in USAGE]
    record = {
        "n_items": len(group),
        "n_paired": int(scored.sum()),
        "quality_a": _mean(scores_a),
        "quality_b": _mean(scores_b),
        **{f"{name}_delta": _mean(values) for name, values in usage},
        "status_changed": int((group["status_a"] != group["status_b"]).sum()),
        "better": int((quality > 0).sum()),
        "worse": int((quality < 0).sum()),
    }
    return record, (scores_b, scores_a), usage


def _change(row: Mapping[Any, Any]) -> PairedChange:
    """A table row's quality change, as :func:`~.stats.paired_changes` made it."""
    def count(name: str) -> int | None:
        value = _number(row[name])
        return None if value is None else int(value)

    return PairedChange(int(row["n_paired"]), row["delta"], row["delta_lo"], row["delta_hi"],
                        str(row["ci_method"]), count("flips_down"), count("flips_up"),
                        _number(row["mcnemar_p"]), row["mde"])


def _differences(group: pd.DataFrame, name: str, mask: pd.Series) -> np.ndarray:
    values = (group[f"{name}_b"] - group[f"{name}_a"])[mask].to_numpy(dtype=np.float64)
    return values[~np.isnan(values)]


def _number(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) \
        else float(value)


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else math.nan


def _flips(group: pd.DataFrame) -> list[dict[str, Any]]:
    moved = (group["status_a"] != group["status_b"]) | (
        group["quality_a"].notna() & group["quality_b"].notna()
        & (group["quality_a"] != group["quality_b"])
    )
    return [
        {"task": row["task"], "strategy": row["strategy"], "budget": int(row["budget"]),
         "item_id": row["item_id"], "status_a": row["status_a"], "status_b": row["status_b"],
         "quality_a": _number(row["quality_a"]), "quality_b": _number(row["quality_b"])}
        for row in group.loc[moved].to_dict(orient="records")
    ]


# -- output ---------------------------------------------------------------------------------
QUALITY_VIEW: tuple[render.Column, ...] = (
    render.col("paired items", "n_paired", render.integer),
    render.col("quality A", "quality_a", render.num(3)),
    render.col("quality B", "quality_b", render.num(3)),
    *render.change_view("quality B-A"),
)
"""The quality columns of the table: a comment on model-free runs leaves them out."""

DIFF_VIEW: tuple[render.Column, ...] = (
    render.col("task", "task"),
    render.col("strategy", "strategy"),
    render.col("budget", "budget", render.integer),
    *QUALITY_VIEW,
    render.Column("tokens B-A", render.interval("tokens_delta", "tokens_lo", "tokens_hi", 1)),
    render.Column("latency s B-A", render.interval("latency_delta", "latency_lo",
                                                   "latency_hi", 3)),
    render.Column("retention B-A", render.interval("retention_delta", "retention_lo",
                                                   "retention_hi", 3)),
    render.col("status changed", "status_changed", render.integer),
    render.col("better", "better", render.integer),
    render.col("worse", "worse", render.integer),
)


def _facts(result: RunDiff) -> list[tuple[str, str]]:
    return [
        ("A", str(result.run_a)),
        ("B", str(result.run_b)),
        ("cells in common", str(len(result.table))),
        ("bootstrap", f"{result.resamples} resamples, seed {result.seed}, percentile 95% "
                      "intervals over paired items (quality of a 0/1 grader: Tango's score "
                      "interval)"),
        ("MDE", "the smallest quality drop a cell's test would show with 80% power at its "
                "size"),
    ]


def _flip_rows(flips: Sequence[dict[str, Any]]) -> list[list[str]]:
    def side(status: str, quality: float | None) -> str:
        return status if quality is None else f"{status} {quality:.3f}"

    return [[f["task"], f"{f['strategy']}@{f['budget']}", str(f["item_id"]),
             side(f["status_a"], f["quality_a"]), side(f["status_b"], f["quality_b"])]
            for f in flips]


FLIP_HEADERS = ["task", "cell", "item", "A", "B"]
NOTE = ("B minus A, per cell, over the items both runs hold: quality over items scored in "
        "both, tokens, latency and evidence retention over items admitted in both.")


def render_markdown(result: RunDiff, regressions: Sequence[str] = (),
                    warnings: Sequence[str] = (), *, comment: bool = False) -> str:
    """The summary for a pull-request comment: the table, the regressions and gate
    warnings, the flips. ``comment`` leaves out the table's columns no cell fills (a
    model-free run has no quality or latency) and folds the flips into ``<details>``
    (:func:`~pytest_budgetbench.reports.ci.comment_body` adds the marker)."""
    columns = DIFF_VIEW
    if comment and not result.table["n_paired"].sum():  # model-free runs: no quality
        columns = tuple(column for column in DIFF_VIEW if column not in QUALITY_VIEW)
    headers, body = render.view(result.table, columns)
    if comment:
        headers, body = render.filled_columns(headers, body)
    parts = ["## budgetbench diff\n",
             *(f"- **{render.md_escape(k)}**: {render.md_escape(v)}" for k, v in _facts(result)),
             "", render.md_escape(NOTE), "", render.md_table(headers, body)]
    if regressions:
        parts += ["### Regressions\n", *(f"- {render.md_escape(line)}" for line in regressions),
                  ""]
    if warnings:
        parts += ["### Gate warnings\n", *(f"- {render.md_escape(line)}" for line in warnings),
                  ""]
    shown = result.flips[:MAX_FLIPS_SHOWN]
    parts.append(f"### Flipped items ({len(result.flips)})\n")
    if shown:
        table = render.md_table(FLIP_HEADERS, _flip_rows(shown))
        parts.append(render.md_details(f"{len(shown)} items", table) if comment else table)
        if len(result.flips) > len(shown):
            parts.append(f"_and {len(result.flips) - len(shown)} more (diff.json lists all)_\n")
    else:
        parts.append("_none_\n")
    return "\n".join(parts)


def render_text(result: RunDiff, regressions: Sequence[str] = (),
                warnings: Sequence[str] = ()) -> str:
    """The table as aligned plain text, for a terminal."""
    headers, body = render.view(result.table, DIFF_VIEW)
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h)
              for i, h in enumerate(headers)]
    lines = [f"A: {result.run_a}", f"B: {result.run_b}",
             "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in body]
    lines.append(f"{len(result.flips)} items flipped (status or quality); --format=md lists them")
    lines += [f"regression: {line}" for line in regressions]
    lines += [f"warning: {line}" for line in warnings]
    return "\n".join(lines) + "\n"


def document(result: RunDiff) -> dict[str, Any]:
    return {
        "schema": "budgetbench-diff", "schema_version": 1,
        "run_a": str(result.run_a), "run_b": str(result.run_b),
        "settings": {"resamples": result.resamples, "seed": result.seed},
        "cells": report_json.records(result.table), "flips": result.flips,
    }


def render_html(result: RunDiff, *, viewer_rows: int = viewer.MAX_ROWS) -> str:
    """diff.html: the table, the flips, and the viewer with A and B side by side."""
    headers, body = render.view(result.table, DIFF_VIEW)
    sections = [("Paired changes", NOTE + " A cell's items view compares B with A.",
                 (headers, body)),
                ("Flipped items", "Items whose status changed or whose quality moved.",
                 (FLIP_HEADERS, _flip_rows(result.flips)))]
    page = None
    if viewer_rows > 0 and result.viewer_cells:
        data = viewer.viewer_data([viewer.Side("A", [result.run_a]),
                                   viewer.Side("B", [result.run_b])],
                                  result.viewer_cells, max_rows=viewer_rows)
        page = viewer_page.viewer_page(data)
    links = {0: [viewer_page.cell_href(2 * i + 1) for i in range(len(body))]} if page else {}
    doc = render.Document(title="budgetbench diff", facts=_facts(result), sections=sections,
                          plots=[], errors=[], viewer=page, row_links=links)
    return render.render_html(doc)


def write_files(result: RunDiff, out_dir: Path, regressions: Sequence[str] = (),
                warnings: Sequence[str] = ()) -> list[Path]:
    """diff.md, diff.json and diff.html in ``out_dir``, each through the redaction layer."""
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = {
        DIFF_MD: render_markdown(result, regressions, warnings),
        DIFF_JSON: report_json.dumps_indented(document(result)) + "\n",
        DIFF_HTML: render_html(result),
    }
    paths = []
    for name, text in texts.items():
        path = out_dir / name
        path.write_text(redact(text), encoding="utf-8")
        paths.append(path)
    return paths


def dumps(result: RunDiff) -> str:
    return json.dumps(document(result), ensure_ascii=False, allow_nan=False, indent=1) + "\n"
