"""The memory-systems report table: construction averaged over the memories built (not the
cells that reused them), query-time cost over every cell, failures over auxiliary calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.reports import build_report
from pytest_budgetbench.reports.synthetic import make_row, write_run

pytest.importorskip("pandas")


def _phase(calls: int, tokens: int, seconds: float, failures: int = 0) -> dict[str, Any]:
    return {"aux_calls": calls, "input_tokens": tokens, "output_tokens": 10 * calls,
            "seconds": seconds, "model_s": 2 * seconds, "aux_failures": failures}


def _info(system: str, *, reused: bool, build_calls: int, query_calls: int) -> dict[str, Any]:
    return {system: {"window": 2048,
                     "construction": {**_phase(build_calls, 1000 * build_calls, 4.0 * build_calls,
                                               failures=1), "reused": reused},
                     "query": _phase(query_calls, 500 * query_calls, 1.5)}}


def _calls(n: int) -> list[dict[str, Any]]:
    return [{"purpose": "memgpt/search", "input_tokens": 100, "output_tokens": 10}] * n


def _rows() -> list[dict[str, Any]]:
    rows = []
    for i in range(3):
        # Item i's memory is built at 2048 (6 construction calls + 1 query call on the row)
        # and reused at 8192 (1 query call only).
        info = _info("memgpt", reused=False, build_calls=6, query_calls=1)
        if i == 0:  # a row written before model_s was recorded
            del info["memgpt"]["construction"]["model_s"]
        rows.append(make_row("memory", f"i{i}", "memgpt", 2048, aux_failures=1,
                             aux_calls=_calls(7), strategy_info=info))
        rows.append(make_row("memory", f"i{i}", "memgpt", 8192, aux_calls=_calls(1),
                             strategy_info=_info("memgpt", reused=True, build_calls=6,
                                                 query_calls=1)))
        rows.append(make_row("memory", f"i{i}", "truncation", 2048))
        rows.append(make_row("memory", f"i{i}", "budgetmem_low", 2048,
                             strategy_info={"budgetmem": {"tiers": {}}}))
    return rows


def test_construction_is_per_built_memory_and_query_per_cell(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", _rows())
    report = build_report([run], tmp_path / "out", plots=False, resamples=100)
    table = report.extra_tables["memory_costs"].table
    assert list(table["strategy"]) == ["memgpt", "memgpt"]  # no truncation, no budgetmem
    built, reused = (table[table["budget"] == b].iloc[0] for b in (2048, 8192))
    assert (built["cells"], built["built"]) == (3, 3)
    assert built["build_aux_calls"] == pytest.approx(6.0)
    assert built["build_tokens"] == pytest.approx(6000 + 60)
    assert built["build_s"] == pytest.approx(24.0)
    assert built["build_model_s"] == pytest.approx(48.0)  # the row without it left out
    assert built["query_aux_calls"] == pytest.approx(1.0)
    assert (built["aux_calls"], built["aux_failures"]) == (21, 3)
    assert built["failure_rate"] == pytest.approx(3 / 21)
    # The 8192 cells built nothing: no construction cost, their own query cost, no failures.
    assert reused["built"] == 0 and pd_isna(reused["build_aux_calls"])
    assert reused["query_tokens"] == pytest.approx(510)
    assert reused["failure_rate"] == pytest.approx(0.0)
    assert (tmp_path / "out" / "memory_costs.csv").is_file()
    document = json.loads((tmp_path / "out" / "report.json").read_text())
    assert len(document["memory_costs"]) == 2
    assert "construction and query-time cost" in (tmp_path / "out" / "report.md").read_text()


def pd_isna(value: Any) -> bool:
    import pandas as pd

    return bool(pd.isna(value))
