"""Cells and gates are pytest tests: counted, selected, rerun and reported by pytest itself.

Each test runs pytest through pytester in a project of its own, against the fake endpoint.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_budgetbench.pytest_face.progress import SweepProgress
from tests.fake_openai import FakeOpenAI
from tests.sweeps import add_greedy_strategy

USER_TESTS = """
def test_add():
    assert 1 + 1 == 2

def test_sub():
    assert 2 - 1 == 1
"""


def args(fake: FakeOpenAI, tmp: Path, *extra: str) -> list[str]:
    """A sweep of 2 items x 2 strategies x 2 budgets: 8 cells. The cache provider stays on
    (--lf needs it)."""
    return [
        "--budgets=512,8192",
        "--budgetbench-items=2",
        "--budgetbench-strategies=full_context,truncation",
        f"--budgetbench-endpoint={fake.base_url}",
        "--budgetbench-tokenizer=approx",
        f"--budgetbench-out={tmp / 'out'}",
        "--budgetbench-report=off",
        "--budgetbench-progress=0",
        "-p", "no:randomly",
        "-p", "no:benchmark",
        *extra,
    ]


def glob(text: str) -> str:
    """``text`` as a literal fnmatch pattern (node ids hold brackets)."""
    return re.sub(r"([\[\]])", r"[\1]", text)


def listed(result: pytest.RunResult) -> list[str]:
    return [ln for ln in result.stdout.lines if "::" in ln and not ln.startswith(" ")]


# -- counts ---------------------------------------------------------------------------------
def test_header_counts_cells_beside_the_users_tests(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyfile(test_unit=USER_TESTS)
    result = pytester.runpytest(*args(fake_endpoint, tmp_path))
    result.stdout.fnmatch_lines(["collected 10 items"])
    result.assert_outcomes(passed=8, xfailed=2)


@pytest.mark.parametrize(
    ("selection", "selected", "deselected"),
    [
        (["-k", "truncation and 512"], 2, 8),
        (["-m", "budgetbench"], 8, 2),
        (["-m", "not budgetbench"], 2, 8),
        (["--deselect", "budgetbench::cell[memory-0000-truncation-512]"], 9, 1),
        (["-k", "test_add"], 1, 9),
    ],
)
def test_collect_only_counts_what_it_lists(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    selection: list[str], selected: int, deselected: int,
) -> None:
    pytester.makepyfile(test_unit=USER_TESTS)
    result = pytester.runpytest(*args(fake_endpoint, tmp_path, "--co", "-q", *selection))
    assert len(listed(result)) == selected
    result.stdout.fnmatch_lines([f"{selected}/10 tests collected ({deselected} deselected)*"])


def test_collect_only_lists_and_counts_every_cell(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    result = pytester.runpytest(*args(fake_endpoint, tmp_path, "--co", "-q"))
    ids = listed(result)
    assert len(ids) == 8 and all(i.startswith("budgetbench::cell[memory-") for i in ids)
    result.stdout.fnmatch_lines(["8 tests collected*"])


# -- --lf / --ff ----------------------------------------------------------------------------
def test_last_failed_and_failed_first_select_exactly_the_failed_cells(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    add_greedy_strategy(pytester)
    pytester.makepyfile(test_unit=USER_TESTS)
    sweep = args(fake_endpoint, tmp_path, "--budgetbench-strategies=greedy:Greedy,truncation")
    first = pytester.runpytest(*sweep)
    # greedy sends the whole history: over budget at 512, so those two cells fail.
    first.assert_outcomes(passed=8, failed=2)
    failed = sorted(re.findall(r"FAILED (budgetbench::cell\[\S+\])", first.stdout.str()))
    assert failed == ["budgetbench::cell[memory-0000-greedy-512]",
                      "budgetbench::cell[memory-0001-greedy-512]"]

    rerun = pytester.runpytest(*sweep, "--lf", "-v")
    # pytest's --lf skips the file without failures and deselects the 6 passed cells.
    rerun.assert_outcomes(failed=2, deselected=6)
    rerun.stdout.fnmatch_lines(["run-last-failure: rerun previous 2 failures (skipped 1 file)"])
    assert sorted(re.findall(r"^(budgetbench::\S+) FAILED", rerun.stdout.str(), re.M)) == failed

    first_failed = pytester.runpytest(*sweep, "--ff", "-v")
    first_failed.assert_outcomes(passed=8, failed=2)
    ran = re.findall(r"^(\S+::\S+) (?:PASSED|FAILED)", first_failed.stdout.str(), re.M)
    assert sorted(ran[:2]) == failed


# -- node ids as arguments ------------------------------------------------------------------
def test_an_id_from_collect_only_runs_exactly_that_cell(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyfile(test_unit=USER_TESTS)
    ids = [i for i in listed(pytester.runpytest(*args(fake_endpoint, tmp_path, "--co", "-q")))
           if i.startswith("budgetbench::")]
    chosen = ids[3]
    result = pytester.runpytest(*args(fake_endpoint, tmp_path, chosen, "-v"))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"{glob(chosen)} PASSED*"])


def test_an_id_from_a_failure_heading_runs_exactly_that_cell(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    add_greedy_strategy(pytester)
    sweep = args(fake_endpoint, tmp_path, "--budgetbench-strategies=greedy:Greedy",
                 "--budgets=512", "-p", "no:cacheprovider")
    first = pytester.runpytest(*sweep)
    headings = re.findall(r"^_+ (\S+) _+$", first.stdout.str(), re.M)
    assert headings == ["budgetbench::cell[memory-0000-greedy-512]",
                        "budgetbench::cell[memory-0001-greedy-512]"]
    again = pytester.runpytest(*sweep, headings[1], "-v")
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines([f"{glob(headings[1])} FAILED*"])


def test_ids_run_exactly_their_cells_under_xdist(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyfile(test_unit=USER_TESTS)
    chosen = ["budgetbench::cell[memory-0001-truncation-512]",
              "budgetbench::cell[memory-0000-full_context-8192]"]
    result = pytester.runpytest_subprocess(
        *args(fake_endpoint, tmp_path, *chosen, "test_unit.py::test_add", "-n", "2", "-v")
    )
    result.assert_outcomes(passed=3)
    ran = sorted(re.findall(r"PASSED (\S+)", result.stdout.str()))
    assert ran == sorted([*chosen, "test_unit.py::test_add"])


def test_an_id_that_names_no_cell_is_a_usage_error(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    result = pytester.runpytest(*args(fake_endpoint, tmp_path, "budgetbench::cell[nope-1]"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*not found: {glob('budgetbench::cell[nope-1]')}*--co -q*"])


def test_naming_only_a_test_file_leaves_the_sweep_out(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyfile(test_unit=USER_TESTS)
    result = pytester.runpytest(*args(fake_endpoint, tmp_path, "test_unit.py::test_add"))
    result.assert_outcomes(passed=1)
    assert "budgetbench summary" not in result.stdout.str()
    assert fake_endpoint.requests == []


# -- gates ----------------------------------------------------------------------------------
def test_a_failing_gate_is_a_failure_in_junit_and_the_final_line(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    add_greedy_strategy(pytester)
    junit = tmp_path / "junit.xml"
    # In a subprocess: the gate builds a pandas report (numpy cannot be re-imported).
    result = pytester.runpytest_subprocess(*args(
        fake_endpoint, tmp_path, "--budgetbench-strategies=greedy:Greedy,truncation",
        "--budgetbench-max-violation-rate=0.1", f"--junitxml={junit}",
    ))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # greedy over budget at 512 only: one gate fails, three pass; cells over budget xfail.
    result.assert_outcomes(passed=9, failed=1, xfailed=2)
    result.stdout.fnmatch_lines([
        f"FAILED {glob('budgetbench::gate[violation-rate greedy@512]')} - *",
        "*1 failed, 9 passed, 2 xfailed*",
    ])
    cases = {c.get("name"): c for c in ET.parse(junit).iter("testcase")
             if c.get("classname") == "budgetbench" and c.get("name", "").startswith("gate")}
    assert set(cases) == {f"gate[violation-rate {s}@{b}]"
                          for s in ("greedy", "truncation") for b in (512, 8192)}
    failure = cases["gate[violation-rate greedy@512]"].find("failure")
    assert failure is not None and "violation rate 100.0% (2/2 prompts)" in failure.get(
        "message", "")
    assert cases["gate[violation-rate truncation@512]"].find("failure") is None
    assert ET.parse(junit).getroot().find("testsuite").get("failures") == "1"  # type: ignore[union-attr]


def test_gates_under_xdist_wait_for_the_cells_of_other_workers(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    add_greedy_strategy(pytester)
    fake_endpoint.latency_s = 0.05  # cells still running elsewhere when a gate starts
    result = pytester.runpytest_subprocess(*args(
        fake_endpoint, tmp_path, "--budgetbench-strategies=greedy:Greedy,truncation",
        "--budgetbench-items=4", "--budgetbench-max-violation-rate=0.1", "-n", "2",
    ))
    result.assert_outcomes(passed=15, failed=1, xfailed=4)
    result.stdout.fnmatch_lines(
        ["*budgetbench gate failed: greedy@512: violation rate 100.0% (4/4 prompts)*"]
    )
    ids = [r["cell_id"] for r in _rows(tmp_path)]
    assert len(ids) == len(set(ids)) == 16  # a gate never reruns another worker's cell


def _rows(tmp: Path) -> list[dict]:
    import json

    (cells,) = (tmp / "out").glob("*/cells.jsonl")
    return [json.loads(line) for line in cells.read_text().splitlines()]


def test_a_gate_over_no_admitted_cell_fails_and_says_why(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    fake_endpoint.faults = ["500"] * 50  # every model call fails, so every cell errors
    result = pytester.runpytest_subprocess(*args(
        fake_endpoint, tmp_path, "--budgets=8192", "--budgetbench-strategies=truncation",
        "--budgetbench-retries=1", "--budgetbench-max-violation-rate=0.5",
    ))
    result.assert_outcomes(errors=2, failed=1)
    result.stdout.fnmatch_lines(
        ["*truncation@8192: no cell was admitted or over budget (2 errored*"]
    )


# -- selection ------------------------------------------------------------------------------
def test_budgetbench_only_runs_cells_and_budget_cell_tests(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyfile(
        test_unit=USER_TESTS + "\n\ndef test_fits(budget_cell):\n    assert budget_cell.row\n"
    )
    result = pytester.runpytest(*args(fake_endpoint, tmp_path, "--budgetbench-only"))
    result.assert_outcomes(passed=14, xfailed=2, deselected=2)


def test_ini_budgets_are_switched_off_on_the_command_line(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyfile(
        test_unit=USER_TESTS + "\n\ndef test_fits(budget_cell):\n    assert budget_cell.row\n"
    )
    pytester.makepyprojecttoml(
        "[tool.pytest.ini_options]\nbudgetbench_budgets = [512, 2048]\n"
    )
    on = pytester.runpytest(*args(fake_endpoint, tmp_path)[1:], "--co", "-q")
    assert "budgetbench::cell[memory-0000-full_context-2048]" in listed(on)
    off = pytester.runpytest(*args(fake_endpoint, tmp_path)[1:], "--budgets=off", "-rs")
    off.assert_outcomes(passed=2, skipped=1)
    off.stdout.fnmatch_lines(["SKIPPED*no sweep runs: pass --budgets=N,N*"])
    assert fake_endpoint.requests == []


def test_a_toml_list_of_budgets_works(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyprojecttoml(
        "[tool.pytest.ini_options]\nbudgetbench_budgets = [2048, 512]\n"
        'budgetbench_strategies = ["truncation"]\n'
    )
    result = pytester.runpytest(
        *[a for a in args(fake_endpoint, tmp_path) if not a.startswith(("--budgets=",
                                                                         "--budgetbench-str"))],
        "--co", "-q", "-W", "error::pytest.PytestWarning",
        # In-process, the plugin is already imported: that warning is pytester's, not ours.
        "-W", "ignore::pytest.PytestAssertRewriteWarning",
    )
    assert listed(result) == [f"budgetbench::cell[memory-000{i}-truncation-{b}]"
                              for i in (0, 1) for b in (512, 2048)]


def test_budget_cell_tests_skip_with_a_reason_without_a_sweep(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine="def test_fits(budget_cell):\n    assert budget_cell\n")
    result = pytester.runpytest("-rs", "-p", "no:randomly")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*no sweep runs: pass --budgets=N,N*"])


def test_a_failed_budget_cell_assertion_shows_a_short_repr(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    pytester.makepyfile(
        test_mine="def test_fits(budget_cell):\n    assert budget_cell.status == 'nope'\n"
    )
    result = pytester.runpytest(*args(
        fake_endpoint, tmp_path, "--budgets=8192", "--budgetbench-items=1",
        "--budgetbench-strategies=truncation", "--budgetbench-only",
    ))
    result.assert_outcomes(passed=1, failed=1)
    assert "<CellResult memory-0000-truncation-8192 ok quality=" in result.stdout.str()
    assert "'messages'" not in result.stdout.str()


# -- progress -------------------------------------------------------------------------------
def test_progress_writes_a_line_every_n_seconds_off_a_tty(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    sweep = [a for a in args(fake_endpoint, tmp_path) if not a.startswith("--budgetbench-prog")]
    result = pytester.runpytest(*sweep, "--budgetbench-progress=0.000001")
    lines = [ln for ln in result.stdout.lines if "budgetbench progress:" in ln]
    assert len(lines) == 8
    assert "memory: 8/8 cells" in lines[-1] and "quality@8192:" in lines[-1]
    quiet = pytester.runpytest(*sweep, "--budgetbench-progress=0.000001", "-q")
    assert "budgetbench progress:" not in quiet.stdout.str()


class FakeReporter:
    def __init__(self) -> None:
        self.rewritten: list[str] = []
        self.lines: list[str] = []

    def rewrite(self, line: str, **_: object) -> None:
        self.rewritten.append(line)

    def write_line(self, line: str, **_: object) -> None:
        self.lines.append(line)


def note(strategy: str, budget: int, quality: float | None, cached: bool = False) -> list:
    return [("budgetbench", {"task": "memory", "strategy": strategy, "budget": budget,
                             "status": "ok" if quality is not None else "violation",
                             "quality": quality, "cached": cached})]


def test_progress_is_rewritten_in_place_on_a_tty_with_eta_means_and_cache_hits() -> None:
    now = [0.0]
    reporter = FakeReporter()
    progress = SweepProgress(reporter, interval=30, in_place=True, clock=lambda: now[0])
    progress.expect({"memory": 4})
    for seconds, entry in [(10, note("rag", 512, 1.0)), (20, note("rag", 2048, 0.0, True)),
                           (30, note("truncation", 2048, 1.0))]:
        now[0] = seconds
        progress.add(entry)
    assert reporter.lines == [] and len(reporter.rewritten) == 3
    assert reporter.rewritten[-1] == (
        "budgetbench memory: 3/4 cells | ETA 10s | quality@2048: rag 0.00, truncation 1.00 | "
        "cache hits 1"
    )
    progress.close()
    assert reporter.lines == [""]


def test_the_eta_follows_the_newest_cells_after_a_cached_start() -> None:
    """A resumed run: 100 cells from the cache in a second, then one every 10 s. The ETA
    is the newest cells' pace (70 cells left, 700 s), not the mean since the start (which
    said under 3 minutes)."""
    now = [0.0]
    reporter = FakeReporter()
    progress = SweepProgress(reporter, interval=30, in_place=True, clock=lambda: now[0])
    progress.expect({"memory": 200})
    for cell in range(130):
        now[0] = cell / 100 if cell < 100 else 1 + 10 * (cell - 99)
        progress.add(note("rag", 512, 1.0, cached=cell < 100))
    assert "| ETA 11m40s |" in reporter.rewritten[-1]


def test_progress_off_a_tty_waits_its_interval() -> None:
    now = [0.0]
    reporter = FakeReporter()
    progress = SweepProgress(reporter, interval=30, in_place=False, clock=lambda: now[0])
    progress.expect({"memory": 10})
    for seconds in (10, 20, 31, 40, 65):
        now[0] = seconds
        progress.add(note("rag", 512, 1.0))
    assert [ln.split(" | ")[0] for ln in reporter.lines] == [
        "budgetbench progress: memory: 3/10 cells", "budgetbench progress: memory: 5/10 cells"
    ]
    assert reporter.rewritten == []


# -- the end of a sweep ---------------------------------------------------------------------
def test_the_default_reference_falls_back_to_the_cell_that_pairs_most() -> None:
    from pytest_budgetbench.reports.tables import pairing_reference

    default = ("full_context", 2048)
    assert pairing_reference(default, {default: 1, ("truncation", 2048): 9}) == default
    assert pairing_reference(default, {("truncation", 512): 4, ("truncation", 2048): 9,
                                       ("rag", 2048): 9}) == ("rag", 2048)
    assert pairing_reference(default, {("truncation", 512): 9, ("rag", 2048): 9}) == (
        "rag", 2048)  # a tie goes to the larger budget
    assert pairing_reference(default, {}) == default


def _row(strategy: str, budget: int, status: str, quality: float | None = None) -> dict:
    return {"task": "memory", "strategy": strategy, "budget": budget, "status": status,
            "quality": quality, "counted_tokens": 3200 if status == "violation" else 400,
            "reference": strategy == "full_context"}


def test_the_summary_says_which_reference_pairs_or_why_none_does() -> None:
    from pytest_budgetbench.reports.terminal import reference_notes

    over = [_row("full_context", b, "violation") for b in (512, 2048)]
    (fallback,) = reference_notes([*over, _row("truncation", 2048, "ok", 1.0)])
    assert "default reference full_context@2048 admitted no item" in fallback
    assert "pairs against truncation@2048" in fallback
    (empty,) = reference_notes([*over, _row("greedy", 512, "violation")])
    assert "the paired table is empty" in empty and "need up to 3200 tokens" in empty
    assert "--budgetbench-reference=STRATEGY@BUDGET" in empty
    assert reference_notes([_row("full_context", 2048, "ok", 1.0)]) == []


def test_the_final_table_has_the_admitted_count_and_a_95_percent_interval(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    # Memory histories are ~3.2K tokens: full_context admits nothing at 512 or 2048.
    result = pytester.runpytest(
        *args(fake_endpoint, tmp_path, "--budgetbench-items=6", "--budgets=512,2048")
    )
    result.stdout.fnmatch_lines([
        "*strategy*budget*n*admitted*quality*95% CI*viol.rate*",
        "*full_context (ref)*512*6*0*-*-*1.000*",
        "*truncation*2048*6*6*0.*[[]0.*, *[]]*0.000*",
        "*the default reference full_context@2048 admitted no item, so the paired table "
        "pairs against truncation@2048*",
    ])


def test_the_report_pairs_against_the_fallback_reference(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    import csv

    sweep = [a for a in args(fake_endpoint, tmp_path) if a != "--budgetbench-report=off"]
    # In a subprocess: the report is built with pandas (numpy cannot be re-imported).
    pytester.runpytest_subprocess(*sweep, "--budgets=512,2048", "--budgetbench-report=on")
    (paired,) = (tmp_path / "out").glob("*/report/paired.csv")
    rows = list(csv.DictReader(paired.open()))
    assert {(r["ref_strategy"], r["ref_budget"]) for r in rows} == {("truncation", "2048")}
    truncation_512 = next(r for r in rows if (r["strategy"], r["budget"]) == ("truncation", "512"))
    assert int(truncation_512["n_paired"]) == 2
