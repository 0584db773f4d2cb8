"""The plugin end to end through pytester, against the fake endpoint on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_budgetbench.model.chat import free_port
from tests.fake_openai import FakeOpenAI
from tests.sweeps import add_greedy_strategy, rows_of, sweep_args


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("--budgets=abc", "--budgets must be positive token counts"),
        ("--budgets=0", "(got '0' in '0')"),
        ("--budgets=-5", "(got '-5'"),
        ("--budgets=", "--budgets must be positive"),
        ("--budgetbench-strategies=nope", "unknown strategy 'nope'"),
        ("--budgetbench-tasks=nope", "unknown task 'nope'"),
        ("--budgetbench-audit=loud", "must be one of full|hash|off"),
        ("--budgetbench-tool-parser=vllm",
         "--budgetbench-tool-parser must be one of auto|hermes|none (got 'vllm')"),
        ("--budgetbench-max-violation-rate=2", "between 0 and 1"),
    ],
)
def test_bad_option_is_a_usage_error_naming_the_value(
    pytester: pytest.Pytester, option: str, expected: str
) -> None:
    extra = [] if option.startswith("--budgets") else ["--budgets=512"]
    result = pytester.runpytest(option, *extra)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{expected}*"])


def test_unknown_strategy_error_lists_known_names(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--budgets=512", "--budgetbench-strategies=nope")
    result.stderr.fnmatch_lines(["*known: *full_context*truncation*module:attr*"])


def test_ini_twin_turns_the_sweep_on(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makeini("[pytest]\nbudgetbench_budgets = 4096\nbudgetbench_items = 2\n")
    result = pytester.runpytest(*sweep_args(fake_endpoint, tmp_path), "--collect-only", "-q")
    result.stdout.fnmatch_lines(["budgetbench::cell[memory-0000-full_context-4096]"])


def test_without_budgets_the_plugin_adds_nothing_and_imports_nothing_heavy(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_probe="""
        import sys
        def test_probe():
            heavy = {"torch", "transformers", "chromadb", "openai", "pandas", "llama_cpp"}
            assert not heavy & set(sys.modules), heavy & set(sys.modules)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "budgetbench summary" not in result.stdout.str()


def test_cells_have_readable_ids_in_deterministic_order(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    args = sweep_args(fake_endpoint, tmp_path, "--budgets=8192,2048", "--budgetbench-items=2",
                      "--collect-only", "-q")
    first = pytester.runpytest(*args).stdout.lines
    second = pytester.runpytest(*args).stdout.lines
    cells = [line for line in first if line.startswith("budgetbench::")]
    assert cells == [line for line in second if line.startswith("budgetbench::")]
    assert cells[:4] == [
        "budgetbench::cell[memory-0000-full_context-2048]",
        "budgetbench::cell[memory-0000-truncation-2048]",
        "budgetbench::cell[memory-0000-full_context-8192]",
        "budgetbench::cell[memory-0000-truncation-8192]",
    ]
    assert len(cells) == 8


def test_keyword_selects_cells(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    args = sweep_args(fake_endpoint, tmp_path, "--budgets=2048,8192", "--budgetbench-items=3",
                      "--collect-only", "-q", "-k", "truncation and 2048")
    cells = [ln for ln in pytester.runpytest(*args).stdout.lines if ln.startswith("budgetbench")]
    assert cells == [f"budgetbench::cell[memory-000{i}-truncation-2048]" for i in range(3)]


def test_sweep_records_one_row_per_cell_and_xfails_reference_over_budget(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    result = pytester.runpytest(
        *sweep_args(fake_endpoint, tmp_path, "--budgets=1024,8192", "--budgetbench-items=3")
    )
    # full_context@1024 is over budget (xfailed); everything else fits or is truncated.
    result.assert_outcomes(passed=9, xfailed=3)
    rows = rows_of(tmp_path)
    assert len(rows) == 12
    assert {r["cell_id"] for r in rows} == {
        f"memory-000{i}-{s}-{b}" for i in range(3) for s in ("full_context", "truncation")
        for b in (1024, 8192)
    }
    violations = [r for r in rows if r["status"] == "violation"]
    assert {r["strategy"] for r in violations} == {"full_context"}
    assert all(r["budget"] == 1024 and r["prediction"] is None for r in violations)
    admitted = [r for r in rows if r["status"] == "ok"]
    assert all(r["counted_tokens"] == r["server_prompt_tokens"] for r in admitted)
    assert all(r["tokenizer"] == "approx-chars/4" and r["tokenizer_exact"] is False for r in rows)
    # Violations were never sent, and identical admitted prompts were sent once:
    # truncation@8192 keeps the whole history, so it is full_context@8192's prompt.
    assert len(fake_endpoint.requests) == len({r["prompt_sha256"] for r in admitted}) == 6
    assert sum(r["cached"] for r in admitted) == len(admitted) - 6
    result.stdout.fnmatch_lines(["*budgetbench summary*", "*truncation*1024*", "*run directory:*"])


def test_truncation_loses_evidence_that_full_context_keeps(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.runpytest(
        *sweep_args(fake_endpoint, tmp_path, "--budgets=512,8192", "--budgetbench-items=10")
    )
    rows = [r for r in rows_of(tmp_path) if r["status"] == "ok"]

    def quality(strategy: str, budget: int) -> float:
        scores = [r["quality"] for r in rows if (r["strategy"], r["budget"]) == (strategy, budget)]
        return sum(scores) / len(scores)

    assert quality("full_context", 8192) > quality("truncation", 512)


def test_violating_strategy_fails_with_the_figures(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    add_greedy_strategy(pytester)
    result = pytester.runpytest(
        *sweep_args(fake_endpoint, tmp_path, "--budgets=512", "--budgetbench-items=1",
                    "--budgetbench-strategies=greedy:Greedy")
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*BudgetExceeded: cell memory-0000-greedy-512 would send * prompt tokens "
         "(budget 512, tokenizer approx-chars/4 approx); strategy 'greedy' exceeded by *"]
    )


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("raise RuntimeError('boom')", "strategy 'broken' failed on cell * RuntimeError: boom"),
        ("return 'not messages'", "strategy 'broken' must return a list of chat messages*"),
        ("return []", "strategy 'broken' returned no message on cell memory-0000-broken-512: "
                      "an empty prompt cannot be counted or sent"),
    ],
)
def test_broken_strategy_errors_and_names_itself(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path, body: str,
    expected: str,
) -> None:
    pytester.makepyfile(
        broken=f"""
        from pytest_budgetbench.strategies import Strategy

        class Broken(Strategy):
            name = "broken"

            def apply(self, messages, budget):
                {body}
        """
    )
    pytester.syspathinsert()
    result = pytester.runpytest(
        *sweep_args(fake_endpoint, tmp_path, "--budgets=512", "--budgetbench-items=1",
                    "--budgetbench-strategies=broken:Broken")
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*{expected}*"])
    (row,) = rows_of(tmp_path)
    assert row["status"] == "error" and row["quality"] is None


def test_endpoint_failure_errors_and_is_never_graded(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    fake_endpoint.faults = ["500"] * 3
    result = pytester.runpytest(
        *sweep_args(fake_endpoint, tmp_path, "--budgets=8192", "--budgetbench-items=1",
                    "--budgetbench-strategies=truncation", "--budgetbench-retries=3")
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*EndpointUnavailable: model endpoint * failed after 3 attempt(s)*"])
    (row,) = rows_of(tmp_path)
    assert row["status"] == "error"
    assert row["quality"] is None and row["prediction"] is None


def test_unreachable_endpoint_is_one_clear_error_before_any_cell(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    result = pytester.runpytest_subprocess(
        "--budgets=512", f"--budgetbench-endpoint={dead}",
        f"--budgetbench-out={tmp_path}", "--budgetbench-tokenizer=approx",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*budgetbench: model endpoint * is not usable*"])
    assert not list(tmp_path.glob("*/cells.jsonl"))


def test_violation_gate_sets_exit_status_and_says_why(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    add_greedy_strategy(pytester)
    common = sweep_args(fake_endpoint, tmp_path, "--budgets=512,8192", "--budgetbench-items=2",
                        "--budgetbench-strategies=greedy:Greedy,full_context")
    # In a subprocess: the gate builds a pandas report, and numpy cannot be re-imported
    # inside one process, which in-process pytester runs would need.
    failing = pytester.runpytest_subprocess(*common, "--budgetbench-max-violation-rate=0.25")
    assert failing.ret == pytest.ExitCode.TESTS_FAILED
    failing.stdout.fnmatch_lines(
        ["*budgetbench gate failed: greedy@512: violation rate 100.0% (2/2 prompts) exceeds "
         "the maximum 25.0% by 75.0 percentage points*"]
    )
    # Violations are judged in aggregate by the gate, so the cells themselves xfail; the
    # gates are items of their own (none for the reference, full_context), and one fails.
    failing.assert_outcomes(passed=5, failed=1, xfailed=4)
    passing = pytester.runpytest_subprocess(*common, "--budgetbench-max-violation-rate=1")
    assert passing.ret == pytest.ExitCode.OK


def test_budget_cell_fixture_parametrizes_user_tests(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyfile(
        test_mine="""
        def test_admitted_cells_answer(budget_cell):
            if budget_cell.status == "ok":
                assert budget_cell.prediction
                assert budget_cell.row["counted_tokens"] <= budget_cell.cell.budget
        """
    )
    result = pytester.runpytest(
        *sweep_args(fake_endpoint, tmp_path, "--budgets=8192", "--budgetbench-items=2", "-v")
    )
    assert "test_admitted_cells_answer[memory-0000-truncation-8192] PASSED" in result.stdout.str()
    result.assert_outcomes(passed=8)
    # The user's test and the generated cell share one run of each cell: one row each.
    assert len(rows_of(tmp_path)) == 4


def test_every_row_arrives_exactly_once_under_xdist(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    result = pytester.runpytest_subprocess(
        *sweep_args(fake_endpoint, tmp_path, "--budgets=512,1024,8192", "--budgetbench-items=4",
                    "-n", "2")
    )
    result.assert_outcomes(passed=16, xfailed=8)
    ids = [r["cell_id"] for r in rows_of(tmp_path)]
    assert len(ids) == 24 and len(set(ids)) == 24
    result.stdout.fnmatch_lines(["*budgetbench summary*"])


def test_plugin_import_is_cheap() -> None:
    code = (
        "import sys, pytest_budgetbench.plugin; "
        "print(sorted({'torch','transformers','chromadb','openai','pandas','llama_cpp'}"
        " & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_harm_shown_regression_gate_fails_a_significant_drop_and_passes_a_rerun(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytester.makepyfile(
        forgetful="""
        import os
        from pytest_budgetbench.messages import split_ends
        from pytest_budgetbench.strategies import Strategy

        class Forgetful(Strategy):
            name = "forgetful"

            def apply(self, messages, budget):
                head, history, query = split_ends(messages)
                return head + query if os.environ.get("FORGET") else list(messages)
        """
    )
    pytester.syspathinsert()

    def sweep(out: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess(
            f"--budgetbench-endpoint={fake_endpoint.base_url}", "--budgetbench-tokenizer=approx",
            f"--budgetbench-out={tmp_path / out}", "--budgets=8192", "--budgetbench-items=20",
            "--budgetbench-strategies=forgetful:Forgetful", "--budgetbench-resamples=2000",
            *(
                [f"--budgetbench-baseline={baseline}", "--budgetbench-max-regression=0.1",
                 "--budgetbench-regression-test=harm"]
                if out != "base" else []
            ),
        )

    assert sweep("base").ret == pytest.ExitCode.OK
    (baseline,) = (tmp_path / "base").glob("*/report/report.json")

    same = sweep("same")
    assert same.ret == pytest.ExitCode.OK
    # It passed, but 20 items cannot detect a drop of 0.1, and the summary says so.
    same.stdout.fnmatch_lines(["budgetbench gate warning: memory: forgetful@8192: harm-shown "
                               "test passed but cannot detect a drop of 0.1 with n=20 *"])

    monkeypatch.setenv("FORGET", "1")
    worse = sweep("worse")
    assert worse.ret == pytest.ExitCode.TESTS_FAILED
    worse.stdout.fnmatch_lines(["*budgetbench gate failed: *forgetful*8192*"])


def test_non_inferiority_gate_fails_a_small_unchanged_run_and_passes_a_large_one(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    """The default regression test: an unchanged strategy over 10 items cannot exclude a
    drop of 0.05 (its interval is +-0.28), so the gate fails and says why; over 200 items
    (+-0.019) it passes."""
    def sweep(out: str, items: int, *gate: str) -> pytest.RunResult:
        return pytester.runpytest(
            f"--budgetbench-endpoint={fake_endpoint.base_url}", "--budgetbench-tokenizer=approx",
            f"--budgetbench-out={tmp_path / out}", "--budgets=8192",
            f"--budgetbench-items={items}", "--budgetbench-strategies=truncation",
            "--budgetbench-progress=0", "-p", "no:cacheprovider", *gate)

    assert sweep("base", 200).ret == pytest.ExitCode.OK
    (baseline,) = (tmp_path / "base").glob("*/report/report.json")
    gate = (f"--budgetbench-baseline={baseline}", "--budgetbench-max-regression=0.05")

    small = sweep("small", 10, *gate)
    assert small.ret == pytest.ExitCode.TESTS_FAILED
    small.assert_outcomes(passed=10, failed=1)
    (failed,) = [line for line in small.stdout.lines
                 if line.startswith("budgetbench gate failed:")]
    quality, retention = failed.split("; memory: ")
    assert quality == (
        "budgetbench gate failed: memory: truncation@8192: non-inferiority test failed: the "
        "lower bound -0.278 of the 95% interval of the change is not above the margin -0.05, "
        "so a drop of more than 0.05 is not excluded; with n=10 it cannot be: even with no "
        "flip it takes 73 items (change +0.000 over 10 paired items, 95% CI [-0.278, +0.278] "
        "(score interval), margin 0.05, MDE 0.616, 0 right->wrong and 0 wrong->right "
        "(McNemar exact p=1))")
    # Retention is paired too: 8 of the 10 items declare evidence, too few to exclude 0.05.
    assert retention.startswith("truncation@8192 evidence retention: non-inferiority test "
                                "failed: the lower bound -0.324 ")

    large = sweep("large", 200, *gate)
    assert large.ret == pytest.ExitCode.OK
    large.assert_outcomes(passed=201)
    assert "budgetbench gate" not in large.stdout.str()
    # Each run asked the model itself (none read another's cache): 200 + 10 + 200.
    assert len(fake_endpoint.requests) == 410


def test_pytest_benchmark_times_each_model_call_once_with_quality(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The inner run is not an xdist worker, even when this test runs in one.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    result = pytester.runpytest(
        *sweep_args(fake_endpoint, tmp_path, "--budgets=8192", "--budgetbench-items=1",
                    "--budgetbench-strategies=truncation",
                    f"--benchmark-json={tmp_path / 'bench.json'}")
    )
    result.assert_outcomes(passed=1)
    (bench,) = json.loads((tmp_path / "bench.json").read_text())["benchmarks"]
    assert bench["stats"]["rounds"] == 1 and bench["stats"]["iterations"] == 1
    assert bench["extra_info"]["quality"] in (0.0, 1.0)
    assert bench["extra_info"]["counted_tokens"] > 0
    assert bench["group"] == "memory truncation@8192"  # one table per strategy@budget
    assert len(fake_endpoint.requests) == 1


@pytest.mark.parametrize(
    "flag", ["--budgetbench-data-longbench_v2", "--budgetbench-data-longbench-v2"]
)
def test_missing_dataset_is_one_clear_line_naming_task_and_file(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path, flag: str
) -> None:
    missing = tmp_path / "nowhere" / "data.json"
    result = pytester.runpytest(
        *sweep_args(fake_endpoint, tmp_path, "--budgets=2048", "--budgetbench-tasks=longbench_v2",
                    f"{flag}={missing}")
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    (line,) = [ln for ln in result.stderr.lines if "longbench_v2" in ln]
    assert str(missing) in line and "--budgetbench-data-longbench_v2=PATH" in line


def test_image_task_is_skipped_with_its_reason_on_a_text_only_endpoint(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    result = pytester.runpytest(
        *sweep_args(fake_endpoint, tmp_path, "--budgets=2048", "--budgetbench-items=1",
                    "--budgetbench-tasks=image_probe", "--budgetbench-strategies=truncation",
                    "-rs")
    )
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*image_probe needs a vision endpoint*"])
    assert fake_endpoint.requests == []


def test_image_task_runs_when_the_endpoint_is_declared_vision_capable(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    result = pytester.runpytest(
        *sweep_args(fake_endpoint, tmp_path, "--budgets=2048", "--budgetbench-items=1",
                    "--budgetbench-tasks=image_probe", "--budgetbench-strategies=truncation",
                    "--budgetbench-vision=on")
    )
    result.assert_outcomes(passed=1)
    (request,) = fake_endpoint.requests
    parts = [p for m in request["messages"] if isinstance(m["content"], list) for p in m["content"]]
    assert any(p.get("type") == "image_url" for p in parts)


def test_the_summary_is_the_last_thing_before_pytests_own_closing_lines(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    """pytest-benchmark prints a timing table per strategy@budget at session end; the
    answer to the sweep (the summary and the run directory) must come after it."""
    pytest.importorskip("pytest_benchmark")
    result = pytester.runpytest(*sweep_args(fake_endpoint, tmp_path, "--budgets=2048",
                                            "--budgetbench-items=2"))
    assert result.ret == pytest.ExitCode.OK
    lines = result.outlines
    benchmark = max(i for i, line in enumerate(lines) if "benchmark" in line)
    summary = next(i for i, line in enumerate(lines) if "budgetbench summary" in line)
    run_dir = next(i for i, line in enumerate(lines) if line.startswith("run directory:"))
    assert benchmark < summary < run_dir


COUNT_BUILDS = """
import json, os

import pytest_budgetbench.reports as reports
from pytest_budgetbench.reports import builder, report_json

counts = {"compute": 0, "write_json": 0}
if hasattr(builder, "compute_report"):
    _compute = builder.compute_report

    def _counted_compute(*args, **kwargs):
        counts["compute"] += 1
        return _compute(*args, **kwargs)

    reports.compute_report = _counted_compute
_write_json = report_json.write_report_json


def _counted_write(*args, **kwargs):
    counts["write_json"] += 1
    return _write_json(*args, **kwargs)


report_json.write_report_json = _counted_write


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        with open(os.environ["COUNTS_FILE"], "w") as handle:
            json.dump(counts, handle)
"""


def test_four_gates_compute_the_report_once_and_write_it_once(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    add_greedy_strategy(pytester)
    pytester.makeconftest(COUNT_BUILDS)
    monkeypatch.setenv("COUNTS_FILE", str(tmp_path / "counts.json"))
    junit = tmp_path / "junit.xml"
    # In a subprocess, as numpy cannot be imported twice in one process.
    result = pytester.runpytest_subprocess(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=512,8192", "--budgetbench-items=2",
        "--budgetbench-strategies=greedy:Greedy,truncation", "--budgetbench-report=on",
        "--budgetbench-max-violation-rate=0.25", f"--junitxml={junit}"))
    # Four gates (two strategies x two budgets); greedy@512 fails, from its verdict.
    result.assert_outcomes(passed=9, failed=1, xfailed=2)
    result.stdout.fnmatch_lines(["*budgetbench gate failed: greedy@512: violation rate 100.0% "
                                 "(2/2 prompts) exceeds the maximum 25.0%*"])
    assert 'failures="1"' in junit.read_text()
    assert "budgetbench_gate" in junit.read_text()  # each gate's verdict, as a property
    counts = json.loads((tmp_path / "counts.json").read_text())
    # Before: each gate built and wrote the whole report, and the end once more (5 and 5).
    assert counts == {"compute": 1, "write_json": 1}
