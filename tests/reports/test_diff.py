"""``budgetbench diff RUN_A RUN_B``: paired per-item changes, flips, the markdown summary,
diff.html, and the exit status."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.commands.cli import main
from pytest_budgetbench.reports.diff import diff_runs
from pytest_budgetbench.reports.synthetic import synthetic_rows, write_prompts, write_run
from tests.engine.test_sweep_resilience import runs_in, sweep
from tests.fake_openai import FakeOpenAI

pytest.importorskip("pandas")

STRATEGIES = ("full_context", "truncation", "rag")
BUDGETS = (512, 4096)


def run_pair(tmp_path: Path, change: str = "rag") -> tuple[Path, Path]:
    """Two runs of the same cells; in B, ``change`` loses every item A scored and takes
    100 more tokens (the other strategies are the same rows)."""
    rows = synthetic_rows(items=40, strategies=STRATEGIES, budgets=BUDGETS)
    changed: list[dict[str, Any]] = []
    for row in rows:
        if row["strategy"] == change and row["status"] == "ok":
            row = {**row, "quality": 0.0, "counted_tokens": row["counted_tokens"] + 100}
        changed.append(row)
    a, b = write_run(tmp_path / "a", rows), write_run(tmp_path / "b", changed)
    write_prompts(a, rows)
    write_prompts(b, changed)
    return a, b


def test_paired_changes_intervals_and_flips(tmp_path: Path) -> None:
    a, b = run_pair(tmp_path)
    result = diff_runs(a, b, resamples=300)
    table = result.table.set_index(["strategy", "budget"])
    same = table.loc[("truncation", 4096)]
    # No item flipped, yet 40 items cannot rule out a change of 0.05: the score interval
    # of a 0/1 grader says so, where the bootstrap's resamples of zeros said [0, 0].
    assert same["delta"] == 0.0 and same["ci_method"] == "tango"
    assert same["delta_lo"] == pytest.approx(-same["delta_hi"]) == pytest.approx(-0.0876, abs=1e-4)
    assert (same["flips_down"], same["flips_up"], same["mcnemar_p"]) == (0, 0, 1.0)
    assert same["status_changed"] == 0 and same["worse"] == 0
    rag = table.loc[("rag", 4096)]
    assert rag["quality_b"] == 0.0 and rag["delta"] == -rag["quality_a"] < 0
    assert rag["delta_lo"] <= rag["delta"] <= rag["delta_hi"] < 0
    assert (rag["flips_down"], rag["flips_up"]) == (rag["worse"], 0)
    assert rag["mcnemar_p"] == pytest.approx(2 * 0.5 ** rag["worse"])
    assert 0 < rag["mde"] < 1
    assert rag["tokens_delta"] == rag["tokens_lo"] == rag["tokens_hi"] == 100.0
    assert rag["worse"] == rag["quality_a"] * rag["n_paired"]
    assert {f["strategy"] for f in result.flips} == {"rag"}
    assert all(f["quality_a"] == 1.0 and f["quality_b"] == 0.0 for f in result.flips)


def test_diff_prints_markdown_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    a, b = run_pair(tmp_path)
    assert main(["diff", str(a), str(b), "--format=md", "--resamples=200"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## budgetbench diff")
    assert "| memory | rag | 4096 |" in out and "| memory | truncation | 512 |" in out
    assert "### Flipped items (" in out and "### Regressions" not in out


@pytest.mark.parametrize(("tolerance", "status"), [("0.05", 1), ("1.5", 0)])
def test_fail_on_regression_harm_shown_judges_the_upper_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tolerance: str, status: int
) -> None:
    a, b = run_pair(tmp_path)
    code = main(["diff", str(a), str(b), "--format=md", "--resamples=200",
                 f"--fail-on-regression={tolerance}", "--regression-test=harm"])
    assert code == status
    captured = capsys.readouterr()
    failed = [line for line in captured.err.splitlines() if "regression:" in line]
    if status:
        assert "### Regressions" in captured.out
        assert all(line.startswith("budgetbench: regression: memory: rag@") for line in failed)
        assert failed[-1].startswith("budgetbench: regression: memory: rag@4096: harm-shown "
                                     "test failed: quality fell by")
        # The unchanged cells pass, but 40 items cannot detect a drop of 0.05: it says so.
        assert "### Gate warnings" in captured.out
        assert ("budgetbench: warning: memory: truncation@4096: harm-shown test passed but "
                "cannot detect a drop of 0.05 with n=") in captured.err
    else:
        assert captured.err == ""


def test_a_run_diffed_with_itself_passes_a_margin_its_size_can_exclude(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, _b = run_pair(tmp_path)
    # Unchanged 0/1 items exclude a drop of 0.1 from 35 items on, of 0.05 from 73.
    assert main(["diff", str(a), str(a), "--fail-on-regression=0.1", "--resamples=100"]) == 0
    assert main(["diff", str(a), str(a), "--fail-on-regression=0.05", "--resamples=100"]) == 1
    line = capsys.readouterr().err.splitlines()[-1]
    assert "non-inferiority test failed: the lower bound -0." in line
    assert "even with no flip it takes 73 items" in line
    assert main(["diff", str(a), str(a), "--fail-on-regression=0", "--resamples=100",
                 "--regression-test=harm"]) == 0


def test_a_non_inferiority_margin_of_zero_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, _b = run_pair(tmp_path)
    assert main(["diff", str(a), str(a), "--fail-on-regression=0"]) == 2
    assert capsys.readouterr().err.startswith(
        "budgetbench: error: --fail-on-regression=0 under the non-inferiority test can never "
        "pass")


def test_out_writes_markdown_json_and_a_page_with_the_viewer(tmp_path: Path) -> None:
    a, b = run_pair(tmp_path)
    assert main(["diff", str(a), str(b), "--out", str(tmp_path / "d"), "--format=json",
                 "--resamples=100"]) == 0
    document = json.loads((tmp_path / "d" / "diff.json").read_text())
    assert document["schema"] == "budgetbench-diff" and len(document["cells"]) == 6
    page = (tmp_path / "d" / "diff.html").read_text()
    assert 'id="bb-data"' in page and 'href="#cell=1"' in page  # B's cell, judged against A
    data = page.split('id="bb-data">', 1)[1].split("</script>", 1)[0]
    viewer = json.loads(data)
    assert [c["side"] for c in viewer["cells"][:2]] == ["A", "B"]
    assert viewer["cells"][1]["ref"] == 0
    assert (tmp_path / "d" / "diff.md").read_text().startswith("## budgetbench diff")


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    a, _b = run_pair(tmp_path)
    assert main(["diff", str(a), str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err == f"budgetbench: error: run directory not found: {tmp_path / 'missing'}\n"
    other = write_run(tmp_path / "other", synthetic_rows(items=3, tasks=("qa",)))
    assert main(["diff", str(a), str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "have no cell (task, strategy@budget) in common" in err
    assert "qa: full_context@256" in err


# -- only the same items pair ---------------------------------------------------------------
def _define(run: Path, **settings: Any) -> None:
    """A run.json whose definition holds these settings (and one memory item)."""
    block = {"version": 1, "settings": {"model": "m", "seed": 0, **settings},
             "tasks": {"memory": {"options": {"history_tokens": 2000}, "items": {"0000": "ab"}}}}
    (run / "run.json").write_text(json.dumps({"run_id": run.name, "definition": block}))


def test_runs_of_another_seed_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_a, run_b = run_pair(tmp_path)
    _define(run_a, seed=0)
    _define(run_b, seed=1)
    assert main(["diff", str(run_a), str(run_b), "--resamples=50"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert (f"{run_a} and {run_b} hold different items: --budgetbench-seed 0 in A, 1 in B; "
            "diff two runs of the same items") in err


def test_runs_whose_items_differ_in_data_or_options_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_a, run_b = run_pair(tmp_path)
    _define(run_a)
    _define(run_b)
    info = json.loads((run_b / "run.json").read_text())
    info["definition"]["tasks"]["memory"]["options"]["history_tokens"] = 4000
    (run_b / "run.json").write_text(json.dumps(info))
    assert main(["diff", str(run_a), str(run_b), "--resamples=50"]) == 2
    assert "task 'memory' option history_tokens 2000 in A, 4000 in B" in capsys.readouterr().err


def test_another_model_is_what_a_diff_compares(tmp_path: Path) -> None:
    run_a, run_b = run_pair(tmp_path)
    _define(run_a, model="small", max_tokens=32)
    _define(run_b, model="large", max_tokens=64)
    assert main(["diff", str(run_a), str(run_b), "--resamples=50"]) == 0


def test_rows_of_one_item_id_with_other_golds_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = synthetic_rows(items=3, strategies=("truncation",), budgets=(512,))
    a = write_run(tmp_path / "a", [{**r, "gold": f"gold of {r['item_id']}"} for r in rows])
    b = write_run(tmp_path / "b", [
        {**r, "gold": "Porto" if r["item_id"] == rows[0]["item_id"] else f"gold of {r['item_id']}"}
        for r in rows])
    assert main(["diff", str(a), str(b), "--resamples=50"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert (f"hold different items under the same ids: task 'memory' item "
            f"{rows[0]['item_id']} has gold 'gold of {rows[0]['item_id']}' in A, 'Porto' in B"
            in err)


def test_diff_of_runs_with_other_seeds_is_refused_and_of_other_models_is_not(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sweep(pytester, fake_endpoint, tmp_path)
    sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-seed=1")
    sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-model=other-model")
    seed_0, seed_1, other_model = runs_in(tmp_path)
    capsys.readouterr()
    assert main(["diff", str(seed_0), str(seed_1), "--resamples=50"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"budgetbench: error: {seed_0} and {seed_1} hold different items: "
                          "--budgetbench-seed 0 in A, 1 in B (and ")
    assert err.endswith("; diff two runs of the same items (the same tasks, seed, data and "
                        "task options), e.g. one sweep with another model or strategy\n")
    assert main(["diff", str(seed_0), str(other_model), "--resamples=50"]) == 0


def test_fail_on_regression_uses_the_regression_gates_rule() -> None:
    import pandas as pd

    from pytest_budgetbench.reports.diff import RunDiff
    from pytest_budgetbench.reports.gates.verdicts import quality_regressed

    # Mean fell by 0.3, more than 0.1, and the interval excludes zero: the plugin's gate
    # fails it, so diff must too (it judged only the upper bound against -0.1 before).
    table = pd.DataFrame([{"task": "t", "strategy": "s", "budget": 1, "delta": -0.3,
                           "delta_lo": -0.5, "delta_hi": -0.05, "n_paired": 10,
                           "ci_method": "bootstrap", "flips_down": None, "flips_up": None,
                           "mcnemar_p": None, "mde": 0.2}])
    result = RunDiff(Path("a"), Path("b"), table, [], resamples=10, seed=0)
    assert quality_regressed(-0.3, -0.05, 0.1)
    (line,) = result.regressions(0.1, "harm")
    assert line.startswith("t: s@1: harm-shown test failed: quality fell by 0.300")
    assert result.regressions(0.5, "harm") == []
    # Non-inferiority: a lower bound of -0.5 excludes neither drop.
    assert len(result.regressions(0.1)) == len(result.regressions(0.5)) == 1
    assert result.regressions(0.6) == []
