"""The fault-injection suite: sweeps against a faulty endpoint, killed and resumed.

Every scenario must lose no row, duplicate no row and grade no infrastructure failure.
``benchmarks/fault_suite.py`` prints the same scenarios as a table.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import faults


def test_transient_faults_error_cells_never_grade_them_and_resume_reruns_the_errors(
    tmp_path: Path,
) -> None:
    injected, resumed = faults.transient_faults(tmp_path)
    assert injected.faults_injected > 5 and injected.clean and resumed.clean
    # Unretryable replies (malformed, no choices, null content) errored their cells...
    assert injected.errored > 4 and injected.completed + injected.errored == injected.cells
    # ...and the resume reran them: what is left is the crashing strategy's cells alone.
    crashed = 2 * len(faults.BUDGETS)  # items 0002 and 0005 of 6
    assert resumed.errored == crashed and resumed.completed == resumed.cells - crashed


def test_sigkill_at_any_point_then_resume_leaves_exactly_one_row_per_cell(
    tmp_path: Path,
) -> None:
    result = faults.kill_and_resume(tmp_path, kill_at=(1, 9, 17))
    assert result.clean, result
    assert result.completed + result.errored == result.cells


def test_xdist_workers_share_records_and_lose_nothing(tmp_path: Path) -> None:
    result = faults.under_xdist(tmp_path)
    assert result.faults_injected > 0 and result.clean
    errors = [(r["cell_id"], r["error"]) for p in tmp_path.glob("out/*/cells.jsonl")
              for r in map(json.loads, p.read_text().splitlines()) if r["status"] == "error"]
    assert result.completed == result.cells - 2 * len(faults.BUDGETS), errors


def test_a_reply_dripping_in_past_the_timeout_errors_its_cell_and_the_sweep_goes_on(
    tmp_path: Path,
) -> None:
    result, errors = faults.dripping_reply(tmp_path)
    assert result.clean and result.exit_code == pytest.ExitCode.TESTS_FAILED, result
    crashed = [r for r in errors if "injected strategy crash" in (r["error"] or "")]
    (timed_out,) = [r for r in errors if r not in crashed]
    assert "no complete reply within 1 s" in timed_out["error"]
    assert "--budgetbench-timeout" in timed_out["error"] and timed_out["prediction"] is None
    assert result.completed == result.cells - len(errors)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")
def test_no_xdist_worker_appends_a_row_after_a_sigtermed_controller_exited(
    tmp_path: Path,
) -> None:
    at_exit, after, resumed = faults.sigterm_under_xdist(tmp_path)
    assert after == at_exit  # the controller exited after its workers, not before
    assert resumed.clean and resumed.completed + resumed.errored == resumed.cells, resumed


def test_an_endpoint_down_at_start_is_one_clear_error_before_any_cell(tmp_path: Path) -> None:
    result, output = faults.endpoint_down(tmp_path)
    assert result.exit_code == pytest.ExitCode.USAGE_ERROR and result.completed == 0
    (line,) = [line for line in output.splitlines() if line.startswith("ERROR:")]
    assert "is not usable" in line and "--budgetbench-endpoint" in line


def test_a_malformed_dataset_line_is_one_clear_error_naming_file_and_line(
    tmp_path: Path,
) -> None:
    result, output = faults.malformed_dataset(tmp_path)
    assert result.exit_code == pytest.ExitCode.USAGE_ERROR and result.completed == 0
    (line,) = [line for line in output.splitlines() if line.startswith("ERROR:")]
    assert "hotpot.jsonl" in line and "line 2 is not valid JSON" in line


def test_the_tally_counts_lost_duplicate_and_wrongly_graded_rows(tmp_path: Path) -> None:
    """The suite's own yardstick can fail: rows that break each rule are counted."""
    question = [{"role": "user", "content": "my dog is called Rex"},
                {"role": "user", "content": "What is my dog called?"}]
    rows = [
        {"cell_id": "memory-0000-truncation-512", "status": "ok", "prediction": "Rex"},
        {"cell_id": "memory-0000-truncation-512", "status": "ok", "prediction": "Rex"},
        {"cell_id": "memory-0001-truncation-512", "status": "ok", "prediction": ""},
    ]
    (tmp_path / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "prompts.jsonl").write_text("".join(
        json.dumps({"cell_id": r["cell_id"], "messages": question}) + "\n" for r in rows))
    expected = faults.expected_cells(3, ["truncation"], [512])
    result = faults.tally("yardstick", 0, tmp_path, expected, 0, 0.0)
    assert (result.rows_lost, result.duplicate_rows, result.graded_failures) == (1, 1, 1)
    assert not result.clean


def test_planted_secrets_reach_no_artifact_stdout_or_junit(tmp_path: Path) -> None:
    auto, server, echoed = faults.planted_secrets(tmp_path)
    for result in (auto, server, echoed):
        assert result.secret_hits == 0, result
        assert result.clean, result
    # The echoing server was hit, and the query-string endpoint still answered cells.
    assert echoed.faults_injected > len(faults.PLANTED) and echoed.completed > 0
    # Stopped up front, with one line that names the tokenizer and holds no secret.
    assert auto.exit_code == server.exit_code == pytest.ExitCode.USAGE_ERROR
    output = (tmp_path / "auto" / "last-output.txt").read_text()
    assert "--budgetbench-tokenizer=auto" in output and "Traceback" not in output


def test_planted_secrets_reach_no_episode_record_or_step(tmp_path: Path) -> None:
    """A teacher-forced agent sweep whose server echoes the key in its 401s: the errored
    episodes' records, the steps, the report's viewer and the JUnit hold no secret, and
    a resume completes every cell."""
    result = faults.planted_secrets_in_episodes(tmp_path)
    assert result.faults_injected > len(faults.PLANTED), "no 401 was injected"
    assert result.secret_hits == 0 and result.clean, result
    assert result.completed == result.cells and result.exit_code == 0, result
    assert (tmp_path / "junit.xml").is_file() and any(tmp_path.glob("out/*/episodes.jsonl"))


def test_extreme_retry_after_values_neither_overflow_nor_sleep_past_the_cap(
    tmp_path: Path,
) -> None:
    result = faults.retry_after_extremes(tmp_path)
    assert result.faults_injected > 3 and result.clean, result
    assert result.completed + result.errored == result.cells


def test_a_baseline_with_nothing_comparable_stops_the_sweep_before_any_cell(
    tmp_path: Path,
) -> None:
    result, output = faults.incomparable_baseline(tmp_path)
    assert result.exit_code == pytest.ExitCode.USAGE_ERROR and result.clean, result
    assert "nothing is comparable for task 'memory'" in output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_misbehaving_plugins_get_one_error_row_per_cell_and_the_sweep_goes_on(
    tmp_path: Path,
) -> None:
    result = faults.misbehaving_strategies(tmp_path)
    assert result.clean, result
    assert result.errored == len(faults.MISBEHAVING) * 2 * len(faults.BUDGETS)
    assert result.completed == 2 * len(faults.BUDGETS)  # truncation, every cell


def test_two_strategies_with_one_name_are_one_usage_line(tmp_path: Path) -> None:
    result, output = faults.same_name_strategies(tmp_path)
    assert result.exit_code == pytest.ExitCode.USAGE_ERROR and result.clean, result
    assert "are both named 'truncation'" in output


def test_resume_latest_after_a_failed_start_completes_the_real_run(tmp_path: Path) -> None:
    result = faults.failed_start_then_resume(tmp_path)
    assert result.faults_injected > 1 and result.clean, result
    crashed = 1 * len(faults.BUDGETS)  # item 0002 of 4 crashes on purpose
    assert result.completed == result.cells - crashed


def test_a_full_disk_errors_the_cell_keeps_records_aligned_and_reports_one_line(
    tmp_path: Path,
) -> None:
    outcome = faults.disk_full(tmp_path)
    if outcome is None:
        pytest.skip("mounting a tmpfs is not allowed here")
    result, output = outcome
    assert result.clean, result
    assert result.exit_code != pytest.ExitCode.OK
    assert "RecordError" in output and "No space left" in output
    assert "Traceback" not in output and "INTERNALERROR" not in output
    (line,) = [line for line in output.splitlines() if "the report could not be written" in line]
    assert line.startswith("budgetbench: ")


def test_a_resume_that_changes_an_episode_cap_is_refused_and_leaves_the_run_alone(
    tmp_path: Path,
) -> None:
    for (result, output), (flag, value) in zip(faults.changed_episode_caps(tmp_path),
                                               faults.EPISODE_CAPS, strict=True):
        assert result.exit_code == pytest.ExitCode.USAGE_ERROR and result.clean, result
        assert result.completed == result.cells and result.errored == 0
        assert f"was made with {flag} " in output and f"this session asks {value}" in output


def test_a_read_only_cache_merges_and_its_bytes_stay_as_they_were(tmp_path: Path) -> None:
    result, output = faults.read_only_merge(tmp_path)
    assert result.exit_code == 0 and result.clean, (result, output)
    assert result.cells > 0 and result.completed == result.cells


def test_tool_calls_sharing_an_id_are_the_models_malformed_reply_and_a_resume_completes(
    tmp_path: Path,
) -> None:
    result, errors = faults.duplicate_call_ids(tmp_path)
    assert result.faults_injected > 0 and errors, result
    assert all(e.startswith("malformed reply from") and "of the episode" in e
               for e in errors), errors
    assert not any("broke a tool-call pair" in e for e in errors)
    assert result.clean and result.exit_code == 0, result
    assert result.completed == result.cells and result.errored == 0


def test_a_replica_answering_200_with_a_malformed_body_is_taken_out_and_no_cell_errors_for_it(
    tmp_path: Path,
) -> None:
    result, events = faults.malformed_replica(tmp_path)
    assert result.clean, result
    crashy_cells = 2 * len(faults.BUDGETS)  # crashy raises on items 0002 and 0005, by design
    assert result.errored == crashy_cells and result.completed == result.cells - crashy_cells
    outs = [e for e in events if e.get("event") == "out"]
    assert outs and all(e["replica"] == outs[0]["replica"] for e in outs), events
