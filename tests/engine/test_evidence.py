"""Evidence retention (issue 33): the runner counts, on the prompt as sent, the item's
evidence spans it holds verbatim; rows, episode calls, the summary and the preflight."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.engine.evidence import (
    Retention,
    TrajectoryEvidence,
    missing_evidence,
    retention,
    spans_kept,
    tally,
    texts_of,
)
from pytest_budgetbench.records.prompts import PROMPTS_FILE, PromptRecord, SpanKept
from pytest_budgetbench.reports.synthetic import make_row, write_run
from tests.engine.test_episodes import agent, episodes_of, lookup_args  # noqa: F401 (a fixture)
from tests.fake_openai import FakeOpenAI
from tests.sweeps import rows_of, sweep_args

pytest_plugins = ["pytester"]

# Six history messages of about 100 approximate tokens each (three exchanges), then the
# question. "code ALPHA-1" is in the oldest message, "code OMEGA-9" in the newest exchange:
# at a budget of 256, truncation keeps only the newest exchange, so one of two is kept.
TASK = """
from pytest_budgetbench.tasks import Grade, Item, Task

PAD = " filler" * 55


def history(facts):
    return tuple({"role": "user" if i % 2 == 0 else "assistant",
                  "content": f"Note {i}: {facts.get(i, 'nothing new')}." + PAD}
                 for i in range(6))


class Evident(Task):
    name = "evident"
    grader_version = "evident/1"

    def load(self):
        facts = {0: "the first code ALPHA-1", 4: "the second code OMEGA-9"}
        question = {"role": "user", "content": "Which codes?"}
        return [Item("q-two", (*history(facts), question), "ALPHA-1", "codes",
                     evidence=("code ALPHA-1", "code OMEGA-9")),
                Item("q-none", ({"role": "user", "content": "Say hi."},), "hi", "plain")]

    def grade(self, item, prediction):
        return Grade(float(item.answer in prediction), prediction, self.grader_version)


class Misquoted(Evident):
    name = "misquoted"

    def load(self):
        item = super().load()[0]
        return [Item("q1", item.messages, item.answer, item.category,
                     evidence=("code ALPHA-1", "the code is " + "BETA-2 " * 20))]
"""


@pytest.fixture
def evident(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(evident_tasks=TASK)
    pytester.syspathinsert()
    return pytester


def evidence_of(rows: list[dict[str, Any]]) -> dict[tuple[str, str, int], tuple[Any, ...]]:
    return {(r["item_id"], r["strategy"], r["budget"]): (
        r["status"], r["evidence_total"], r["evidence_kept"], r["evidence_retention"])
        for r in rows}


def test_retention_is_counted_on_the_prompt_as_sent_and_shown_in_the_summary(
    evident: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    result = evident.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=256,4096",
        "--budgetbench-tasks=evident_tasks:Evident"))
    found = evidence_of(rows_of(tmp_path))
    assert found == {
        # Everything fits: both spans kept.
        ("q-two", "full_context", 4096): ("ok", 2, 2, 1.0),
        ("q-two", "truncation", 4096): ("ok", 2, 2, 1.0),
        # Truncation drops the oldest exchange, and with it the oldest evidence.
        ("q-two", "truncation", 256): ("ok", 2, 1, 0.5),
        # Over budget, nothing sent: the prompt that would have been sent held both.
        ("q-two", "full_context", 256): ("violation", 2, 2, 1.0),
        # An item without evidence has none to count.
        **{("q-none", strategy, budget): ("ok", None, None, None)
           for strategy in ("full_context", "truncation") for budget in (256, 4096)},
    }
    lines = result.stdout.lines
    header = next(line for line in lines if "strategy" in line and "budget" in line)
    assert header.split()[-1] == "retention"
    truncated = next(line for line in lines if line.split()[:2] == ["truncation", "256"])
    assert truncated.split()[-1] == "0.500"  # q-none's null is left out of the mean


def test_prompts_jsonl_records_which_spans_a_truncation_prompt_kept(
    evident: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    evident.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=256", "--budgetbench-strategies=truncation",
        "--budgetbench-tasks=evident_tasks:Evident"))
    (prompts,) = (tmp_path / "out").glob(f"*/{PROMPTS_FILE}")
    rows = {r["item_id"]: r for r in rows_of(tmp_path)}
    raw = {r["cell_id"]: r for r in map(json.loads, prompts.read_text().splitlines())}
    truncated = PromptRecord.from_record(raw[rows["q-two"]["cell_id"]])
    assert truncated.evidence == [SpanKept("code ALPHA-1", False), SpanKept("code OMEGA-9", True)]
    assert raw[rows["q-two"]["cell_id"]]["evidence"][1] == {"span": "code OMEGA-9", "kept": True}
    assert rows["q-two"]["evidence_kept"] == 1  # the count is of the same marks
    assert "evidence" not in raw[rows["q-none"]["cell_id"]]  # no evidence declared: no field


def test_an_item_whose_evidence_is_not_in_its_history_stops_the_sweep_before_any_cell(
    evident: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    result = evident.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=4096", "--budgetbench-tasks=evident_tasks:Misquoted"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "*task 'misquoted' item q1 declares evidence \"the code is BETA-2 BETA-2 *...\" that "
        "is not in its history: fix the item's evidence (it must be verbatim text of a "
        "message)"])
    assert fake_endpoint.requests == []


def test_an_episode_counts_the_evidence_its_trajectory_has_shown_at_every_call(
    pytester: pytest.Pytester, agent: FakeOpenAI, tmp_path: Path  # noqa: F811
) -> None:
    """agent_lookup's evidence is the first record's line, which arrives with the first
    tool result: call 1 has none to keep; full_context keeps it in every later call, and
    truncation at 900 has dropped it by the answer."""
    pytester.runpytest(*lookup_args(agent, tmp_path, "--budgets=8192,900"))
    rows = {(r["item_id"], r["strategy"], r["budget"]): r for r in rows_of(tmp_path)}
    episodes = episodes_of(tmp_path)
    for item in ("0000", "0001"):
        full = rows[(item, "full_context", 8192)]
        calls = episodes[full["cell_id"]]["calls"]
        assert [(c["evidence_total"], c["evidence_kept"]) for c in calls] == [
            (0, 0)] + [(1, 1)] * (len(calls) - 1)
        assert (full["evidence_total"], full["evidence_kept"], full["evidence_retention"]) == (
            1, 1, 1.0)
        truncated = rows[(item, "truncation", 900)]
        last = episodes[truncated["cell_id"]]["calls"][-1]
        assert (last["evidence_total"], last["evidence_kept"]) == (1, 0)
        assert (truncated["evidence_total"], truncated["evidence_kept"],
                truncated["evidence_retention"]) == (1, 0, 0.0)


# -- the counting itself ------------------------------------------------------------------
def test_a_span_is_kept_in_content_text_parts_tool_arguments_and_tool_results() -> None:
    call = {"id": "c1", "type": "function",
            "function": {"name": "lookup", "arguments": json.dumps({"key": "R42"})}}
    prompt = [
        {"role": "user", "content": [{"type": "text", "text": "see code ALPHA"},
                                     {"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "Record R42: code BETA."},
    ]
    assert texts_of(prompt) == ["see code ALPHA", '{"key": "R42"}', "Record R42: code BETA."]
    found = retention(("code ALPHA", '"R42"', "code BETA", "code GAMMA"), prompt)
    assert found == Retention(total=4, kept=3) and found.ratio == 0.75
    assert retention((), prompt) is None


def test_a_span_given_twice_is_counted_once() -> None:
    prompt = [{"role": "user", "content": "code ALPHA"}]
    assert retention(("code ALPHA", "code ALPHA", "code BETA"), prompt) == Retention(2, 1)
    assert spans_kept(("B", "A", "B"), [{"role": "user", "content": "A"}]) == [
        SpanKept("B", False), SpanKept("A", True)]


def test_a_span_across_two_messages_or_reworded_is_not_kept() -> None:
    prompt = [{"role": "user", "content": "the code is"},
              {"role": "user", "content": "ALPHA"}]
    assert retention(("the code is ALPHA",), prompt) == Retention(1, 0)
    assert retention(("Code ALPHA",), [{"role": "user", "content": "code ALPHA"}]) == (
        Retention(1, 0))  # verbatim: case counts too
    assert missing_evidence(("is", "the code is ALPHA"), prompt) == "the code is ALPHA"
    assert missing_evidence(("is", "ALPHA"), prompt) is None


def test_trajectory_evidence_counts_the_spans_shown_so_far_and_those_the_prompt_keeps() -> None:
    first = {"role": "user", "content": "look up R1 and R2"}
    one = {"role": "tool", "tool_call_id": "a", "content": "Record R1: code X."}
    two = {"role": "tool", "tool_call_id": "b", "content": "Record R2: code Y."}
    tracker = TrajectoryEvidence(("Record R1: code X.", "Record R2: code Y."))
    assert tracker.at_call([first], [first]) == []
    assert tracker.at_call([first, one], [first, one]) == [SpanKept("Record R1: code X.", True)]
    # The second record arrives; a prompt that dropped the first keeps one of two.
    marks = tracker.at_call([first, one, two], [first, two])
    assert marks == [SpanKept("Record R1: code X.", False), SpanKept("Record R2: code Y.", True)]
    assert tally(marks or []) == Retention(2, 1)
    assert Retention(0, 0).ratio is None
    assert TrajectoryEvidence(()).at_call([first], [first]) is None


# -- the report ---------------------------------------------------------------------------
def test_summary_csv_averages_retention_over_the_rows_that_have_it(tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    import pandas as pd

    from pytest_budgetbench.reports import build_report, tables

    rows = [make_row(item_id="a", evidence_total=2, evidence_kept=1, evidence_retention=0.5),
            make_row(item_id="b", evidence_total=1, evidence_kept=1, evidence_retention=1.0),
            make_row(item_id="c"),  # no evidence: left out of the mean
            make_row(strategy="rag", item_id="a")]
    build_report([write_run(tmp_path / "run", rows)], tmp_path / "out", plots=False)
    csv = pd.read_csv(tmp_path / "out" / "summary.csv")
    # Appended at the end, so readers of the older columns by position keep them; then a
    # teacher-forced episode's name-only step accuracy (empty here), then answer kept.
    assert list(csv.columns)[-4:] == ["evidence_retention_mean", "name_accuracy_mean",
                                      "answer_kept_mean", "answer_kept_unique_mean"] \
        == list(tables.SUMMARY_COLUMNS[-4:])
    assert csv["name_accuracy_mean"].isna().all()
    by_strategy = dict(zip(csv["strategy"], csv["evidence_retention_mean"], strict=True))
    assert by_strategy["truncation"] == pytest.approx(0.75)
    assert pd.isna(by_strategy["rag"])


def test_items_that_declare_evidence_left_out_of_a_mean_are_counted_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Over budget or errored, an item that declares evidence is not in its cell's mean:
    the report says how many of how many, and why, rather than averaging in silence."""
    pytest.importorskip("pandas")
    from pytest_budgetbench.commands.cli import main
    from pytest_budgetbench.reports.summary import retention_notes

    rows = [make_row(item_id="a", evidence_total=2, evidence_kept=1, evidence_retention=0.5),
            make_row(item_id="b", status="violation", evidence_total=1, evidence_kept=0,
                     evidence_retention=0.0),
            make_row(item_id="c", status="error"),
            make_row(item_id="d"),  # declares none: in no count
            make_row(strategy="full_context", item_id="c", evidence_total=1, evidence_kept=1,
                     evidence_retention=1.0),
            make_row(strategy="full_context", item_id="a", evidence_total=2, evidence_kept=2,
                     evidence_retention=1.0),
            make_row(strategy="full_context", item_id="b", evidence_total=1, evidence_kept=1,
                     evidence_retention=1.0)]
    note = ("task memory: truncation@1000: evidence retention is the mean over 1 of the 3 "
            "items that declare evidence; left out: 1 over budget (the prompt was not sent), "
            "1 errored (see cells.jsonl)")
    assert retention_notes(rows) == [note]
    run = write_run(tmp_path / "run", rows)
    assert main(["report", str(run), "--no-plots", "--resamples", "50"]) == 0
    assert f"budgetbench: warning: {note}" in capsys.readouterr().err.splitlines()
