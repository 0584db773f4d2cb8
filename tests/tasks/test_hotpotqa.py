"""HotpotQA: titled paragraphs as messages, official EM/F1 with the yes/no rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_budgetbench.errors import DataError
from pytest_budgetbench.messages import text_of
from pytest_budgetbench.tasks import Item, TaskOptions
from pytest_budgetbench.tasks._fixtures import hotpotqa_records, write_json
from pytest_budgetbench.tasks.hotpotqa import HotpotQATask, exact_match, f1_score

REAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "hotpotqa" / (
    "hotpot_dev_distractor_first30.json"
)


def _task(path: Path | None, chunk_tokens: int = 512, variant: str | None = None
          ) -> HotpotQATask:
    extra = {"grader_variants": {"hotpotqa": variant}} if variant else {}
    return HotpotQATask(TaskOptions(data_path=path, chunk_tokens=chunk_tokens, extra=extra))


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    return write_json(tmp_path / "hotpot_dev_distractor_v1.json", hotpotqa_records())


def test_paragraphs_become_titled_messages(data_file: Path) -> None:
    first, second = _task(data_file).load()
    assert (first.category, second.category) == ("comparison", "bridge")
    assert first.meta == {"level": "hard", "supporting_titles": ["Ada Lark", "Ben Moss"]}
    titles = [str(m["content"]).split("\n")[0] for m in first.messages[1:-1]]
    assert titles[:2] == ["Title: Ada Lark", "Title: Ben Moss"]
    assert "Ada Lark (born 1950) is an American director. She lives in Ohio." in str(
        first.messages[1]["content"])
    assert first.messages[-1]["content"].startswith("Question: Were Ada Lark")
    # The long "Lake Town" paragraph splits into several messages when chunks are small.
    assert len(_task(data_file, chunk_tokens=64).load()[0].messages) > len(first.messages)


@pytest.mark.parametrize(
    ("reply", "gold", "f1", "em"),
    [
        ("yes", "yes", 1.0, 1.0),
        ("Yes.", "yes", 1.0, 1.0),
        ("no", "yes", 0.0, 0.0),
        ("yes, they were", "yes", 0.0, 0.0),  # gold is yes/no and they differ: F1 0
        ("Chief of Protocol", "Chief of Protocol", 1.0, 1.0),
        ("the Chief of Protocol", "Chief of Protocol", 1.0, 1.0),
        ("Chief of Protocol of the United States", "Chief of Protocol", 2 / 3, 0.0),
        ("", "Chief of Protocol", 0.0, 0.0),
        ("", "", 0.0, 1.0),  # upstream's EM of two empty strings; grade() scores "" as 0
    ],
)
def test_official_metrics(reply: str, gold: str, f1: float, em: float) -> None:
    assert f1_score(reply, gold)[0] == pytest.approx(f1)
    assert exact_match(reply, gold) == em


@given(st.text(max_size=40), st.text(max_size=40))
def test_f1_bounded(reply: str, gold: str) -> None:
    assert 0.0 <= f1_score(reply, gold)[0] <= 1.0


def test_grade_uses_f1_and_records_em(data_file: Path) -> None:
    task = _task(data_file)
    bridge = task.load()[1]
    grade = task.grade(bridge, "Chief of Protocol")
    assert grade.quality == 1.0 and grade.detail["em"] == 1.0
    # Upstream scores the raw reply: an explanation after the answer costs precision.
    chatty = task.grade(bridge, "**Chief of Protocol**\nShe was appointed in 1976.")
    assert chatty.quality == pytest.approx(2 * (3 / 8) / (3 / 8 + 1))
    assert chatty.detail["em"] == 0.0
    partial = task.grade(bridge, "Chief of Protocol of the United States")
    assert partial.quality == pytest.approx(2 / 3) and partial.detail["em"] == 0.0
    for bad in ("", "   ", "I don't know", "Connection refused"):
        assert task.grade(bridge, bad).quality == 0.0
    assert grade.grader == "hotpotqa-official-f1/2"


def test_first_line_variant_reads_the_answer_line_but_never_a_hedge(data_file: Path) -> None:
    task = _task(data_file, variant="first-line")
    bridge = task.load()[1]
    grade = task.grade(bridge, "**Chief of Protocol**\nShe was appointed in 1976.")
    assert grade.quality == 1.0 and grade.extracted == "Chief of Protocol"
    assert grade.grader == "hotpotqa-official-f1/2+first-line"
    labelled = task.grade(bridge, "Answer: Chief of Protocol")
    assert labelled.quality == 1.0
    official = _task(data_file)
    for hedge in ("Chief of Protocol\nAmbassador", "Yes\nNo"):
        assert task.grade(bridge, hedge).quality == official.grade(bridge, hedge).quality


def test_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError) as exc:
        _task(tmp_path / "missing.json").load()
    assert "task 'hotpotqa' needs hotpot_dev_distractor_v1.json" in str(exc.value)
    records = hotpotqa_records()
    records[1]["context"][0] = "not a pair"
    bad = write_json(tmp_path / "hotpot.json", records)
    with pytest.raises(DataError) as exc:
        _task(bad).load()
    assert "record 1" in str(exc.value) and "\n" not in str(exc.value)
    records = hotpotqa_records()
    del records[0]["answer"]  # e.g. the test file, which has no answers
    write_json(bad, records)
    with pytest.raises(DataError, match="answer"):
        _task(bad).load()


def _in_one_message(item: Item) -> bool:
    return all(sum(span in text_of(m) for m in item.messages[1:-1]) >= 1
               for span in item.evidence)


def test_evidence_is_the_supporting_fact_sentences_verbatim(data_file: Path) -> None:
    first, second = _task(data_file).load()
    assert first.evidence == ("Ada Lark (born 1950) is an American director.",
                              "Ben Moss (1924-1978) was an American filmmaker.")
    assert second.evidence == ("Kiss and Tell is a 1945 film starring Shirley Temple.",
                               "She served as Chief of Protocol of the United States.")
    assert _in_one_message(first) and _in_one_message(second)


def test_a_supporting_fact_past_its_paragraph_is_left_out(tmp_path: Path) -> None:
    records = hotpotqa_records()
    records[0]["supporting_facts"] = [["Ada Lark", 1], ["Ada Lark", 5], ["Nobody", 0]]
    (item, _) = _task(write_json(tmp_path / "h.json", records)).load()
    assert item.evidence == ("She lives in Ohio.",)


@pytest.mark.skipif(not REAL.is_file(), reason="shared HotpotQA data not present")
def test_real_file_evidence_is_every_supporting_fact_verbatim() -> None:
    items = _task(REAL).load()
    assert sum(len(item.evidence) for item in items) == 75  # every supporting fact
    assert all(item.evidence and _in_one_message(item) for item in items)
    small = _task(REAL, chunk_tokens=64).load()
    assert all(_in_one_message(item) for item in small)


@pytest.mark.skipif(not REAL.is_file(), reason="shared HotpotQA data not present")
def test_real_file() -> None:
    task = _task(REAL)
    items = task.load()
    assert len(items) == 30
    assert {i.category for i in items} == {"bridge", "comparison"}
    for item in items:
        assert len(item.messages) >= 4  # system, two or more paragraphs, question
        grade = task.grade(item, str(item.answer))
        assert grade.quality == 1.0 and grade.detail["em"] == 1.0
