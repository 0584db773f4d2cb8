"""Reading, merging and aggregating records into the report tables."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.reports import Prices, ReportError, build_report, load, tables
from pytest_budgetbench.reports.stats import cell_rng, resample_means, wilson_interval
from pytest_budgetbench.reports.synthetic import make_row, write_run
from tests.records.test_records import SCHEMA_1_LINE

pd = pytest.importorskip("pandas")


def build(tmp_path: Path, rows: list[dict[str, Any]], **kwargs: Any) -> Any:
    run = write_run(tmp_path / "run", rows)
    return build_report([run], tmp_path / "out", plots=False, **kwargs)


def cell(table: Any, strategy: str, budget: int, **extra: Any) -> Any:
    mask = (table["strategy"] == strategy) & (table["budget"] == budget)
    for column, value in extra.items():
        mask &= table[column] == value
    selected = table.loc[mask]
    assert len(selected) == 1, selected
    return selected.iloc[0]


# -- reading and merging --------------------------------------------------------------------
def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    rows = [make_row(item_id=f"i{i}") for i in range(3)]
    run = write_run(tmp_path / "run", rows, torn_tail='{"task": "memory", "item_id": "i9", "st')
    frame = load.load([run])
    assert sorted(frame["item_id"]) == ["i0", "i1", "i2"]


def test_torn_line_in_the_middle_after_a_crash_and_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    path = run / "cells.jsonl"
    import json

    path.write_text(json.dumps(make_row(item_id="a")) + "\n" + '{"task": "mem'  # crash
                    + "\n" + json.dumps(make_row(item_id="b")) + "\n")
    assert sorted(load.load([run])["item_id"]) == ["a", "b"]


def test_shards_concatenate_and_the_last_row_of_a_cell_wins(tmp_path: Path) -> None:
    shard_a = write_run(tmp_path / "a", [
        make_row(item_id="i0", quality=0.0),
        make_row(item_id="i1", quality=0.0),
        make_row(item_id="i1", quality=1.0),  # resumed within the run: this one wins
    ])
    shard_b = write_run(tmp_path / "b", [
        make_row(item_id="i2", quality=1.0),
        make_row(item_id="i0", quality=1.0),  # the later run directory wins
    ])
    frame = load.load([shard_a, shard_b]).set_index("item_id")
    assert len(frame) == 3
    assert frame.loc["i0", "quality"] == 1.0
    assert frame.loc["i1", "quality"] == 1.0


def test_a_schema_1_run_loads_into_the_report(tmp_path: Path) -> None:
    # The row file exactly as the schema-1 runner wrote it (see tests/records/test_records.py).
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "cells.jsonl").write_text(SCHEMA_1_LINE, encoding="utf-8")
    rows = load.load([tmp_path / "run"])
    (row,) = rows.to_dict(orient="records")
    assert (row["task"], row["strategy"], row["budget"], row["status"]) == ("memory", "rag",
                                                                           2048, "ok")
    assert (row["counted_tokens"], row["quality"], row["aux_calls"]) == (1911.0, 1.0, 1.0)
    assert row["category"] == "multi-hop" and row["strategy_info"] == {"chunks": 7}
    report = build_report([tmp_path / "run"], tmp_path / "out", plots=False, resamples=20)
    assert cell(report.summary, "rag", 2048)["quality_mean"] == 1.0


def test_repeats_are_distinct_cells(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [make_row(repeat=r) for r in range(3)])
    assert len(load.load([run])) == 3


def test_missing_run_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ReportError):
        load.load([tmp_path / "nope"])


def test_empty_run_builds_an_empty_report(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    report = build_report([tmp_path / "run"], tmp_path / "out")
    assert report.summary.empty and report.paired.empty
    assert (tmp_path / "out" / "report.html").is_file()


def test_aux_calls_list_is_counted(tmp_path: Path) -> None:
    calls = [{"purpose": "summary", "input_tokens": 10, "output_tokens": 2, "latency_s": 0.1}]
    report = build(tmp_path, [make_row(item_id="i0", aux_calls=calls * 2),
                              make_row(item_id="i1", aux_calls=[])])
    assert report.summary.iloc[0]["aux_calls_mean"] == 1.0


# -- summary --------------------------------------------------------------------------------
def test_summary_counts_rates_and_wilson(tmp_path: Path) -> None:
    rows = [make_row(item_id=f"i{i}", quality=float(i < 6)) for i in range(8)]
    rows += [make_row(item_id="v0", status="violation"), make_row(item_id="v1", status="violation")]
    rows += [make_row(item_id="e0", status="error")]
    row = build(tmp_path, rows).summary.iloc[0]
    assert (row["n_items"], row["n_admitted"], row["n_scored"]) == (11, 8, 8)
    assert (row["n_ok"], row["n_violation"], row["n_error"]) == (8, 2, 1)
    assert row["violation_rate"] == pytest.approx(2 / 10)  # errors are not in the denominator
    assert row["quality_mean"] == pytest.approx(6 / 8)
    assert bool(row["binary"])
    assert (row["wilson_lo"], row["wilson_hi"]) == pytest.approx(wilson_interval(6, 8))
    assert row["quality_lo"] <= row["quality_mean"] <= row["quality_hi"]


def test_summary_interval_is_the_shared_seeded_bootstrap(tmp_path: Path) -> None:
    qualities = [0.1, 0.4, 0.5, 0.9, 0.7, 0.2]
    rows = [make_row(item_id=f"i{i}", quality=q) for i, q in enumerate(qualities)]
    row = build(tmp_path, rows, seed=7, resamples=3000).summary.iloc[0]
    means = resample_means(np.array(qualities), 3000,
                           cell_rng(7, "quality", "memory", "truncation", 1000))
    assert row["quality_lo"] == pytest.approx(np.percentile(means, 2.5))
    assert row["quality_hi"] == pytest.approx(np.percentile(means, 97.5))
    assert not bool(row["binary"]) and math.isnan(row["wilson_lo"])


def test_tokens_and_latency_cover_admitted_prompts(tmp_path: Path) -> None:
    rows = [make_row(item_id=f"i{i}", counted_tokens=100 * (i + 1), model_s=float(i + 1))
            for i in range(4)]
    rows.append(make_row(item_id="v", status="violation", counted_tokens=5000))
    row = build(tmp_path, rows).summary.iloc[0]
    assert row["tokens_mean"] == pytest.approx(250.0)
    assert row["tokens_max"] == 400
    assert row["model_s_p50"] == pytest.approx(2.5)
    assert row["model_s_p95"] == pytest.approx(np.percentile([1, 2, 3, 4], 95))


def test_repeats_are_averaged_per_item_before_the_interval(tmp_path: Path) -> None:
    rows = [make_row(item_id="a", repeat=r, quality=1.0) for r in range(4)]
    rows += [make_row(item_id="b", repeat=0, quality=0.0)]
    report = build(tmp_path, rows)
    row = report.summary.iloc[0]
    # Per item: a -> 1.0, b -> 0.0, so the mean is 0.5 (not 4/5 over rows) on 2 items.
    assert row["quality_mean"] == pytest.approx(0.5)
    assert (row["n_items"], row["n_scored"], row["n_cells"]) == (2, 2, 5)
    items = report.items.set_index("item_id")
    assert items.loc["a", "n_repeats"] == 4


def test_mixed_repeats_are_not_binary(tmp_path: Path) -> None:
    rows = [make_row(item_id="a", repeat=0, quality=1.0),
            make_row(item_id="a", repeat=1, quality=0.0),
            make_row(item_id="b", quality=1.0)]
    row = build(tmp_path, rows).summary.iloc[0]
    assert row["quality_mean"] == pytest.approx(0.75)
    assert not bool(row["binary"])


def test_an_item_admitted_in_one_repeat_is_admitted(tmp_path: Path) -> None:
    rows = [make_row(item_id="a", repeat=0, status="violation"),
            make_row(item_id="a", repeat=1, quality=1.0)]
    report = build(tmp_path, rows)
    row = report.summary.iloc[0]
    assert row["n_admitted"] == 1
    assert row["violation_rate"] == pytest.approx(0.5)  # over prompts, repeats included


def test_cost_only_with_prices(tmp_path: Path) -> None:
    rows = [make_row(counted_tokens=1000, output_tokens=100, aux_input_tokens=500,
                     aux_output_tokens=50),
            make_row(item_id="v", status="violation", aux_input_tokens=200, aux_output_tokens=0)]
    priced = build(tmp_path, rows, prices=Prices(1.0, 2.0)).summary.iloc[0]
    expected = ((1000 + 500) * 1.0 + (100 + 50) * 2.0 + 200 * 1.0) / 1e6
    assert priced["cost_usd_total"] == pytest.approx(expected)
    assert priced["cost_usd_per_cell"] == pytest.approx(expected / 2)
    unpriced = build(tmp_path / "x", rows).summary.iloc[0]
    assert math.isnan(unpriced["cost_usd_total"])
    csv = pd.read_csv(tmp_path / "x" / "out" / "summary.csv")
    assert csv["cost_usd_total"].isna().all()


def test_prices_by_model(tmp_path: Path) -> None:
    rows = [make_row(counted_tokens=1_000_000, output_tokens=0, model="big"),
            make_row(item_id="i1", counted_tokens=1_000_000, output_tokens=0, model="small")]
    table = {"big": Prices(10.0, 0.0), "*": Prices(1.0, 0.0)}
    row = build(tmp_path, rows, prices=table).summary.iloc[0]
    assert row["cost_usd_total"] == pytest.approx(11.0)


# -- paired ---------------------------------------------------------------------------------
def paired_rows(n: int = 20) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        ref_quality = float(i % 2)
        rows.append(make_row(item_id=f"i{i}", strategy="full_context", budget=4000,
                             reference=True, quality=ref_quality))
        rows.append(make_row(item_id=f"i{i}", strategy="trunc", budget=500,
                             quality=ref_quality - 0.25 if ref_quality else 0.0))
    return rows


def test_paired_delta_known_answer(tmp_path: Path) -> None:
    row = cell(build(tmp_path, paired_rows()).paired, "trunc", 500)
    # Ten items lose 0.25 and ten lose nothing, so the mean change is -0.125.
    assert row["delta"] == pytest.approx(-0.125)
    assert row["n_paired"] == 20
    assert (row["ref_strategy"], row["ref_budget"]) == ("full_context", 4000)
    assert -0.25 <= row["delta_lo"] < -0.125 < row["delta_hi"] <= 0.0


def test_constant_paired_delta_has_a_degenerate_interval(tmp_path: Path) -> None:
    rows = []
    for i in range(15):
        rows.append(make_row(item_id=f"i{i}", strategy="full_context", budget=4000,
                             reference=True, quality=0.8))
        rows.append(make_row(item_id=f"i{i}", strategy="trunc", budget=500, quality=0.5))
    row = cell(build(tmp_path, rows).paired, "trunc", 500)
    assert (row["delta"], row["delta_lo"], row["delta_hi"]) == pytest.approx((-0.3,) * 3)


def test_paired_csv_carries_mcnemar_flips_and_the_detectable_drop_of_a_binary_grader(
    tmp_path: Path,
) -> None:
    rows = []
    for i in range(40):
        rows.append(make_row(item_id=f"i{i}", strategy="full_context", budget=4000,
                             reference=True, quality=float(i < 30)))
        # Six items right in the reference are wrong here, one wrong one is right.
        rows.append(make_row(item_id=f"i{i}", strategy="trunc", budget=500,
                             quality=float(i < 30) if i not in (0, 1, 2, 3, 4, 5, 39)
                             else float(i == 39)))
        rows.append(make_row(item_id=f"i{i}", strategy="partial", budget=500,
                             quality=0.5 if i % 2 else 1.0))
    report = build(tmp_path, rows)
    row = cell(report.paired, "trunc", 500)
    assert (row["ci_method"], row["flips_down"], row["flips_up"]) == ("tango", 6, 1)
    assert row["mcnemar_p"] == pytest.approx(16 / 128)  # 2 x P(Bin(7, 1/2) <= 1)
    assert 0 < row["mde"] < 1
    partial = cell(report.paired, "partial", 500)
    assert partial["ci_method"] == "bootstrap" and partial["flips_down"] is None
    csv = (report.out_dir / "paired.csv").read_text().splitlines()
    header = csv[0].split(",")
    for line in csv[1:]:
        values = dict(zip(header, line.split(","), strict=True))
        if values["strategy"] == "trunc":
            assert (values["flips_down"], values["flips_up"]) == ("6", "1")  # not 6.0
        else:
            assert values["flips_down"] == values["flips_up"] == values["mcnemar_p"] == ""
            assert float(values["mde"]) > 0
    html = (report.out_dir / "report.html").read_text()
    assert "MDE (80% power)" in html and "6 / 1 (p=0.125)" in html


def test_selection_effect_counts(tmp_path: Path) -> None:
    rows = []
    for i in range(10):
        ref_status = "violation" if i == 9 else "ok"
        rows.append(make_row(item_id=f"i{i}", strategy="full_context", budget=4000,
                             reference=True, status=ref_status, quality=1.0 if i < 3 else 0.0))
        status = "violation" if i < 3 else ("error" if i == 8 else "ok")
        rows.append(make_row(item_id=f"i{i}", strategy="trunc", budget=500, status=status,
                             quality=0.0))
    row = cell(build(tmp_path, rows).paired, "trunc", 500)
    assert row["excluded_violation"] == 3  # i0-i2, lost by the cell
    assert row["ref_excluded_violation"] == 1  # i9, lost by the reference
    assert row["excluded_other"] == 1  # i8 errored
    assert row["n_paired"] == 5
    # The items the cell lost were the ones the reference answered: a selection effect.
    assert row["ref_quality_of_excluded"] == pytest.approx(1.0)
    assert row["ref_quality"] == pytest.approx(0.0)


def test_reference_option_and_default(tmp_path: Path) -> None:
    rows = paired_rows(6) + [
        make_row(item_id=f"i{i}", strategy="full_context", budget=1000, reference=True)
        for i in range(6)
    ]
    default = build(tmp_path / "d", rows).paired
    assert set(default["ref_budget"]) == {4000}
    assert len(default) == 2  # trunc@500 and full_context@1000, not the reference itself
    chosen = build(tmp_path / "c", rows, reference="trunc@500").paired
    assert set(chosen["ref_strategy"]) == {"trunc"}
    bare = build(tmp_path / "b", rows, reference="full_context").paired
    assert set(bare["ref_budget"]) == {4000}


def test_flagged_reference_is_used_when_full_context_is_absent(tmp_path: Path) -> None:
    rows = [make_row(item_id="a", strategy="oracle", budget=800, reference=True),
            make_row(item_id="a", strategy="trunc", budget=100)]
    paired = build(tmp_path, rows).paired
    assert paired.iloc[0]["ref_strategy"] == "oracle"


def test_bad_reference_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="names no strategy in these records"):
        build(tmp_path, paired_rows(2), reference="full_context@big")
    with pytest.raises(ConfigError, match="names no strategy"):
        tables.Reference.parse("@2048")


def test_resamples_below_one_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="resamples must be at least 1, got 0"):
        build(tmp_path, paired_rows(2), resamples=0)


def test_reference_parse() -> None:
    assert tables.Reference.parse("a@b@12") == tables.Reference("a@b", 12)
    assert tables.Reference.parse("budgetmem@0.1") == tables.Reference("budgetmem@0.1", None)
    assert tables.Reference.parse(None) == tables.Reference()


# -- categories -----------------------------------------------------------------------------
def test_categories_split_the_statistics(tmp_path: Path) -> None:
    rows = []
    for i in range(8):
        category = "easy" if i < 4 else "hard"
        rows.append(make_row(item_id=f"i{i}", strategy="full_context", budget=4000,
                             reference=True, category=category, quality=1.0))
        rows.append(make_row(item_id=f"i{i}", strategy="trunc", budget=500, category=category,
                             quality=1.0 if category == "easy" else 0.0))
    rows.append(make_row(item_id="x", strategy="trunc", budget=500, quality=1.0))  # no category
    categories = build(tmp_path, rows).categories
    easy = cell(categories, "trunc", 500, category="easy")
    hard = cell(categories, "trunc", 500, category="hard")
    assert (easy["quality_mean"], easy["delta"]) == (1.0, 0.0)
    assert (hard["quality_mean"], hard["delta"]) == (0.0, -1.0)
    assert hard["n_items"] == 4
    assert cell(categories, "trunc", 500, category=load.NO_CATEGORY)["n_items"] == 1
