"""A budget search (``--budgets=search:LO..HI``) through the plugin: each strategy's
smallest safe budget on the default task, model-free, as a brute-force sweep of every grid
budget finds it; its table, file and gate; bad input refused before any cell."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.records.store import RunStore

pytest_plugins = ["pytester"]

FLOORS = ["--budgetbench-min-retention=0.9", "--budgetbench-max-violation-rate=0.05"]
GRID = list(range(512, 4097, 64))


def args(out: Path, *extra: str) -> list[str]:
    return ["--budgetbench-tokenizer=approx", "--budgetbench-items=2",
            "--budgetbench-report=off", f"--budgetbench-out={out}", "-p", "no:cacheprovider",
            *extra]


def run_of(out: Path) -> RunStore:
    (cells,) = out.glob("*/cells.jsonl")
    return RunStore(cells.parent)


def brute_force_answers(rows: list[dict[str, Any]]) -> dict[str, int | None]:
    """Each strategy's smallest grid budget at which, and at every grid budget above
    which, violations / (admitted + over budget) <= 0.05 and the mean evidence retention
    of the admitted items that declare it >= 0.9; computed here from the rows alone."""
    by_cell: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_cell[(row["strategy"], row["budget"])].append(row)
    answers: dict[str, int | None] = {}
    for strategy in sorted({strategy for strategy, _budget in by_cell}):
        answer = None
        for budget in reversed(GRID):
            mine = by_cell[(strategy, budget)]
            over = sum(r["status"] == "violation" for r in mine)
            kept = [r["evidence_retention"] for r in mine
                    if r["status"] == "ok" and r["evidence_retention"] is not None]
            if over / len(mine) > 0.05 or not kept or sum(kept) / len(kept) < 0.9:
                break
            answer = budget
        answers[strategy] = answer
    return answers


def test_the_search_finds_each_default_strategys_safe_budget_as_a_sweep_every_64_tokens(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    brute = pytester.runpytest(*args(tmp_path / "brute", "--budgetbench-model=none",
                                     f"--budgets={','.join(map(str, GRID))}"))
    assert brute.ret == pytest.ExitCode.OK, brute.stdout.str()
    swept = run_of(tmp_path / "brute").rows()
    assert len(swept) == len(GRID) * 3 * 2
    expected = brute_force_answers(swept)
    assert set(expected) == {"full_context", "truncation", "rag"}
    assert None not in expected.values() and len(set(expected.values())) == 3

    result = pytester.runpytest(*args(tmp_path / "search", "--budgets=search:512..4096",
                                      *FLOORS))
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    store = run_of(tmp_path / "search")
    found = {record["strategy"]: record for record in store.safe_budgets()}
    assert {name: record["safe_budget"] for name, record in found.items()} == expected
    rows = store.rows()
    assert {row["model"] for row in rows} == {"none"}  # model-free unless a model is named
    assert len(rows) < len(swept) / 4  # the point: far fewer probes than the grid
    for name, record in found.items():
        assert record["scanned"] is None
        probed = {p["budget"] for p in record["probes"]}
        assert {row["budget"] for row in rows if row["strategy"] == name} == probed
        safe, below = record["safe_budget"], record["below"]
        assert safe is not None and below in (None, safe - 64)
        assert below is None or below in probed
    truncation = found["truncation"]
    result.stdout.fnmatch_lines([
        "smallest safe budget, search:512..4096 step 64 (floors: retention >= 0.900 and "
        "violation rate <= 5.0%, at it and every budget above it):",
        "task memory:",
        "  strategy       safe retention viol.rate probes  below  why the budget below fails",
        "  ---*",  # the smallest safe budget first
        f"  rag             {expected['rag']:>3} *  {expected['rag']} is the smallest budget "
        "searched",
        f"  truncation     {truncation['safe_budget']:>4}     1.000      0.0%     "
        f"{len(truncation['probes']):>2}   {truncation['below']}  evidence retention * over 2 "
        "admitted items is below the floor 0.900",
        "  full_context   * violation rate *% (*/2 prompts) exceeds the maximum 5.0%"])


def test_the_gate_fails_a_strategy_whose_safe_budget_is_above_its_maximum(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """A bare maximum gates every non-reference strategy (truncation needs more than
    2048); a reference is gated when named (full_context fits within 4096)."""
    junit = tmp_path / "junit.xml"
    result = pytester.runpytest(*args(
        tmp_path, "--budgets=search:512..4096", *FLOORS, "-v", f"--junitxml={junit}",
        "--budgetbench-strategies=full_context,truncation",
        "--budgetbench-max-safe-budget=2048,full_context=4096"))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "budgetbench::search[[]memory full_context[]] PASSED*",
        "budgetbench::search[[]memory truncation[]] FAILED*"])
    result.stdout.fnmatch_lines([
        "budgetbench gate failed: memory: truncation: safe budget 2* is above the maximum "
        "2048 (at 2*: evidence retention 0.* over 2 admitted items is below the floor 0.900)",
        "*1 failed, 1 passed*"])
    records = {r["strategy"]: r for r in run_of(tmp_path).safe_budgets()}
    assert records["truncation"]["max_safe_budget"] == 2048
    assert records["full_context"]["max_safe_budget"] == 4096
    assert records["full_context"]["gate"] is None
    assert junit_records(junit)["truncation"] == records["truncation"]  # CI reads it there


def junit_records(junit: Path) -> dict[str, dict[str, Any]]:
    """Each search test case's record, from its property in a JUnit XML file."""
    from xml.etree import ElementTree

    from pytest_budgetbench.pytest_face.sweep_tests import SAFE_BUDGET_PROPERTY

    records = [json.loads(prop.get("value", ""))
               for case in ElementTree.parse(junit).iter("testcase")
               for prop in case.iter("property") if prop.get("name") == SAFE_BUDGET_PROPERTY]
    return {record["strategy"]: record for record in records}


@pytest.mark.parametrize(("extra", "expected"), [
    (["--budgets=search:4096..512"],
     "ERROR: --budgets=search:4096..512: LO 4096 is above HI 512; give the smallest budget "
     "first, e.g. --budgets=search:512..4096"),
    (["--budgets=search:512..4096", "--budgetbench-search-step=0"],
     "ERROR: --budgetbench-search-step must be a positive integer (got '0')"),
    (["--budgets=search:512..4096", "--budgetbench-search-step=-64"],
     "ERROR: --budgetbench-search-step must be a positive integer (got '-64')"),
    (["--budgets=search:512..4000"],
     "ERROR: --budgets=search:512..4000 with --budgetbench-search-step=64: HI - LO = 3488 is "
     "not a multiple of the step, *"),
    (["--budgets=search:512..4096", "--budgetbench-min-retention=0.9,rag@1024=0.5"],
     "ERROR: --budgets=search:512..4096: --budgetbench-min-retention=rag@1024=... names one "
     "budget, and a search tries many; *"),
    (["--budgets=search:512..4096", "--budgetbench-min-answer-kept=0.9,rag@1024=0.5"],
     "ERROR: --budgets=search:512..4096: --budgetbench-min-answer-kept=rag@1024=... names "
     "one budget, and a search tries many; *"),
    (["--budgets=2048", "--budgetbench-max-safe-budget=2048"],
     "ERROR: --budgetbench-max-safe-budget gates the smallest safe budget a search finds: "
     "pass --budgets=search:LO..HI with it, *"),
    (["--budgets=search:512..4096", "--budgetbench-max-safe-budget=rga=2048"],
     "ERROR: budgetbench: --budgetbench-max-safe-budget: 'rga' is not a strategy of this "
     "search (it runs full_context, truncation, rag); name one it runs"),
])
def test_bad_input_is_one_line_before_any_cell(
    pytester: pytest.Pytester, tmp_path: Path, extra: list[str], expected: str
) -> None:
    floors = [] if any("min-retention" in a or "min-answer-kept" in a for a in extra) else FLOORS
    result = pytester.runpytest(*args(tmp_path, *floors, *extra))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])
    assert len([line for line in result.stderr.lines if line.strip()]) == 1
    assert not list(tmp_path.glob("*/cells.jsonl"))


def test_a_search_without_a_floor_is_refused(pytester: pytest.Pytester, tmp_path: Path
                                             ) -> None:
    result = pytester.runpytest(*args(tmp_path, "--budgets=search:512..4096"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: --budgets=search:512..4096 searches for the smallest budget that meets your "
        "floors, and none is given: pass --budgetbench-min-retention=R, "
        "--budgetbench-min-answer-kept=R and/or --budgetbench-max-violation-rate=R, e.g. 0.9 "
        "and 0.05"])
