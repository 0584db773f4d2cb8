"""``budgetbench regrade``: recorded replies graded again, into a new run, never over one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.commands.cli import main
from pytest_budgetbench.records.jsonl import read_jsonl
from pytest_budgetbench.tasks._fixtures import hotpotqa_records, write_json

YES_ID, CHIEF_ID = "5a8b57f25542995d1e6f1371", "5a8c7595554299585d9e36b6"


def _row(cell: str, item: str, prediction: str | None, quality: float | None,
         status: str = "ok", grader: str = "hotpotqa-official-f1/1") -> dict[str, Any]:
    return {"schema": 1, "cell_id": cell, "task": "hotpotqa", "item_id": item,
            "strategy": "truncation", "budget": 2048, "status": status,
            "prediction": prediction, "quality": quality, "extracted": prediction,
            "grader": grader}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    data = write_json(tmp_path / "hotpot_dev_distractor_v1.json", hotpotqa_records())
    run = tmp_path / "out" / "20260101-000000-abcd"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": run.name, "settings": {
        "seed": 0, "tasks": ["hotpotqa"], "budgets": [2048],
        "data_paths": {"hotpotqa": str(data)}}}))
    rows = [
        # The old grader read the first line and credited this hedge; upstream scores 0.
        _row("c1", YES_ID, "Yes\nNo", 1.0),
        _row("c2", CHIEF_ID, "Chief of Protocol", 1.0),
        _row("c3", CHIEF_ID, None, None, status="violation"),
        _row("c4", YES_ID, "yes", 1.0, grader="longmemeval-llm-judge/1"),
    ]
    (run / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_regrade_writes_a_new_run_and_prints_old_vs_new(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["regrade", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "re-graded 2 of 4 rows" in out
    line = next(x for x in out.splitlines() if "truncation@2048" in x)
    assert line.split()[2:7] == ["2", "1.0000", "0.5000", "-0.5000", "1"]
    rows = {r["cell_id"]: r for r in read_jsonl(run_dir / "regraded" / "cells.jsonl")}
    assert rows["c1"]["quality"] == 0.0 and rows["c1"]["grader"] == "hotpotqa-official-f1/2"
    assert rows["c2"]["quality"] == 1.0
    assert rows["c3"]["status"] == "violation" and rows["c3"]["quality"] is None
    assert rows["c4"]["grader"] == "longmemeval-llm-judge/1"  # judged: kept, no model call
    info = json.loads((run_dir / "regraded" / "run.json").read_text())
    assert info["regraded"]["from"] == str(run_dir)
    # The original run is untouched.
    assert next(read_jsonl(run_dir / "cells.jsonl"))["quality"] == 1.0


def test_regrade_never_overwrites(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["regrade", str(run_dir)]) == 0
    capsys.readouterr()
    assert main(["regrade", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "--out" in err and err.count("\n") == 1


def test_regrade_with_a_variant(run_dir: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "variant"
    assert main(["regrade", str(run_dir), "--out", str(out),
                 "--grader", "hotpotqa:first-line"]) == 0
    rows = {r["cell_id"]: r for r in read_jsonl(out / "cells.jsonl")}
    assert rows["c1"]["quality"] == 0.0  # a hedge gains nothing from the variant
    assert rows["c2"]["grader"] == "hotpotqa-official-f1/2+first-line"
    assert main(["regrade", str(run_dir), "--out", str(tmp_path / "x"),
                 "--grader", "hotpotqa:nope"]) == 2
    assert "no grader variant 'nope'" in capsys.readouterr().err


def test_regrade_needs_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["regrade", str(tmp_path)]) == 2
    assert "no cells.jsonl" in capsys.readouterr().err


def _with_golds(run_dir: Path, data: Path, chief_answer: str) -> None:
    """Rows that record their gold (schema 2), and data whose answer for CHIEF_ID is now
    ``chief_answer``."""
    rows = [{**row, "schema": 2, "gold": "yes" if row["item_id"] == YES_ID
             else "Chief of Protocol"} for row in read_jsonl(run_dir / "cells.jsonl")]
    (run_dir / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = [{**r, "answer": chief_answer} if r["_id"] == CHIEF_ID else r
               for r in hotpotqa_records()]
    write_json(data, records)


def test_regrade_refuses_rows_whose_gold_the_data_no_longer_gives(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _with_golds(run_dir, tmp_path / "hotpot_dev_distractor_v1.json", "Consul General")
    assert main(["regrade", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err == (f"budgetbench: error: regrade: task 'hotpotqa' item {CHIEF_ID} was answered "
                   "against gold 'Chief of Protocol', the data now gives 'Consul General': the "
                   "data changed since the run; pass --data TASK=PATH with the run's data, or "
                   "--accept-new-golds to grade against the new golds\n")
    assert not (run_dir / "regraded").exists()


def test_regrade_with_accept_new_golds_grades_against_them_and_says_so(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _with_golds(run_dir, tmp_path / "hotpot_dev_distractor_v1.json", "Consul General")
    assert main(["regrade", str(run_dir), "--accept-new-golds"]) == 0
    assert "1 rows were graded against golds that changed since the run" in \
        capsys.readouterr().out
    rows = {r["cell_id"]: r for r in read_jsonl(run_dir / "regraded" / "cells.jsonl")}
    assert rows["c2"]["gold"] == "Consul General" and rows["c2"]["quality"] == 0.0


def test_regrade_of_rows_whose_gold_the_data_still_gives_goes_on(
    run_dir: Path, tmp_path: Path
) -> None:
    _with_golds(run_dir, tmp_path / "hotpot_dev_distractor_v1.json", "Chief of Protocol")
    assert main(["regrade", str(run_dir)]) == 0


def test_a_row_whose_old_quality_is_not_a_number_is_regraded_and_counted(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Damaged or hand-edited rows: the old quality is "n/a", a list; one row is intact.
    rows = [{**_row("c1", YES_ID, "Yes\nNo", 1.0), "quality": "n/a"},
            _row("c2", CHIEF_ID, "Chief of Protocol", 1.0),
            {**_row("c5", CHIEF_ID, "Chief of Protocol", 1.0), "quality": [1.0]}]
    (run_dir / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["regrade", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert ("2 re-graded rows had no numeric old quality (e.g. row 'c1': \"n/a\"); the old "
            "means leave them out") in out
    # n counts every re-graded row; the old mean is c2's alone, the new mean all three's.
    line = next(x for x in out.splitlines() if "truncation@2048" in x)
    assert line.split()[2:7] == ["3", "1.0000", "0.6667", "-0.3333", "2"]
    regraded = {r["cell_id"]: r["quality"]
                for r in read_jsonl(run_dir / "regraded" / "cells.jsonl")}
    assert regraded == {"c1": 0.0, "c2": 1.0, "c5": 1.0}
