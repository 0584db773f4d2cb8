"""LongMemEval: loader on a generated fixture, diagnostic grader, judge protocol, export."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.errors import DataError
from pytest_budgetbench.messages import text_of
from pytest_budgetbench.sweep.cells import Cell
from pytest_budgetbench.tasks import Item, TaskOptions
from pytest_budgetbench.tasks._fixtures import longmemeval_records, write_json
from pytest_budgetbench.tasks.longmemeval import (
    JUDGE_GRADER,
    JUDGE_PROMPT_VERSION,
    LongMemEvalTask,
)

REAL_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "longmemeval"


@dataclass
class FakeCompletion:
    text: str


class FakeJudge:
    model = "judge-model-x"

    def __init__(self, label: str) -> None:
        self.label = label
        self.prompts: list[str] = []

    def complete(self, messages: Sequence[dict[str, Any]], max_tokens: int = 0) -> FakeCompletion:
        assert max_tokens == 10
        self.prompts.append(str(messages[-1]["content"]))
        return FakeCompletion(self.label)


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    return write_json(tmp_path / "longmemeval_oracle.json", longmemeval_records())


def _task(path: Path | None, judge: Any = None) -> LongMemEvalTask:
    return LongMemEvalTask(TaskOptions(data_path=path, chunk_tokens=16, judge=judge))


def _by_id(task: LongMemEvalTask) -> dict[str, Item]:
    return {item.item_id: item for item in task.load()}


def test_loads_sessions_as_timestamped_messages(data_file: Path) -> None:
    items = _by_id(_task(data_file))
    assert {i.category for i in items.values()} == {
        "single-session-user", "temporal-reasoning", "knowledge-update",
        "single-session-preference", "abstention",
    }
    assert items["09ba9854_abs"].category == "abstention"
    item = items["e47becba"]
    system, *history, question = item.messages
    assert system["role"] == "system"
    assert {m["role"] for m in history} == {"user", "assistant"}
    assert all(str(m["content"]).startswith("[2023/05/") for m in history)
    # The long assistant turn (chunk_tokens=16) became several messages.
    assert len(history) > 4
    assert any("[2023/05/25 (Thu) 11:05]\nI graduated" in str(m["content"]) for m in history)
    assert question["role"] == "user"
    assert "2023/05/30 (Tue) 23:40" in question["content"]
    assert "What degree did I graduate with?" in question["content"]


def test_evidence_is_the_has_answer_turns_verbatim(data_file: Path, tmp_path: Path) -> None:
    items = _by_id(_task(data_file))
    assert items["e47becba"].evidence == (
        "I graduated with a degree in Business Administration.",)
    assert items["09ba9854_abs"].evidence == ()
    for item in items.values():
        assert all(any(span in text_of(m) for m in item.messages[1:-1])
                   for span in item.evidence)
    records = longmemeval_records()
    records[0]["haystack_sessions"][1][0]["content"] = "word " * 40  # split in parts
    (long, *_) = _task(write_json(tmp_path / "longmemeval_oracle.json", records)).load()
    assert len(long.evidence) > 1
    assert all(any(span in text_of(m) for m in long.messages) for span in long.evidence)


@pytest.mark.skipif(not (REAL_DIR / "longmemeval_oracle_subset60.json").is_file(),
                    reason="shared LongMemEval subset not present")
def test_real_subset_evidence_is_verbatim() -> None:
    for name in ("longmemeval_oracle_subset60.json", "longmemeval_s_subset6.json"):
        for item in _task(REAL_DIR / name).load():
            # An abstention question's marked turns are those its false premise twists.
            assert item.evidence or item.category == "abstention", item.item_id
            assert all(any(span in text_of(m) for m in item.messages[1:-1])
                       for span in item.evidence)


@pytest.mark.parametrize(
    ("qid", "reply", "quality"),
    [
        ("e47becba", "You graduated in **Business Administration**.", 1.0),
        ("e47becba", "", 0.0),
        ("e47becba", "I don't know", 0.0),
        ("e47becba", "Business", 0.0),
        ("e47becba", "Connection refused", 0.0),
        ("gpt4_2655b836", "7 days", 1.0),
        ("gpt4_2655b836", "Seven days passed.", 1.0),
        ("gpt4_2655b836", "17 days", 0.0),
        ("6a1eabeb", "It used to be in the hallway, now in the garage.", 1.0),
        ("09ba9854_abs", "You never mentioned your sister's cat.", 1.0),
        ("09ba9854_abs", "I don't know.", 1.0),
        ("09ba9854_abs", "Tofu", 0.0),
        ("09ba9854_abs", "", 0.0),
    ],
)
def test_diagnostic_grader(data_file: Path, qid: str, reply: str, quality: float) -> None:
    task = _task(data_file)
    grade = task.grade(_by_id(task)[qid], reply)
    assert grade.quality == quality
    assert grade.grader == "longmemeval-contains-diagnostic/2"
    assert "diagnostic" in task.grader_version


def test_diagnostic_preference_is_rubric_recall(data_file: Path) -> None:
    task = _task(data_file)
    item = _by_id(task)["8a2466db"]
    good = task.grade(item, "Try a Korean historical drama, like the ones you enjoyed.")
    bad = task.grade(item, "Watch a football match.")
    assert 0.5 < good.quality <= 1.0
    assert bad.quality == 0.0
    assert good.detail["mode"] == "rubric-word-recall"


def test_judge_protocol(data_file: Path) -> None:
    judge = FakeJudge("Yes.")
    task = _task(data_file, judge)
    items = _by_id(task)
    grade = task.grade(items["gpt4_2655b836"], "8 days")
    assert grade.quality == 1.0
    assert grade.grader == f"{JUDGE_GRADER};judge=judge-model-x"
    assert grade.detail == {"judge_model": "judge-model-x",
                            "judge_prompt_version": JUDGE_PROMPT_VERSION, "label": "Yes."}
    assert "do not penalize off-by-one errors" in judge.prompts[-1]
    assert "How many days passed between my two dentist visits?" in judge.prompts[-1]
    assert "Current date" not in judge.prompts[-1]
    assert judge.prompts[-1].endswith("Model Response: 8 days\n\nIs the model response "
                                      "correct? Answer yes or no only.")

    task.grade(items["09ba9854_abs"], "I can't tell.")
    assert "correctly identify the question as unanswerable" in judge.prompts[-1]
    task.grade(items["6a1eabeb"], "garage")
    assert "some previous information along with an updated answer" in judge.prompts[-1]
    task.grade(items["8a2466db"], "a drama")
    assert "Rubric:" in judge.prompts[-1]

    calls = len(judge.prompts)
    empty = task.grade(items["e47becba"], "   ")
    assert empty.quality == 0.0 and len(judge.prompts) == calls, "empty is wrong, unjudged"

    no = _task(data_file, FakeJudge("no")).grade(items["e47becba"], "Business Administration")
    assert no.quality == 0.0 and no.detail["label"] == "no"


def test_export_is_the_upstream_hypotheses_jsonl(data_file: Path) -> None:
    task = _task(data_file)
    item = task.load()[0]
    cell = Cell("longmemeval", 0, item.item_id, "truncation", 2048)
    name, record = task.export(item, "Business Administration", cell.cell_id)
    assert name == "longmemeval_hypotheses.truncation-2048.jsonl"
    assert record == {"question_id": "e47becba", "hypothesis": "Business Administration"}
    other, _ = task.export(item, "x", Cell("longmemeval", 0, item.item_id, "full_context",
                                           4096, repeat=1).cell_id)
    assert other == "longmemeval_hypotheses.full_context-4096-r1.jsonl"
    json.dumps(record)


def test_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError) as exc:
        _task(tmp_path).load()
    message = str(exc.value)
    assert "\n" not in message and "longmemeval" in message
    assert "longmemeval_oracle.json" in message and "--budgetbench-data-longmemeval" in message

    records = longmemeval_records()
    records[2]["haystack_dates"] = records[2]["haystack_dates"][:1]
    bad = write_json(tmp_path / "longmemeval_s.json", records)
    with pytest.raises(DataError) as exc:
        _task(bad).load()
    assert "6a1eabeb" in str(exc.value) and "equal length" in str(exc.value)

    records = longmemeval_records()
    del records[0]["question_date"]
    write_json(bad, records)
    with pytest.raises(DataError, match="question_date"):
        _task(bad).load()


@pytest.mark.skipif(not (REAL_DIR / "longmemeval_oracle.json").is_file(),
                    reason="LongMemEval is not in the shared data")
def test_real_oracle_file() -> None:
    items = _task(REAL_DIR).load()
    assert len(items) == 500
    assert "abstention" in {i.category for i in items}
