"""Reports that scale: cells.jsonl streamed into typed columns block by block, only the
fields a report reads, report.json written by the C encoder, bootstraps on every core;
each the same result as the plain way."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_budgetbench.records import jsonl
from pytest_budgetbench.records.jsonl import read_jsonl
from pytest_budgetbench.redact import redact_obj, register_secret
from pytest_budgetbench.reports import build_report, load
from pytest_budgetbench.reports.extensions import ExtraTable
from pytest_budgetbench.reports.plots import Plot
from pytest_budgetbench.reports.report_json import dumps_indented
from pytest_budgetbench.reports.stats import (
    bootstrap_ci,
    bootstrap_cis,
    cell_rng,
    resample_means,
)
from pytest_budgetbench.reports.synthetic import make_row, synthetic_rows, write_run

pd = pytest.importorskip("pandas")


def messy_run(tmp_path: Path) -> Path:
    """Rows with every kind of trouble: a torn line in the middle and at the end, a NaN
    literal (json reads it, strict parsers do not), a line of two values, a resumed cell,
    a string budget, a count for aux_calls, a key beyond the schema."""
    rows = synthetic_rows(items=30, categories=("a", "b"))
    rows[3]["budget"] = "1024"
    rows[4]["aux_calls"] = 2
    rows[5]["extra_note"] = "kept"
    lines = [json.dumps(row) for row in rows]
    lines.insert(40, '{"task": "memory", "item_id": "torn')
    lines.insert(60, json.dumps(make_row(item_id="nan", quality=float("nan"))))
    lines.insert(70, json.dumps(make_row(item_id="x")) + ", " + json.dumps(make_row()))
    lines.append(json.dumps({**rows[0], "quality": 0.0}))  # the cell resumed: this one wins
    run = tmp_path / "run"
    run.mkdir()
    (run / "cells.jsonl").write_text("\n".join(lines) + "\n" + '{"task": "mem', "utf-8")
    return run


@pytest.mark.parametrize("block_bytes", [300, 4096, 1 << 20])
@pytest.mark.parametrize("parser", ["orjson", "json"])
def test_streamed_blocks_give_the_frame_of_the_whole_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int, parser: str
) -> None:
    run = messy_run(tmp_path)
    with monkeypatch.context() as json_only:  # the oracle: one block, json's rows
        json_only.setattr(jsonl, "fast_loads", lambda: None)
        whole = load.frame(list(read_jsonl(run / "cells.jsonl")))
    if parser == "json":
        monkeypatch.setattr(jsonl, "fast_loads", lambda: None)
    elif jsonl.fast_loads() is None:
        pytest.skip("orjson is not installed")
    monkeypatch.setattr(jsonl, "BLOCK_BYTES", block_bytes)
    streamed = load.load([run])
    pd.testing.assert_frame_equal(streamed, whole)
    # The NaN row (json's, not orjson's) and the key beyond the schema are there.
    assert "nan" in set(streamed["item_id"]) and "extra_note" in streamed.columns


def test_a_report_loads_only_the_fields_it_and_its_extensions_read(tmp_path: Path) -> None:
    run = messy_run(tmp_path)
    lean = load.load([run], fields=("strategy_info",))
    assert list(lean.columns) == load.report_columns(("strategy_info",))
    assert "prediction" not in lean.columns and "cell_id" not in lean.columns
    pd.testing.assert_frame_equal(lean, load.load([run])[list(lean.columns)])


class Reads:
    """An extension that records the columns it was given."""

    name = "reads"

    def __init__(self, row_fields: tuple[str, ...] | None) -> None:
        if row_fields is not None:
            self.row_fields = row_fields
        self.seen: list[str] = []

    def tables(self, rows: Any) -> list[ExtraTable]:
        self.seen = list(rows.columns)
        return []

    def plots(self, summary: Any, out_dir: Path) -> list[Plot]:
        return []


@pytest.mark.parametrize(("declared", "gets_prediction"), [(("prediction",), True),
                                                            ((), False), (None, True)])
def test_an_extension_gets_the_fields_it_declares_or_all(
    tmp_path: Path, declared: tuple[str, ...] | None, gets_prediction: bool
) -> None:
    run = write_run(tmp_path / "run", [make_row(item_id=f"i{i}") for i in range(3)])
    extension = Reads(declared)
    build_report([run], tmp_path / "out", plots=False, resamples=10, extensions=[extension])
    assert ("prediction" in extension.seen) is gets_prediction
    assert set(load.REPORT_FIELDS) <= set(extension.seen)


def test_each_distinct_string_is_held_once_per_block(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", synthetic_rows(items=40))
    frame = load.load([run], fields=())
    assert len(frame) == 1000
    assert len({id(value) for value in frame["task"]}) == 1
    assert len({id(value) for value in frame["strategy"]}) == 5


# -- report.json ----------------------------------------------------------------------------
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(),
                     st.floats(allow_nan=False, allow_infinity=False), st.text())
_KEYS = st.one_of(st.text(), st.integers(), st.booleans(), st.none(),
                  st.floats(allow_nan=False, allow_infinity=False))
DOCUMENTS = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.tuples(inner, inner),
                            st.dictionaries(_KEYS, inner, max_size=5)),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(document=DOCUMENTS)
def test_report_json_text_is_jsons_own(document: Any) -> None:
    assert dumps_indented(document) == json.dumps(document, indent=1, ensure_ascii=False,
                                                  allow_nan=False)


def test_report_json_refuses_nan_as_json_does() -> None:
    with pytest.raises(ValueError):
        dumps_indented({"cells": [1.0, math.nan]})


def test_redacting_a_document_redacts_every_repeat_of_a_string() -> None:
    register_secret("s3cr3t-token-for-this-test")
    document = {"ids": ["a", "s3cr3t-token-for-this-test", "a"] * 3, "n": 1}
    redacted = redact_obj(document)
    assert "s3cr3t" not in json.dumps(redacted)
    assert redacted["ids"][0] == "a" and len(redacted["ids"]) == 9


# -- bootstrap ------------------------------------------------------------------------------
def _float_means(values: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The plain bootstrap: one index matrix, a float gather and a mean per row."""
    index = rng.integers(0, values.size, size=(resamples, values.size), dtype=np.int32)
    result: np.ndarray = np.take(values, index).mean(axis=1)
    return result


@pytest.mark.parametrize("values", [
    np.random.default_rng(1).integers(0, 2, size=501).astype(float),  # 0/1 scores
    np.random.default_rng(2).integers(-1, 2, size=333).astype(float),  # paired deltas
    np.random.default_rng(3).random(77),  # F1-like scores
    np.full(5, 100.0),
], ids=["binary", "deltas", "fractions", "constant"])
def test_resampled_means_are_bit_for_bit_the_float_means(
    values: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_budgetbench.reports import stats

    monkeypatch.setattr(stats, "_CHUNK_ENTRIES", values.size * 7)  # several chunks
    ours = resample_means(values, 300, cell_rng(0, "x"))
    assert np.array_equal(ours, _float_means(values, 300, cell_rng(0, "x")))


def test_parallel_intervals_are_the_sequential_ones() -> None:
    samples = [np.random.default_rng(seed).integers(0, 2, size=50 + seed).astype(float)
               for seed in range(6)]
    parallel = bootstrap_cis([(s, cell_rng(0, i)) for i, s in enumerate(samples)],
                             resamples=500)
    sequential = [bootstrap_ci(s, resamples=500, rng=cell_rng(0, i))
                  for i, s in enumerate(samples)]
    assert parallel == sequential
