"""A model-free sweep (--budgetbench-model=none): every prompt built, counted and held to
its budget, its evidence retention recorded, nothing sent; and the gates a team's CI runs
on it (a retention floor, non-inferiority of retention against a baseline)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.records.store import RunStore
from tests.fake_openai import FakeOpenAI
from tests.sweeps import rows_of

pytest_plugins = ["pytester"]

# A user's memory policy that keeps the system message, the newer half of the history and
# the question: what a careless change to a policy looks like. POLICY_KEEP=all keeps
# everything, so one strategy name can be the baseline's policy and the changed one.
POLICY = """
import os

from pytest_budgetbench.messages import split_ends
from pytest_budgetbench.strategies import Strategy


class DropOldestHalf(Strategy):
    name = "drop_oldest_half"

    def apply(self, messages, budget):
        head, history, query = split_ends(messages)
        if os.environ.get("POLICY_KEEP") != "all":
            history = history[len(history) // 2:]
        return head + history + query
"""


def model_free_args(tmp: Path, *extra: str) -> list[str]:
    return ["--budgetbench-model=none", f"--budgetbench-out={tmp / 'out'}",
            "-p", "no:cacheprovider", *extra]


def retention_by_cell(rows: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
    """Mean evidence retention of each strategy@budget over its admitted rows with evidence."""
    kept: dict[tuple[str, int], list[float]] = {}
    for row in rows:
        if row["status"] == "ok" and row["evidence_retention"] is not None:
            kept.setdefault((row["strategy"], row["budget"]), []).append(
                row["evidence_retention"])
    return {cell: sum(values) / len(values) for cell, values in kept.items()}


@pytest.fixture
def policy(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(policy=POLICY)
    pytester.syspathinsert()
    return pytester


@pytest.fixture(scope="module")
def default_model_dir() -> Path:
    """Where the default embedded model's GGUF is (found before pytester moves HOME)."""
    pytest.importorskip("llama_cpp")
    from pytest_budgetbench.embedded_server.models import QWEN, model_dir

    if not (model_dir() / QWEN.file_name).is_file():
        pytest.skip("the default model is not fetched (budgetbench fetch-model)")
    return model_dir()


def test_the_default_sweep_model_free_counts_exactly_and_shows_what_truncation_loses(
    pytester: pytest.Pytester, tmp_path: Path, default_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The README's sweep with --budgetbench-model=none: the embedded model's GGUF counts
    (exact), no server starts, no row is sent or graded, and retention shows what the
    model's answers show (full_context@8192 keeps the planted fact, truncation@2048 not)."""
    from pytest_budgetbench.embedded_server.models import MODEL_DIR_ENV

    monkeypatch.setenv(MODEL_DIR_ENV, str(default_model_dir))
    result = pytester.runpytest(*model_free_args(tmp_path, "--budgets=2048,8192"))
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    rows = rows_of(tmp_path)
    assert len(rows) == 60
    assert {r["status"] for r in rows} == {"ok", "violation"}
    assert all(r["model"] == "none" and r["endpoint"] == "none" for r in rows)
    assert all(r["tokenizer"].startswith("gguf:") and r["tokenizer_exact"] for r in rows)
    assert all(r["quality"] is None and r["prediction"] is None and r["model_s"] is None
               for r in rows)
    assert all(r["counted_tokens"] <= r["budget"] for r in rows if r["status"] == "ok")
    retention = retention_by_cell(rows)
    assert retention[("full_context", 8192)] == 1.0
    assert retention[("truncation", 2048)] < 0.5 < retention[("rag", 2048)]
    (cells,) = (tmp_path / "out").glob("*/cells.jsonl")
    assert not RunStore(cells.parent).server_log_path.exists(), "a model server was started"
    result.stdout.fnmatch_lines(["budgetbench: model-free sweep (--budgetbench-model=none): "
                                 "every prompt is built, counted (gguf:*) and held to its "
                                 "budget; nothing is sent and no model starts"])


def test_the_retention_floor_fails_a_policy_that_drops_the_oldest_half(
    policy: pytest.Pytester, tmp_path: Path
) -> None:
    junit = tmp_path / "junit.xml"
    result = policy.runpytest(*model_free_args(
        tmp_path, "--budgets=8192", "--budgetbench-tokenizer=approx",
        "--budgetbench-strategies=full_context,rag,policy:DropOldestHalf",
        "--budgetbench-min-retention=0.9", f"--junitxml={junit}"))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "FAILED budgetbench::gate[[]retention-floor drop_oldest_half@8192[]]*",
        "*1 failed, * passed*"])
    result.stdout.fnmatch_lines([
        "budgetbench gate failed: drop_oldest_half@8192: mean evidence retention 0.* over * "
        "admitted items that declare evidence is below the floor 0.900 (lowest: memory/* 0.00, *)"])
    assert "gate[retention-floor full_context" not in result.stdout.str()  # a reference
    rows = rows_of(tmp_path)
    # The mean is over the admitted items that declare evidence (abstentions declare none),
    # and the line says so, with their number.
    admitted = [r for r in rows if (r["strategy"], r["budget"], r["status"])
                == ("drop_oldest_half", 8192, "ok")]
    with_evidence = [r for r in admitted if r["evidence_retention"] is not None]
    assert 0 < len(with_evidence) < len(admitted)
    assert (f"over the {len(with_evidence)} admitted items that declare evidence"
            in result.stdout.str())
    retention = retention_by_cell(rows)
    assert retention[("rag", 8192)] >= 0.9
    # JUnit carries each gate's verdict: the mean it judged, failed or passed.
    verdicts = junit_gate_verdicts(junit)
    assert verdicts["drop_oldest_half"]["retention"] == retention[("drop_oldest_half", 8192)]
    assert verdicts["drop_oldest_half"]["reasons"] and not verdicts["rag"]["reasons"]
    assert verdicts["rag"]["retention"] == retention[("rag", 8192)]


def junit_gate_verdicts(junit: Path) -> dict[str, dict[str, Any]]:
    """Each gate test case's verdict property in a JUnit XML file, by strategy."""
    from xml.etree import ElementTree

    from pytest_budgetbench.pytest_face.sweep_tests import VERDICT_PROPERTY

    verdicts = [json.loads(prop.get("value", ""))
                for case in ElementTree.parse(junit).iter("testcase")
                for prop in case.iter("property") if prop.get("name") == VERDICT_PROPERTY]
    return {verdict["strategy"]: verdict for verdict in verdicts}


def sweep_with_one_named_floor(pytester: pytest.Pytester, tmp_path: Path, strategies: str,
                               floor: str) -> None:
    """A model-free sweep at 8192 whose only gate is the named ``floor``
    (STRATEGY@BUDGET=R): it runs, and that gate passes."""
    result = pytester.runpytest(*model_free_args(
        tmp_path, "--budgets=8192", "--budgetbench-tokenizer=approx", "-v",
        f"--budgetbench-strategies={strategies}", f"--budgetbench-min-retention={floor}"))
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    gates = [line for line in result.stdout.lines if "::gate[" in line]
    cell = floor.rpartition("=")[0]
    assert len(gates) == 1 and f"gate[retention-floor {cell}] PASSED" in gates[0]


def test_a_named_floor_judges_one_cell_and_the_report_command_judges_the_same(
    policy: pytest.Pytester, tmp_path: Path
) -> None:
    sweep_with_one_named_floor(policy, tmp_path, "full_context,rag,policy:DropOldestHalf",
                               "rag@8192=0.9")
    from pytest_budgetbench.commands.cli import main

    (cells,) = (tmp_path / "out").glob("*/cells.jsonl")
    run_dir = cells.parent
    assert main(["report", str(run_dir), "--no-plots", "--min-retention=rag@8192=0.9"]) == 0
    assert main(["report", str(run_dir), "--no-plots", "--min-retention=0.9"]) == 1


def test_a_reference_alone_is_gated_when_its_floor_is_named(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """The fix the one-line refusal of a floor over references alone suggests: naming the
    reference's floor makes its gate, and the sweep runs."""
    sweep_with_one_named_floor(pytester, tmp_path, "full_context", "full_context@8192=0.9")


def test_retention_is_gated_non_inferior_to_a_baseline_run(
    policy: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A team's CI: the baseline is the policy as it was (keeping everything); the changed
    policy drops the oldest half and fails the regression gate on retention alone (a
    model-free run has no quality), while the unchanged policy passes it."""
    common = ["--budgets=8192", "--budgetbench-tokenizer=approx", "--budgetbench-items=50",
              "--budgetbench-strategies=policy:DropOldestHalf"]
    monkeypatch.setenv("POLICY_KEEP", "all")
    policy.runpytest(*model_free_args(tmp_path / "before", *common))
    (before,) = (tmp_path / "before" / "out").glob("*/report/report.json")
    gate = [f"--budgetbench-baseline={before}", "--budgetbench-max-regression=0.1"]

    unchanged = policy.runpytest(*model_free_args(tmp_path / "same", *common, *gate))
    assert unchanged.ret == pytest.ExitCode.OK, unchanged.stdout.str()
    unchanged.stdout.fnmatch_lines(["*51 passed*"])  # 50 cells and the gate

    monkeypatch.setenv("POLICY_KEEP", "half")
    changed = policy.runpytest(*model_free_args(tmp_path / "after", *common, *gate))
    assert changed.ret == pytest.ExitCode.TESTS_FAILED
    changed.stdout.fnmatch_lines([
        "budgetbench gate failed: memory: drop_oldest_half@8192 evidence retention: "
        "non-inferiority test failed: the lower bound -* of the 95% interval of the change "
        "is not above the margin -0.1, *"])
    document = json.loads(before.read_text())
    (cell,) = document["items"]
    assert len(cell["evidence_retention"]) == 50  # what the gate pairs on, item by item


@pytest.mark.parametrize(("extra", "expected"), [
    (["--budgetbench-endpoint={url}"],
     "*--budgetbench-model=none sends nothing, but --budgetbench-endpoint=http://127.0.0.1:* "
     "is given (or BUDGETBENCH_ENDPOINT): drop the endpoint, and count with your model's "
     "tokenizer, --budgetbench-tokenizer=hf:DIR or gguf:FILE"),
    (["--budgetbench-tokenizer=server"],
     "*--budgetbench-model=none starts no server, so --budgetbench-tokenizer=server has none "
     "to ask: *"),
    (["--budgetbench-strategies=full_context,summary_buffer,condenser"],
     "*--budgetbench-model=none sends nothing, but strategies 'summary_buffer', 'condenser' "
     "call an auxiliary model: leave them out, or name the model with "
     "--budgetbench-aux-models=aux=URL#MODEL"),
    (["--budgetbench-tasks=agent_lookup", "--budgetbench-strategies=full_context"],
     "*--budgetbench-model=none cannot run task 'agent_lookup' free-running: its agent "
     "episodes are driven by the model's replies; pass --budgetbench-episodes=teacher-forced "
     "to count each step of its reference trajectory, or give a model"),
    (["--budgetbench-min-retention=0.9,truncation@4096=0.5"],
     "*--budgetbench-min-retention: truncation@4096 is not a strategy@budget of this sweep "
     "(it runs full_context@2048, rag@2048, truncation@2048); name one it runs"),
    (["--budgetbench-min-retention=1.5"],
     "*--budgetbench-min-retention must be a floor R between 0 and 1 *(got '1.5' in '1.5')"),
])
def test_what_a_model_free_sweep_cannot_run_is_one_line_before_any_cell(
    pytester: pytest.Pytester, tmp_path: Path, fake_endpoint: FakeOpenAI,
    extra: list[str], expected: str
) -> None:
    args = [a.replace("{url}", fake_endpoint.base_url) for a in extra]
    result = pytester.runpytest(*model_free_args(
        tmp_path, "--budgets=2048", "--budgetbench-tokenizer=approx", *args))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])
    assert not list((tmp_path / "out").glob("*/run.json"))
    assert fake_endpoint.requests == []


def test_a_floor_over_tasks_without_evidence_is_refused(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(plain_task="""
        from pytest_budgetbench.tasks import Grade, Item, Task

        class Plain(Task):
            name = "plain"
            grader_version = "plain/1"

            def load(self):
                return [Item("q", ({"role": "user", "content": "Say hi."},), "hi", "plain")]

            def grade(self, item, prediction):
                return Grade(1.0, prediction, self.grader_version)
        """)
    pytester.syspathinsert()
    result = pytester.runpytest(*model_free_args(
        tmp_path, "--budgets=2048", "--budgetbench-tokenizer=approx",
        "--budgetbench-tasks=plain_task:Plain", "--budgetbench-min-retention=0.9"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "*--budgetbench-min-retention: no item of the sweep's tasks (plain) declares "
        "evidence, so there is no retention to gate on; *"])


def test_a_strategy_that_calls_the_auxiliary_model_undeclared_errors_its_cell(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """A strategy that does not declare it needs a model, and asks one, errors its cell with
    the line that says how to give it one; the sweep goes on."""
    pytester.makepyfile(asker="""
        from pytest_budgetbench.strategies import Strategy

        class Asker(Strategy):
            name = "asker"

            def apply(self, messages, budget):
                self.context.aux.complete(list(messages)[-1:], max_tokens=8, purpose="ask")
                return list(messages)
        """)
    pytester.syspathinsert()
    result = pytester.runpytest(*model_free_args(
        tmp_path, "--budgets=8192", "--budgetbench-tokenizer=approx", "--budgetbench-items=2",
        "--budgetbench-strategies=full_context,asker:Asker"))
    rows = rows_of(tmp_path)
    asked = [r for r in rows if r["strategy"] == "asker"]
    assert [r["status"] for r in asked] == ["error", "error"]
    assert "a model-free sweep (--budgetbench-model=none) has no model to answer an " \
           "auxiliary call: name one with --budgetbench-aux-models=aux=URL#MODEL" \
           in asked[0]["error"]
    assert {r["status"] for r in rows if r["strategy"] == "full_context"} == {"ok"}
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_a_strategy_that_needs_a_model_runs_with_the_auxiliary_model_named(
    pytester: pytest.Pytester, tmp_path: Path, fake_endpoint: FakeOpenAI
) -> None:
    """summary_buffer summarises with the model named aux; the cell's own prompt is still
    not sent: every request the endpoint saw is the strategy's."""
    result = pytester.runpytest(*model_free_args(
        tmp_path, "--budgets=1024", "--budgetbench-tokenizer=approx", "--budgetbench-items=2",
        "--budgetbench-strategies=summary_buffer",
        f"--budgetbench-aux-models=aux={fake_endpoint.base_url}"))
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    rows = rows_of(tmp_path)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert all(r["aux_calls"] and r["quality"] is None for r in rows)
    sent = sum(len(r["aux_calls"]) for r in rows)
    assert sent == len(fake_endpoint.requests) > 0  # the auxiliary calls, nothing else


def test_the_terminal_summary_reads_model_free_rows_without_the_report(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """Without the report (off, or its extra missing) the summary comes from the rows, whose
    model fields are empty where nothing was sent."""
    result = pytester.runpytest(*model_free_args(
        tmp_path, "--budgets=2048,8192", "--budgetbench-tokenizer=approx",
        "--budgetbench-report=off", "--budgetbench-strategies=full_context,truncation"))
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    header = next(line for line in result.stdout.lines
                  if "strategy" in line and "retention" in line).split()
    line = next(line for line in result.stdout.lines
                if line.split()[:2] == ["truncation", "2048"]).split()
    kept = retention_by_cell(rows_of(tmp_path))[("truncation", 2048)]
    # retention, then answer kept (memory gives its gold answers); no model seconds.
    assert header[-3:] == ["retention", "ans.kept", "unique"]
    assert line[-3] == f"{kept:.3f}" and line[-5] == "-"
