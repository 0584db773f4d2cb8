"""`budgetbench report`: files written, options, gate exit codes."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.commands.cli import (
    EXIT_GATE_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    build_parser,
    main,
)
from pytest_budgetbench.reports.synthetic import make_row, write_run

pytest.importorskip("pandas")


def rows(violations: int = 0, quality: float = 1.0, run_id: str = "r") -> list[dict[str, Any]]:
    out = []
    for i in range(20):
        out.append(make_row(item_id=f"i{i}", strategy="full_context", budget=2000,
                            reference=True, run_id=run_id))
        out.append(make_row(item_id=f"i{i}", strategy="trunc", budget=500, run_id=run_id,
                            status="violation" if i < violations else "ok", quality=quality))
    return out


def run(args: list[str]) -> int:
    return main(["report", "--no-plots", "--resamples", "300", *args])


def test_report_writes_everything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = write_run(tmp_path / "run", rows())
    assert run([str(run_dir)]) == EXIT_OK
    for name in ("summary.csv", "paired.csv", "categories.csv", "report.json", "report.html"):
        assert (run_dir / "report" / name).is_file()
    assert "40 cells" in capsys.readouterr().out


def test_report_merges_shards_and_takes_options(tmp_path: Path) -> None:
    all_rows = rows()
    a = write_run(tmp_path / "a", all_rows[:20])
    b = write_run(tmp_path / "b", all_rows[20:])
    out = tmp_path / "out"
    code = run([str(a), str(b), "--out", str(out), "--reference", "full_context@2000",
                "--seed", "3", "--price-in", "1", "--price-out", "2"])
    assert code == EXIT_OK
    document = json.loads((out / "report.json").read_text())
    assert document["rows"] == 40
    assert document["settings"]["seed"] == 3
    assert document["settings"]["prices"] == {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
    assert all(r["cost_usd_total"] is not None for r in document["summary"])


def test_report_of_two_runs_of_one_sweep_says_which_rows_it_superseded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_run(tmp_path / "a", rows(run_id="a"))
    b = write_run(tmp_path / "b", rows(run_id="b", quality=0.0))
    assert run([str(a), str(b), "--out", str(tmp_path / "out")]) == EXIT_OK
    captured = capsys.readouterr()
    assert "40 cells" in captured.out
    (line,) = captured.err.splitlines()
    assert line.startswith("budgetbench: warning: 40 rows superseded: 40 cells are in more "
                           "than one of the runs given and the last run's row is kept")
    assert f"memory item i0 full_context@2000 of {a} by {b}'s" in line
    assert "to compare runs use budgetbench diff" in line


def test_report_of_a_run_with_two_final_rows_of_a_cell_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    resumed = [make_row(item_id="i0", strategy="trunc", budget=500, status="error",
                        quality=None), *rows()]
    twice = write_run(tmp_path / "twice", [*resumed, make_row(item_id="i3", strategy="trunc",
                                                             budget=500)])
    assert run([str(twice)]) == EXIT_OK
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"budgetbench: warning: 1 final rows superseded: {twice} recorded "
                           "cells more than once as ok or violation (e.g. memory item i3 "
                           "trunc@500;")


def test_report_warns_when_merged_runs_differ_in_definition(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    all_rows = rows()
    a = write_run(tmp_path / "a", all_rows[:20])
    b = write_run(tmp_path / "b", all_rows[20:])
    for run_dir, model in ((a, "small"), (b, "large")):
        (run_dir / "run.json").write_text(json.dumps({"definition": {
            "settings": {"model": model, "seed": 0}, "tasks": {}, "strategies": {}}}))
    assert run([str(a), str(b), "--out", str(tmp_path / "out")]) == EXIT_OK
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"budgetbench: warning: {a} and {b} are merged as runs of one sweep but "
                    "differ in model: 'small' in the first, 'large' in the second; report "
                    "them apart, or compare them with budgetbench diff")


def test_violation_gate_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = write_run(tmp_path / "run", rows(violations=4))
    assert run([str(run_dir), "--max-violation-rate", "0.25"]) == EXIT_OK
    assert run([str(run_dir), "--max-violation-rate", "0.1"]) == EXIT_GATE_FAILED
    assert "gate failed: trunc@500: violation rate 20.0%" in capsys.readouterr().err


def test_a_retention_floor_given_twice_or_of_a_cell_not_recorded_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Never last-wins (0.9,0.1 would judge at 0.1), and a mistyped cell is named as one."""
    run_dir = write_run(tmp_path / "run", rows())
    with pytest.raises(SystemExit) as info:
        run([str(run_dir), "--min-retention=0.9,0.1"])
    assert info.value.code == EXIT_USAGE
    assert ("argument --min-retention: sets the floor of every non-reference strategy@budget "
            "twice with different values, 0.9 and 0.1: keep the one you mean"
            ) in capsys.readouterr().err
    assert run([str(run_dir), "--min-retention=rag@4096=0.5"]) == EXIT_USAGE
    assert ("budgetbench: error: --min-retention: rag@4096 is not a strategy@budget of these "
            "records (they hold full_context@2000, trunc@500); name one they hold"
            ) in capsys.readouterr().err


def test_regression_gate_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_run(tmp_path / "base", rows(quality=1.0))
    assert run([str(base)]) == EXIT_OK
    baseline = str(base / "report" / "report.json")
    same = write_run(tmp_path / "same", rows(quality=1.0))
    # 20 unchanged items exclude a drop of 0.2 (their interval is +-0.16), not of 0.1.
    assert run([str(same), "--baseline", baseline, "--max-regression", "0.2"]) == EXIT_OK
    capsys.readouterr()
    assert run([str(same), "--baseline", baseline, "--max-regression", "0.1"]) == \
        EXIT_GATE_FAILED
    assert "gate failed: memory: trunc@500: non-inferiority test failed: the lower bound " \
        "-0.161" in capsys.readouterr().err
    # The harm-shown test runs on --baseline alone, tolerating no shown drop, and says
    # that 20 items cannot detect one.
    assert run([str(same), "--baseline", baseline, "--regression-test=harm"]) == EXIT_OK
    assert "gate warning: memory: trunc@500: harm-shown test passed but cannot detect a " \
        "drop of 0 with n=20 (MDE 0.348)" in capsys.readouterr().err
    worse = write_run(tmp_path / "worse", rows(quality=0.0))
    assert run([str(worse), "--baseline", baseline, "--max-regression", "0.5",
                "--regression-test=harm"]) == EXIT_GATE_FAILED
    assert "harm-shown test failed: quality fell by 1.000" in capsys.readouterr().err


def test_a_non_inferiority_gate_needs_a_margin_above_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = write_run(tmp_path / "base", rows())
    baseline = str(base / "report.json")  # never read: the flags are refused first
    assert run([str(base), "--baseline", baseline]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        "budgetbench: error: --baseline under the non-inferiority test needs a margin: "
        "--max-regression=D, the quality drop you accept (e.g. 0.05), or "
        "--regression-test=harm to fail only on a shown drop\n")
    assert run([str(base), "--baseline", baseline, "--max-regression", "0"]) == EXIT_USAGE
    assert "--max-regression=0 under the non-inferiority test can never pass" \
        in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra",
    [["--price-in", "1"], ["--reference", "full_context@lots"]],
    ids=["price-pair", "bad-reference"],
)
def test_usage_errors(tmp_path: Path, extra: list[str]) -> None:
    run_dir = write_run(tmp_path / "run", rows())
    assert run([str(run_dir), *extra]) == EXIT_USAGE


def test_missing_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([str(tmp_path / "nowhere")]) == EXIT_USAGE
    assert "run directory not found" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["report", "diff"])
def test_a_bug_in_the_report_code_is_not_bad_usage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """Only the project's own errors are one-line usage errors: a ValueError raised inside
    the report code is a bug, and it surfaces with its traceback."""
    from pytest_budgetbench import reports
    from pytest_budgetbench.reports import diff

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("a bug")

    monkeypatch.setattr(reports, "build_report", broken)
    monkeypatch.setattr(diff, "diff_runs", broken)
    run_dir = write_run(tmp_path / "run", rows())
    argv = [str(run_dir)] if command == "report" else [str(run_dir), str(run_dir)]
    with pytest.raises(ValueError, match="a bug"):
        main([command, *argv])


@pytest.mark.parametrize(
    "argv",
    [[], ["report"], ["report", "x", "--max-violation-rate", "1.5"],
     ["report", "x", "--resamples", "0"], ["nonsense"]],
)
def test_argparse_rejects(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == EXIT_USAGE


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["report", "x", "--max-regression", "2"],
      "argument --max-regression: must be a rate between 0 and 1, e.g. 0.05 (got '2')"),
     (["report", "x", "--seed", "one"], "argument --seed: must be an integer (got 'one')"),
     (["train-router", "--items", "0"],
      "argument --items: must be a positive integer (got '0')"),
     (["train-router", "--tokenizer", "exact"], "argument --tokenizer: must be auto, "
      "server, approx, hf:<dir-or-tokenizer.json> or gguf:<file.gguf> (got 'exact')")],
    ids=["max-regression-is-a-rate", "seed", "items", "tokenizer"],
)
def test_shared_options_parse_as_the_plugin_does(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Options the plugin has too take its parser: one line naming the command's flag."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == EXIT_USAGE
    assert capsys.readouterr().err.splitlines()[-1].endswith(message)


def test_shared_options_take_the_plugins_defaults() -> None:
    from pytest_budgetbench.settings.config import Settings

    defaults = Settings()
    report = build_parser().parse_args(["report", "x"])
    assert (report.seed, report.resamples) == (defaults.seed, defaults.resamples)
    train = build_parser().parse_args(["train-router"])
    assert (train.max_tokens, train.tokenizer, train.embedding_model, train.api_key_env) == (
        defaults.max_tokens, defaults.tokenizer, defaults.embedding_model, defaults.api_key_env)


def test_subcommands_are_extensible() -> None:
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    assert "report" in actions[0].choices


def test_console_script(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", rows(violations=10))
    script = shutil.which("budgetbench", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "pytest_budgetbench.commands.cli"]
    result = subprocess.run(
        [*command, "report", str(run_dir), "--no-plots", "--resamples", "200",
         "--max-violation-rate", "0.2"],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == EXIT_GATE_FAILED, result.stderr
    assert "trunc@500" in result.stderr
