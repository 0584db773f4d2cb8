"""The report's tables: items (repeats averaged), summary, paired deltas and categories.

The paired table starts from the item table: one row per task, strategy, budget and item,
with quality averaged over the item's admitted repeats. The summary's quality is over
items too, averaged the same way, by :mod:`.summary` (the one computation of the
statistics the terminal shows as well). Intervals are over items, so an item counts once
however often it was repeated.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.records.rows import Status
from pytest_budgetbench.reports.stats import (
    CHANGE_COLUMNS,
    bootstrap_cis,
    cell_rng,
    paired_changes,
)
from pytest_budgetbench.reports.summary import CELL, summarise
from pytest_budgetbench.sweep.cells import split_reference

if TYPE_CHECKING:
    import pandas as pd

CATEGORY_CELL: tuple[str, ...] = ("task", "category", "strategy", "budget")
DEFAULT_REFERENCE = "full_context"

# Item status after merging repeats: admitted if any repeat was, else violation if any was.
ADMITTED, VIOLATION, ERROR = Status.OK, Status.VIOLATION, Status.ERROR


def key_values(key: Hashable) -> tuple[Any, ...]:
    """A groupby (or MultiIndex) key as a tuple of its values: pandas gives a tuple for
    several keys and the bare value for one."""
    return key if isinstance(key, tuple) else (key,)


@dataclass(frozen=True)
class Prices:
    """USD per million tokens; input covers prompts, output covers completions."""

    input_per_mtok: float
    output_per_mtok: float


# One price for every row, or prices by the row's model id ("*" matches any other model).
PriceTable = Prices | Mapping[str, Prices]


@dataclass(frozen=True)
class Reference:
    """The cell every other cell of a task is paired against; budget None means the
    largest budget the strategy ran at in that task."""

    strategy: str | None = None
    budget: int | None = None

    @classmethod
    def parse(cls, text: str | None) -> Reference:
        if text is None or not text.strip():
            return cls()
        strategy, budget = split_reference(text)
        if not strategy or strategy.startswith("@") or strategy.endswith("@"):
            raise ConfigError(f"reference {text!r} names no strategy (expected strategy@budget)")
        return cls(strategy=strategy, budget=budget)

    def resolve(self, task_items: pd.DataFrame) -> tuple[str, int] | None:
        """The (strategy, budget) of the reference in one task, or None if it did not run.

        The default (no strategy given) falls back to the cell that pairs: see
        :func:`pairing_reference`. A reference the user named is kept as named.
        """
        strategy = self.strategy or _default_reference_strategy(task_items)
        if strategy is None:
            return None
        budgets = task_items.loc[task_items["strategy"] == strategy, "budget"]
        if budgets.empty:
            return None
        if self.strategy is None:
            return pairing_reference((strategy, int(budgets.max())), admitted_counts(task_items))
        if self.budget is None:
            return strategy, int(budgets.max())
        return (strategy, self.budget) if (budgets == self.budget).any() else None


def admitted_counts(task_items: pd.DataFrame) -> dict[tuple[str, int], int]:
    """Items admitted and scored per (strategy, budget): what a reference can pair on. In a
    task nothing scored (a model-free sweep's), items admitted: retention pairs on them."""
    admitted = task_items["status"] == ADMITTED
    scored = task_items.loc[admitted & task_items["quality"].notna()]
    if scored.empty:
        scored = task_items.loc[admitted]
    counts = scored.groupby(["strategy", "budget"], observed=True).size()
    return {(str(strategy), int(budget)): int(n)
            for (strategy, budget), n in zip(counts.index.tolist(), counts.tolist(), strict=True)}


def pairing_reference(
    default: tuple[str, int] | None, admitted: Mapping[tuple[str, int], int]
) -> tuple[str, int] | None:
    """The default reference when it admitted an item; otherwise the cell that admitted
    the most items (ties: the larger budget, then the strategy name), so that the paired
    table pairs something. ``default`` stays (and pairs nothing) when no cell admitted any.

    Example: full_context's memory histories are ~3.2K tokens, so at --budgets=512,2048
    it admits nothing and truncation@2048, which admits every item, becomes the reference.
    """
    if default is not None and admitted.get(default, 0) > 0:
        return default
    ranked = sorted((cell for cell, n in admitted.items() if n > 0),
                    key=lambda cell: (-admitted[cell], -cell[1], cell[0]))
    return ranked[0] if ranked else default


def _default_reference_strategy(task_items: pd.DataFrame) -> str | None:
    strategies = task_items["strategy"]
    if (strategies == DEFAULT_REFERENCE).any():
        return DEFAULT_REFERENCE
    flagged = sorted(set(strategies[task_items["reference"]]))
    return flagged[0] if flagged else None


# -- items ----------------------------------------------------------------------------------
def item_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per task, strategy, budget and item: repeats merged, quality averaged over
    the admitted, scored repeats, and each paired share (:data:`PAIRED_SHARES`: evidence
    retention, answer kept) over the admitted repeats (null where the item has none)."""
    import pandas as pd

    keys = [*CELL, "item_id"]
    flags = rows[keys].copy()
    for status in (ADMITTED, VIOLATION, ERROR):
        flags[f"n_{status}"] = (rows["status"] == status).astype("int64")
    flags["quality"] = rows["quality"]
    for field in PAIRED_SHARES.values():
        flags[field] = rows[field].where(rows["status"] == ADMITTED)
    flags["category"] = rows["category"]
    flags["reference"] = rows["reference"]
    grouped = flags.groupby(keys, sort=True, observed=True)
    items = grouped.agg(
        category=("category", "first"),
        reference=("reference", "max"),
        n_repeats=("n_ok", "size"),
        n_ok=("n_ok", "sum"),
        n_violation=("n_violation", "sum"),
        n_error=("n_error", "sum"),
        quality=("quality", "mean"),
        **{field: (field, "mean") for field in PAIRED_SHARES.values()},
    ).reset_index()
    # Indices into one array of the three statuses: a million items share three strings.
    statuses = np.array([ADMITTED, VIOLATION, ERROR], dtype=object)
    items["status"] = statuses[
        np.select([items["n_ok"] > 0, items["n_violation"] > 0], [0, 1], default=2)
    ]
    return pd.DataFrame(items)


# -- summary --------------------------------------------------------------------------------
def summary_table(
    rows: pd.DataFrame,
    keys: Sequence[str] = CELL,
    *,
    resamples: int,
    seed: int,
    prices: PriceTable | None = None,
) -> pd.DataFrame:
    """Per-cell statistics: counts, mean quality with intervals, violation rate, tokens,
    latency, auxiliary calls and cost. ``keys`` adds grouping levels (category).

    The statistics the terminal shows too (counts, quality, tokens, median model seconds,
    episodes, retention, name accuracy) are :func:`.summary.summarise`'s, the one
    computation of them; the others (:func:`_usage_stats`) are pandas' over the rows."""
    import pandas as pd

    keys = list(keys)
    if rows.empty:
        return _empty(SUMMARY_COLUMNS, keys)
    cells = summarise(FrameColumns(rows), keys, resamples=resamples, seed=seed)
    table = pd.DataFrame.from_records([cell.record() for cell in cells])
    table = table.merge(_usage_stats(rows, keys, prices), on=keys, how="left")
    table["cost_usd_per_cell"] = table["cost_usd_total"] / table["n_cells"]
    return table[[*keys, *(c for c in SUMMARY_COLUMNS if c not in keys)]]


class FrameColumns(Mapping[str, Sequence[Any]]):
    """A DataFrame's columns as lists, each made when it is read (:func:`.summary.summarise`
    reads one at a time, so a million rows hold one column of Python values at once)."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame

    def __getitem__(self, name: str) -> list[Any]:
        values: list[Any] = self.frame[name].tolist()
        return values

    def __iter__(self) -> Iterator[str]:
        return iter(self.frame.columns)

    def __len__(self) -> int:
        return len(self.frame.columns)


SUMMARY_COLUMNS: tuple[str, ...] = (
    "reference",
    "n_items",
    "n_admitted",
    "n_scored",
    "quality_mean",
    "quality_lo",
    "quality_hi",
    "binary",
    "wilson_lo",
    "wilson_hi",
    "n_cells",
    "n_ok",
    "n_violation",
    "n_error",
    "violation_rate",
    "tokens_mean",
    "tokens_max",
    "utilisation_mean",
    "strategy_s_p50",
    "strategy_s_p95",
    "model_s_p50",
    "model_s_p95",
    "latency_s_p50",
    "latency_s_p95",
    "output_tokens_mean",
    "aux_calls_mean",
    "aux_input_tokens_mean",
    "aux_output_tokens_mean",
    "cost_usd_total",
    "cost_usd_per_cell",
    "calls_mean",
    "total_tokens_mean",
    "prefix_reuse_mean",
    "evidence_retention_mean",
    "name_accuracy_mean",
    "answer_kept_mean",
    "answer_kept_unique_mean",
)


def _usage_stats(rows: pd.DataFrame, keys: list[str], prices: PriceTable | None) -> pd.DataFrame:
    """The row-level statistics the terminal does not show (every repeat is a real prompt,
    call and cost): the largest prompt, utilisation, latencies, output, auxiliary calls,
    cost and prefix reuse."""
    ok = rows["status"] == ADMITTED
    # The strategy (and its auxiliary calls) ran whether or not the prompt then fitted.
    ran = ok | (rows["status"] == VIOLATION)
    data = rows[keys].copy()
    data["tokens"] = rows["counted_tokens"].where(ok)
    data["utilisation"] = rows["utilisation"].where(ok)
    data["model_s"] = rows["model_s"].where(ok)
    data["latency_s"] = (rows["strategy_s"].fillna(0.0) + rows["model_s"]).where(ok)
    data["output_tokens"] = rows["output_tokens"].where(ok)
    data["strategy_s"] = rows["strategy_s"].where(ran)
    data["aux_calls"] = rows["aux_calls"].where(ran)
    data["aux_input_tokens"] = rows["aux_input_tokens"].where(ran)
    data["aux_output_tokens"] = rows["aux_output_tokens"].where(ran)
    # An agent episode's real cost: a violating episode made its earlier calls.
    data["cost"] = row_cost(rows, prices)
    data["prefix_reuse"] = rows["prefix_reuse"].where(ok)
    grouped = data.groupby(keys, sort=True, observed=True)
    table = grouped.agg(
        tokens_max=("tokens", "max"),
        utilisation_mean=("utilisation", "mean"),
        output_tokens_mean=("output_tokens", "mean"),
        aux_calls_mean=("aux_calls", "mean"),
        aux_input_tokens_mean=("aux_input_tokens", "mean"),
        aux_output_tokens_mean=("aux_output_tokens", "mean"),
        cost_usd_total=("cost", lambda c: c.sum(min_count=1)),
        prefix_reuse_mean=("prefix_reuse", "mean"),
    )
    for column in ("strategy_s", "model_s", "latency_s"):
        if column != "model_s":  # its median is summarise's
            table[f"{column}_p50"] = grouped[column].quantile(0.5)
        table[f"{column}_p95"] = grouped[column].quantile(0.95)
    return table.reset_index()


def row_cost(rows: pd.DataFrame, prices: PriceTable | None) -> pd.Series:
    """USD per row: the answered prompt and its completion, plus every auxiliary call.

    A violating prompt was never sent, so it costs only its auxiliary calls; an agent
    episode costs every call it sent (a violating one, the calls before its violation).
    NaN when no price applies, so a report without prices leaves the cost columns empty.
    """
    import pandas as pd

    price_in, price_out = _price_columns(rows, prices)
    ok = rows["status"] == ADMITTED
    episode = rows["calls"].notna()
    sent_in = rows["sum_call_tokens"].where(episode, rows["counted_tokens"].where(ok, 0.0))
    sent_out = rows["output_tokens"].where(episode | ok, 0.0)
    tokens_in = sent_in.fillna(0.0) + rows["aux_input_tokens"].fillna(0.0)
    tokens_out = sent_out.fillna(0.0) + rows["aux_output_tokens"].fillna(0.0)
    return pd.Series(
        (tokens_in * price_in + tokens_out * price_out) / 1e6, index=rows.index, dtype="float64"
    )


def _price_columns(rows: pd.DataFrame, prices: PriceTable | None) -> tuple[Any, Any]:
    if prices is None:
        return math.nan, math.nan
    if isinstance(prices, Prices):
        return prices.input_per_mtok, prices.output_per_mtok
    fallback = prices.get("*")

    def lookup(model: object, attr: str) -> float:
        price = prices.get(str(model), fallback) if model is not None else fallback
        return math.nan if price is None else float(getattr(price, attr))

    models = rows["model"]
    return (
        models.map(lambda m: lookup(m, "input_per_mtok")).astype("float64"),
        models.map(lambda m: lookup(m, "output_per_mtok")).astype("float64"),
    )


# -- paired ---------------------------------------------------------------------------------
PAIRED_SHARES: dict[str, str] = {
    "retention": "evidence_retention",
    "answer_kept": "answer_kept",
}
"""The model-free shares paired against the reference beside quality, by the name of their
paired columns: the row field each is the item mean of (over admitted repeats)."""


def share_columns(name: str) -> tuple[str, ...]:
    """The paired columns of one share (:func:`_share_pair`): the cell's mean, the
    reference's, their change and its interval."""
    return (name, f"ref_{name}", f"{name}_delta", f"{name}_delta_lo", f"{name}_delta_hi")


SHARE_COLUMNS: tuple[str, ...] = tuple(column for name in PAIRED_SHARES
                                       for column in share_columns(name))
"""The paired changes of evidence retention and answer kept, at paired.csv's end: empty
where no item admitted in both has the share on both sides."""

PAIRED_COLUMNS: tuple[str, ...] = (
    "ref_strategy",
    "ref_budget",
    "n_items",
    "n_paired",
    "quality",
    "ref_quality",
    *CHANGE_COLUMNS,
    "excluded_violation",
    "ref_excluded_violation",
    "excluded_other",
    "ref_quality_of_excluded",
    *SHARE_COLUMNS,
)


def paired_table(
    items: pd.DataFrame,
    reference: Reference,
    keys: Sequence[str] = CELL,
    *,
    resamples: int,
    seed: int,
) -> pd.DataFrame:
    """Each cell against its task's reference cell, over the items admitted (and scored)
    in both: the change with its interval, for a 0/1 grader McNemar's flips and p, and the
    smallest drop the cell could detect (:func:`~.stats.paired_changes`). Exclusion counts
    show what the pairing dropped and why, and the reference's quality on the items the
    cell lost to violations shows whether they were easy ones. The change of each share of
    :data:`PAIRED_SHARES` (evidence retention, answer kept) is paired the same way, over the
    items admitted in both with the share on both sides, with a paired-bootstrap interval
    (a share is not a 0/1 score)."""
    import pandas as pd

    keys = list(keys)
    records = []
    samples: list[tuple[np.ndarray, np.ndarray, np.random.Generator]] = []
    share_samples: dict[str, list[tuple[np.ndarray, np.random.Generator]]] = {
        name: [] for name in PAIRED_SHARES}
    for _task, task_items in items.groupby("task", sort=True, observed=True):
        resolved = reference.resolve(task_items)
        if resolved is None:
            continue
        ref_strategy, ref_budget = resolved
        is_ref = (task_items["strategy"] == ref_strategy) & (task_items["budget"] == ref_budget)
        shares = list(PAIRED_SHARES.values())
        ref = task_items.loc[is_ref, ["item_id", "status", "quality", *shares]].rename(
            columns={"status": "ref_status", "quality": "ref_quality",
                     **{field: f"ref_{field}" for field in shares}})
        others = task_items.loc[~is_ref]
        merged = others.merge(ref, on="item_id", how="left")
        for key, group in merged.groupby(keys, sort=True, observed=True):
            values = key_values(key)
            pair, scores, ref_scores = _pair(group)
            record = {**dict(zip(keys, values, strict=True)), "ref_strategy": ref_strategy,
                      "ref_budget": ref_budget, **pair}
            for name, field in PAIRED_SHARES.items():
                means, differences = _share_pair(group, name, field)
                record.update(means)
                share_samples[name].append(
                    (differences, cell_rng(seed, name, ref_strategy, ref_budget, *values)))
            records.append(record)
            samples.append((scores, ref_scores,
                            cell_rng(seed, "paired", ref_strategy, ref_budget, *values)))
    if not records:
        return _empty(PAIRED_COLUMNS, keys)
    # Every cell's change at once: the bootstraps run in parallel (stats.paired_changes).
    for record, change in zip(records, paired_changes(samples, resamples=resamples),
                              strict=True):
        record.update(change.columns())
    # Resampling the per-item differences is the paired bootstrap; no pair, no interval.
    for name, share in share_samples.items():
        for record, (lo, hi) in zip(records, bootstrap_cis(share, resamples=resamples),
                                    strict=True):
            record.update({f"{name}_delta_lo": lo, f"{name}_delta_hi": hi})
    return with_optional_counts(pd.DataFrame.from_records(records), records)[
        [*keys, *PAIRED_COLUMNS]]


OPTIONAL_COUNTS = ("flips_down", "flips_up")
"""Counts that only a 0/1 grader has: empty, not NaN, for any other."""


def with_optional_counts(table: pd.DataFrame, records: Sequence[Mapping[str, Any]]
                         ) -> pd.DataFrame:
    """``table`` with its :data:`OPTIONAL_COUNTS` as integers or None, as ``records`` hold
    them: pandas would make them floats (a CSV's ``3.0``) beside a missing value."""
    import pandas as pd

    for name in OPTIONAL_COUNTS:
        table[name] = pd.Series([record[name] for record in records], index=table.index,
                                dtype=object)
    return table


def _pair(group: pd.DataFrame) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """A cell's paired counts, and the paired scores of the cell and of the reference
    that its change (:func:`~.stats.paired_changes`) is computed from."""
    both = group["quality"].notna() & group["ref_quality"].notna()
    scores = group.loc[both, "quality"].to_numpy(dtype=np.float64)
    ref_scores = group.loc[both, "ref_quality"].to_numpy(dtype=np.float64)
    excluded = group["status"] == VIOLATION
    ref_excluded = group["ref_status"] == VIOLATION
    lost_ref_quality = group.loc[excluded, "ref_quality"]
    return {
        "n_items": len(group),
        "n_paired": int(both.sum()),
        "quality": _mean(group.loc[both, "quality"]),
        "ref_quality": _mean(group.loc[both, "ref_quality"]),
        "excluded_violation": int(excluded.sum()),
        "ref_excluded_violation": int(ref_excluded.sum()),
        # Errors, unscored answers and items missing from the reference run.
        "excluded_other": int((~both & ~excluded & ~ref_excluded).sum()),
        "ref_quality_of_excluded": _mean(lost_ref_quality),
    }, scores, ref_scores


def _share_pair(group: pd.DataFrame, name: str, field: str
                ) -> tuple[dict[str, Any], np.ndarray]:
    """A cell's mean of the share ``field`` (evidence retention, answer kept) and the
    reference's over the items both admitted with the share (an item's is null unless
    admitted and having one), their mean change, named ``name``, and the per-item
    differences its interval is resampled from."""
    both = group[field].notna() & group[f"ref_{field}"].notna()
    kept = group.loc[both, field].to_numpy(dtype=np.float64)
    ref_kept = group.loc[both, f"ref_{field}"].to_numpy(dtype=np.float64)
    differences = kept - ref_kept
    return {
        name: float(kept.mean()) if kept.size else math.nan,
        f"ref_{name}": float(ref_kept.mean()) if ref_kept.size else math.nan,
        f"{name}_delta": float(differences.mean()) if differences.size else math.nan,
    }, differences


def paired_scores(
    current: Mapping[str, float], baseline: Mapping[str, float]
) -> tuple[np.ndarray, np.ndarray]:
    """The scores of the item ids both score, current and baseline, in one order (used
    against a baseline report)."""
    shared = sorted(set(current) & set(baseline))
    return (np.array([current[i] for i in shared], dtype=np.float64),
            np.array([baseline[i] for i in shared], dtype=np.float64))


# -- categories -----------------------------------------------------------------------------
def category_table(
    rows: pd.DataFrame,
    items: pd.DataFrame,
    reference: Reference,
    *,
    resamples: int,
    seed: int,
    prices: PriceTable | None = None,
) -> pd.DataFrame:
    """The summary statistics per category, with the paired deltas of quality and of each
    share (evidence retention, answer kept) against the reference."""
    keys = list(CATEGORY_CELL)
    summary = summary_table(rows, keys, resamples=resamples, seed=seed, prices=prices)
    paired = paired_table(items, reference, keys, resamples=resamples, seed=seed)
    paired = paired[[*keys, "n_paired", "delta", "delta_lo", "delta_hi",
                     *(column for name in PAIRED_SHARES for column in share_columns(name)[2:])]]
    return summary.merge(paired, on=keys, how="left")


# -- helpers --------------------------------------------------------------------------------
def _mean(values: pd.Series) -> float:
    return float(values.mean()) if values.notna().any() else math.nan


def _empty(columns: Sequence[str], keys: Sequence[str]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(columns=[*keys, *(c for c in columns if c not in keys)])
