"""``--budgetbench-shard=auto``: the shard from a Kubernetes Indexed Job, a SLURM array or
explicit variables, and shards run as separate processes that merge into the unsharded
report."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from pytest_budgetbench.commands.cli import main
from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.settings.config import Settings, load_settings
from pytest_budgetbench.sweep.shards import Shard, shard_from_environment
from tests.fake_openai import FakeOpenAI
from tests.sweeps import sweep_args

ENGINE_VARIABLES = ("JOB_COMPLETION_INDEX", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN",
                    "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_STEP",
                    "BUDGETBENCH_SHARD_INDEX", "BUDGETBENCH_SHARD_COUNT", "BUDGETBENCH_SHARD")


@pytest.fixture(autouse=True)
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine running the tests may itself be a job's: its variables are not ours."""
    for name in ENGINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def slurm(task: int, first: int, count: int, step: int = 1) -> dict[str, str]:
    """The variables SLURM gives each task of ``--array=first-last:step``."""
    last = first + (count - 1) * step
    return {"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_MIN": str(first),
            "SLURM_ARRAY_TASK_MAX": str(last), "SLURM_ARRAY_TASK_COUNT": str(count),
            "SLURM_ARRAY_TASK_STEP": str(step), "SLURM_ARRAY_JOB_ID": "9000"}


# -- the resolution: each engine's base, and a clear line where the shard is unknown ------
@pytest.mark.parametrize(("environ", "shard"), [
    ({"JOB_COMPLETION_INDEX": "0", "BUDGETBENCH_SHARD_COUNT": "4"}, (1, 4)),
    ({"JOB_COMPLETION_INDEX": "3", "BUDGETBENCH_SHARD_COUNT": "4"}, (4, 4)),
    (slurm(task=0, first=0, count=3), (1, 3)),
    (slurm(task=1, first=1, count=3), (1, 3)),
    (slurm(task=3, first=1, count=3), (3, 3)),
    (slurm(task=12, first=10, count=5), (3, 5)),
    (slurm(task=6, first=0, count=5, step=2), (4, 5)),
    ({"BUDGETBENCH_SHARD_INDEX": "0", "BUDGETBENCH_SHARD_COUNT": "2"}, (1, 2)),
    ({"BUDGETBENCH_SHARD_INDEX": "1", "BUDGETBENCH_SHARD_COUNT": "2"}, (2, 2)),
    # An older SLURM without SLURM_ARRAY_TASK_COUNT: the script says the count.
    ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "1",
      "BUDGETBENCH_SHARD_COUNT": "2"}, (2, 2)),
    # An empty variable is unset (a manifest's `value: ""`).
    ({"JOB_COMPLETION_INDEX": "1", "BUDGETBENCH_SHARD_COUNT": "2",
      "SLURM_ARRAY_TASK_ID": ""}, (2, 2)),
])
def test_auto_numbers_shards_from_1_whatever_the_engines_base(
    environ: dict[str, str], shard: tuple[int, int]
) -> None:
    found = shard_from_environment(environ)
    assert (found.index, found.count) == shard


def test_the_source_names_the_variables_read() -> None:
    assert shard_from_environment(slurm(task=5, first=4, count=4)) == Shard(
        2, 4, "SLURM array: SLURM_ARRAY_TASK_ID=5 (SLURM_ARRAY_TASK_MIN=4, "
              "SLURM_ARRAY_TASK_COUNT=4)")
    assert shard_from_environment({"JOB_COMPLETION_INDEX": "1",
                                   "BUDGETBENCH_SHARD_COUNT": "3"}).source == (
        "Kubernetes Indexed Job: JOB_COMPLETION_INDEX=1 of BUDGETBENCH_SHARD_COUNT=3")


@pytest.mark.parametrize(("environ", "message"), [
    ({}, "found no job engine's variables: it reads JOB_COMPLETION_INDEX and "
         "BUDGETBENCH_SHARD_COUNT (a Kubernetes Indexed Job), SLURM_ARRAY_TASK_ID"),
    ({"JOB_COMPLETION_INDEX": "0", "BUDGETBENCH_SHARD_COUNT": "2", **slurm(1, 1, 2)},
     "more than one convention (JOB_COMPLETION_INDEX=0, SLURM_ARRAY_TASK_ID=1): unset all "
     "but one"),
    ({"JOB_COMPLETION_INDEX": "2"},
     "JOB_COMPLETION_INDEX=2 (a Kubernetes Indexed Job) gives the index but not the count: "
     "set BUDGETBENCH_SHARD_COUNT in the pod's env to the Job's .spec.completions"),
    ({"JOB_COMPLETION_INDEX": "4", "BUDGETBENCH_SHARD_COUNT": "4"},
     "JOB_COMPLETION_INDEX=4 (Kubernetes Indexed Job) is not below BUDGETBENCH_SHARD_COUNT=4"),
    ({"JOB_COMPLETION_INDEX": "-1", "BUDGETBENCH_SHARD_COUNT": "4"},
     "JOB_COMPLETION_INDEX must be a non-negative integer (got '-1')"),
    ({"BUDGETBENCH_SHARD_INDEX": "0", "BUDGETBENCH_SHARD_COUNT": "0"},
     "BUDGETBENCH_SHARD_COUNT must be a positive integer (got '0')"),
    ({"BUDGETBENCH_SHARD_INDEX": "1"}, "BUDGETBENCH_SHARD_INDEX=1 needs BUDGETBENCH_SHARD_COUNT"),
    ({"SLURM_ARRAY_TASK_ID": "3"},
     "SLURM_ARRAY_TASK_ID=3 comes without SLURM_ARRAY_TASK_MIN and SLURM_ARRAY_TASK_COUNT"),
    # --array=1,3,7: three tasks, but not one range.
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "7",
      "SLURM_ARRAY_TASK_COUNT": "3"}, "the SLURM array's ids are not one range"),
    # A task off the array's grid (step 2 from 0).
    ({**slurm(0, 0, 5, step=2), "SLURM_ARRAY_TASK_ID": "3"},
     "the SLURM array's ids are not one range (SLURM_ARRAY_TASK_ID=3"),
    ({**slurm(1, 1, 4), "BUDGETBENCH_SHARD_COUNT": "5"},
     "BUDGETBENCH_SHARD_COUNT=5 disagrees with SLURM_ARRAY_TASK_COUNT=4"),
])
def test_an_unknown_shard_is_one_line_naming_the_variables_and_the_fix(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        shard_from_environment(environ)
    text = str(raised.value)
    assert message in text and "\n" not in text
    assert text.startswith("--budgetbench-shard=auto")


# -- the option: flag, ini and env twins ---------------------------------------------------
def settings(option: str | None = None, ini: str = "", budgets: str | None = "1024"
             ) -> Settings:
    given = {"shard": option, "budgets": budgets}
    return load_settings(given.get, lambda name: ini if name == "budgetbench_shard" else "")


@pytest.mark.parametrize("where", ["flag", "ini", "env"])
def test_auto_is_taken_from_the_flag_the_ini_and_the_env(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "2")
    monkeypatch.setenv("BUDGETBENCH_SHARD_COUNT", "3")
    if where == "env":
        monkeypatch.setenv("BUDGETBENCH_SHARD", "auto")
    found = settings(option="AUTO" if where == "flag" else None,
                     ini="auto" if where == "ini" else "")
    assert found.shard == (3, 3)
    assert found.shard_source == "Kubernetes Indexed Job: JOB_COMPLETION_INDEX=2 of " \
                                 "BUDGETBENCH_SHARD_COUNT=3"
    assert found.public()["shard_source"] == found.shard_source


def test_an_explicit_shard_says_which_option_gave_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "0")  # read only for auto
    assert (settings(option="2/4").shard, settings(option="2/4").shard_source) == (
        (2, 4), "--budgetbench-shard")
    assert settings(ini="1/2").shard_source == "ini budgetbench_shard"
    monkeypatch.setenv("BUDGETBENCH_SHARD", "2/2")
    assert (settings().shard, settings().shard_source) == ((2, 2), "env BUDGETBENCH_SHARD")
    assert settings(option="3/4").shard == (3, 4)  # the flag wins over the env


def test_without_a_sweep_auto_reads_nothing_and_stops_nothing() -> None:
    # An ini that says auto for its jobs: `pytest tests/test_x.py` on a laptop still runs.
    assert settings(ini="auto", budgets=None).shard is None
    with pytest.raises(ConfigError, match="found no job engine's variables"):
        settings(ini="auto")


def test_a_bad_shard_names_auto_as_an_alternative() -> None:
    with pytest.raises(ConfigError, match=r"i/n with 1 <= i <= n, .*or auto \(from a "):
        settings(option="0/4")


# -- shards as separate processes, merged --------------------------------------------------
def run_dirs(out: Path) -> list[Path]:
    return sorted(d for d in out.iterdir() if (d / "run.json").is_file())


CLOCK_COLUMNS = ("strategy_s_", "latency_s_")
"""Columns each process times itself (a strategy's work, a cell's wall time): they differ
between any two runs, sharded or not. ``model_s`` comes from the cache, as first timed."""


def summary_rows(report_dir: Path) -> list[dict[str, str]]:
    with (report_dir / "summary.csv").open(newline="") as handle:
        return [{key: value for key, value in row.items() if not key.startswith(CLOCK_COLUMNS)}
                for row in csv.DictReader(handle)]


def sharded_sweep_merges_into_the_unsharded_report(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, fake: FakeOpenAI,
    tmp_path: Path, environments: list[dict[str, str]],
) -> list[dict[str, object]]:
    """Run the sweep unsharded, then once per environment with --budgetbench-shard=auto,
    each its own pytest process, merge the shards and check the merged summary.csv is the
    unsharded one. Returns the shards' run.json settings."""
    sweep = ("--budgets=1024,8192", "--budgetbench-items=5", "--budgetbench-seed=3")
    whole = tmp_path / "whole"
    pytester.runpytest_subprocess(*sweep_args(fake, whole, *sweep)).assert_outcomes(
        passed=15, xfailed=5)
    sent = len(fake.requests)
    # The shards share the unsharded run's response cache, as shards on a shared volume
    # do, so each cell gets the same reply and the original call's latency.
    cache = f"--budgetbench-cache-path={whole / 'out' / 'responses.sqlite'}"
    for environ in environments:
        with monkeypatch.context() as patch:
            for name, value in environ.items():
                patch.setenv(name, value)
            result = pytester.runpytest_subprocess(*sweep_args(
                fake, tmp_path / "shards", *sweep, "--budgetbench-shard=auto", cache))
        assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    assert len(fake.requests) == sent
    shards = run_dirs(tmp_path / "shards" / "out")
    assert len(shards) == len(environments)
    merged, alone = tmp_path / "merged", tmp_path / "alone"
    (unsharded,) = run_dirs(whole / "out")
    assert main(["report", *map(str, shards), "--out", str(merged), "--no-plots"]) == 0
    assert main(["report", str(unsharded), "--out", str(alone), "--no-plots"]) == 0
    expected = summary_rows(alone)
    assert len(expected) == 4 and {row["n_items"] for row in expected} == {"5"}
    assert summary_rows(merged) == expected
    assert (merged / "paired.csv").read_text() == (alone / "paired.csv").read_text()
    items = [{json.loads(line)["item_id"] for line in (run / "cells.jsonl").open()}
             for run in shards]
    assert sum(map(len, items)) == 5 and set().union(*items) == {f"{i:04d}" for i in range(5)}
    return [json.loads((run / "run.json").read_text())["settings"] for run in shards]


def test_kubernetes_indexed_job_shards_merge_into_the_unsharded_report(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, fake_endpoint: FakeOpenAI,
    tmp_path: Path,
) -> None:
    recorded = sharded_sweep_merges_into_the_unsharded_report(
        pytester, monkeypatch, fake_endpoint, tmp_path,
        [{"JOB_COMPLETION_INDEX": str(i), "BUDGETBENCH_SHARD_COUNT": "3"} for i in range(3)])
    assert sorted((tuple(s["shard"]), s["shard_source"]) for s in recorded) == [
        ((i + 1, 3), f"Kubernetes Indexed Job: JOB_COMPLETION_INDEX={i} of "
                     "BUDGETBENCH_SHARD_COUNT=3") for i in range(3)]


def test_slurm_array_shards_from_a_nonzero_min_merge_into_the_unsharded_report(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, fake_endpoint: FakeOpenAI,
    tmp_path: Path,
) -> None:
    recorded = sharded_sweep_merges_into_the_unsharded_report(
        pytester, monkeypatch, fake_endpoint, tmp_path,
        [slurm(task, first=1, count=3) for task in (1, 2, 3)])
    assert sorted(tuple(s["shard"]) for s in recorded) == [(1, 3), (2, 3), (3, 3)]


def test_an_unknown_shard_stops_pytest_before_any_cell(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    result = pytester.runpytest(*sweep_args(fake_endpoint, tmp_path, "--budgets=1024",
                                            "--budgetbench-shard=auto"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*JOB_COMPLETION_INDEX=1 (a Kubernetes Indexed Job) gives "
                                 "the index but not the count*"])
    assert not fake_endpoint.requests and not (tmp_path / "out").exists()


def test_xdist_workers_run_the_shard_their_controller_resolved(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each worker's environment says another shard: the controller's must win.
    pytester.makeconftest("""
        import os
        if os.environ.get("PYTEST_XDIST_WORKER"):
            os.environ["JOB_COMPLETION_INDEX"] = "0"
    """)
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    monkeypatch.setenv("BUDGETBENCH_SHARD_COUNT", "2")
    # This test may itself run in an xdist worker: its controller must not look like one.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    result = pytester.runpytest_subprocess(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=8192", "--budgetbench-items=4",
        "--budgetbench-shard=auto", "-n", "2"))
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["budgetbench: shard 2/2 (Kubernetes Indexed Job: "
                                 "JOB_COMPLETION_INDEX=1 of BUDGETBENCH_SHARD_COUNT=2)"])
    (run,) = run_dirs(tmp_path / "out")
    assert run.name.endswith("-shard2of2")
    rows = [json.loads(line) for line in (run / "cells.jsonl").open()]
    assert {row["item_id"] for row in rows} == {"0001", "0003"}


# -- the manual's examples: each engine's job runs every shard once ----------------------
SHARDS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reruns-xdist-shards.md"


def _fenced(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", SHARDS_PAGE.read_text(encoding="utf-8"),
                      re.MULTILINE | re.DOTALL)


def test_the_manuals_indexed_job_runs_each_shard_once() -> None:
    yaml = pytest.importorskip("yaml")
    documents = [doc for block in _fenced("yaml") for doc in yaml.safe_load_all(block)]
    (job,) = [doc for doc in documents if doc.get("kind") == "Job"
              and doc["spec"].get("completionMode") == "Indexed"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {entry["name"]: entry["value"] for entry in container["env"]}
    assert "--budgetbench-shard=auto" in container["command"]
    completions = job["spec"]["completions"]
    shards = {(s.index, s.count) for s in (shard_from_environment(
        {**env, "JOB_COMPLETION_INDEX": str(index)}) for index in range(completions))}
    assert shards == {(i, completions) for i in range(1, completions + 1)}


def test_the_manuals_sbatch_array_runs_each_shard_once() -> None:
    (script,) = [block for block in _fenced("bash") if "#SBATCH --array=" in block]
    assert "--budgetbench-shard=auto" in script
    first, last = map(int, re.search(r"#SBATCH --array=(\d+)-(\d+)\n", script).groups())
    count = last - first + 1
    shards = {(s.index, s.count) for s in (shard_from_environment(slurm(task, first, count))
                                            for task in range(first, last + 1))}
    assert shards == {(i, count) for i in range(1, count + 1)}
