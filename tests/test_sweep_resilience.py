"""Sweeps that are cheap to repeat: the response cache, resume, shards, xdist groups and
bounded concurrency, end to end against the fake endpoint."""

from __future__ import annotations

import csv
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from pytest_budgetbench.cli import main
from pytest_budgetbench.session import started_at
from tests.fake_openai import FakeOpenAI
from tests.test_plugin import sweep_args


def rows_in(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "cells.jsonl").read_text().splitlines()]


def runs_in(tmp: Path) -> list[Path]:
    """Run directories, oldest first (two runs can start within the same second)."""
    return sorted((d for d in (tmp / "out").iterdir() if d.is_dir()), key=started_at)


def sweep(pytester: pytest.Pytester, fake: FakeOpenAI, tmp: Path, *extra: str
          ) -> pytest.RunResult:
    return pytester.runpytest(*sweep_args(fake, tmp, "--budgets=1024,8192",
                                          "--budgetbench-items=3", *extra))


def test_a_warm_rerun_sends_nothing_and_keeps_the_original_latencies(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    fake_endpoint.latency_s = 0.05
    sweep(pytester, fake_endpoint, tmp_path).assert_outcomes(passed=9, xfailed=3)
    sent = len(fake_endpoint.requests)
    sweep(pytester, fake_endpoint, tmp_path).assert_outcomes(passed=9, xfailed=3)
    assert len(fake_endpoint.requests) == sent
    cold, warm = (rows_in(run) for run in runs_in(tmp_path))
    latency = {r["cell_id"]: r["model_s"] for r in cold if r["status"] == "ok"}
    warm_ok = [r for r in warm if r["status"] == "ok"]
    assert all(r["cached"] for r in warm_ok)
    assert {r["cell_id"]: r["model_s"] for r in warm_ok} == latency
    assert min(latency.values()) >= 0.05  # the model's time, not the cache's
    assert [r["prediction"] for r in warm_ok] == [
        r["prediction"] for r in cold if r["status"] == "ok"]


def test_refresh_sends_every_distinct_prompt_again(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    sweep(pytester, fake_endpoint, tmp_path)
    sent = len(fake_endpoint.requests)
    sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-cache=refresh")
    assert len(fake_endpoint.requests) == 2 * sent
    second = rows_in(runs_in(tmp_path)[1])
    assert sum(not r["cached"] for r in second if r["status"] == "ok") == sent


def test_cache_off_shares_nothing_across_runs_but_still_sends_each_prompt_once(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-cache=off")
    sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-cache=off")
    assert not (tmp_path / "out" / "responses.sqlite").exists()
    for run in runs_in(tmp_path):
        ok = [r for r in rows_in(run) if r["status"] == "ok"]
        assert len({r["prompt_sha256"] for r in ok}) == 6 and len(ok) == 9
    assert len(fake_endpoint.requests) == 12


def test_sampled_replies_are_neither_cached_nor_deduplicated(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-temperature=0.7")
    assert len(fake_endpoint.requests) == 9
    assert all(r["cached"] is False for r in rows_in(runs_in(tmp_path)[0]) if r["status"] == "ok")


def test_resume_keeps_recorded_cells_and_reruns_errors_into_the_same_run(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    fake_endpoint.faults = ["500"] * 2
    result = sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-retries=1")
    result.assert_outcomes(passed=7, xfailed=3, errors=2)
    (run,) = runs_in(tmp_path)
    sent = len(fake_endpoint.requests)
    result = sweep(pytester, fake_endpoint, tmp_path, f"--budgetbench-resume={run}")
    result.assert_outcomes(passed=9, xfailed=3)  # recorded violations xfail again
    # The summary counts each cell once: the superseded error rows are not items.
    counts = re.findall(r" (?:1024|8192) +(\d+) ", result.stdout.str())
    assert counts == ["3"] * 4
    assert "Benchmark fixture was not used" not in result.stdout.str()
    assert runs_in(tmp_path) == [run]
    # Only the two errored cells ran; one of them (truncation@8192 of item 0, whose prompt
    # is full_context@8192's) found its reply in the cache.
    assert len(fake_endpoint.requests) == sent + 1
    rows = rows_in(run)
    final = [r for r in rows if r["status"] != "error"]
    assert len(final) == 12 and len({r["cell_id"] for r in final}) == 12
    info = json.loads((run / "run.json").read_text())
    assert len(info["resumed"]) == 1


def test_resume_latest_picks_the_newest_run(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-items=1")
    sweep(pytester, fake_endpoint, tmp_path)
    newest = runs_in(tmp_path)[-1]
    before = len(rows_in(newest))
    sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-resume=latest")
    assert len(runs_in(tmp_path)) == 2 and len(rows_in(newest)) == before


@pytest.mark.parametrize(
    ("resume", "message"),
    [("nowhere", "not a run directory"), ("latest", "found no run in")],
)
def test_resume_of_nothing_is_a_usage_error(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path, resume: str,
    message: str,
) -> None:
    result = sweep(pytester, fake_endpoint, tmp_path, f"--budgetbench-resume={resume}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--budgetbench-resume*{message}*"])


def test_resume_with_another_model_is_refused(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    sweep(pytester, fake_endpoint, tmp_path)
    result = sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-resume=latest",
                   "--budgetbench-model=other-model")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*was made with model 'fake-model'*'other-model'*"])


def test_shards_split_by_item_and_merge_into_the_unsharded_report(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    for shard in ("1/2", "2/2"):
        sweep(pytester, fake_endpoint, tmp_path, f"--budgetbench-shard={shard}")
    first, second = (rows_in(run) for run in runs_in(tmp_path))
    items = [{r["item_id"] for r in rows} for rows in (first, second)]
    assert items == [{"0000", "0002"}, {"0001"}]
    assert len(first) + len(second) == 12
    assert {r["cell_id"] for r in first}.isdisjoint(r["cell_id"] for r in second)
    assert [run.name.endswith(f"-shard{i}of2") for i, run in enumerate(runs_in(tmp_path), 1)
            ] == [True, True]
    merged = tmp_path / "merged"
    assert main(["report", *map(str, runs_in(tmp_path)), "--out", str(merged), "--no-plots"]) == 0
    with (merged / "summary.csv").open() as handle:
        assert {row["n_items"] for row in csv.DictReader(handle)} == {"3"}


def test_concurrency_runs_cells_ahead_but_never_exceeds_its_bound(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    fake_endpoint.latency_s = 0.1
    # One distinct prompt per cell, so no cell waits on another's identical request.
    result = sweep(pytester, fake_endpoint, tmp_path, "--budgetbench-concurrency=3",
                   "--budgetbench-items=8", "--budgetbench-strategies=truncation",
                   "--budgets=1024")
    result.assert_outcomes(passed=8)
    assert fake_endpoint.max_in_flight == 3
    rows = rows_in(runs_in(tmp_path)[0])
    assert len(rows) == 8 and len({r["cell_id"] for r in rows}) == 8


def test_under_xdist_an_items_cells_stay_on_one_worker(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    result = pytester.runpytest_subprocess(
        *sweep_args(fake_endpoint, tmp_path, "--budgets=1024,8192", "--budgetbench-items=4",
                    "-n", "2"))
    result.assert_outcomes(passed=12, xfailed=4)
    workers: dict[str, set[str]] = defaultdict(set)
    for row in rows_in(runs_in(tmp_path)[0]):
        workers[row["item_id"]].add(row["worker"])
    assert all(len(w) == 1 for w in workers.values())
    assert set().union(*workers.values()) == {"gw0", "gw1"}
    # Identical prompts were sent once, across both workers.
    assert len(fake_endpoint.requests) == 8
