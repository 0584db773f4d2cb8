"""The synthetic memory task: deterministic items, planted evidence, and its grader."""

from __future__ import annotations

import re

import pytest

from pytest_budgetbench.messages import text_of
from pytest_budgetbench.tasks.base import Item, TaskOptions
from pytest_budgetbench.tasks.memory import (
    CATEGORIES,
    PET_NAMES,
    SYSTEM_PROMPT,
    MemoryTask,
)

_DATED = re.compile(r"^\[([A-Z][a-z]+ \d{1,2}, \d{4})\] ")


def make(items: int = 10, seed: int = 0, history: int = 400) -> MemoryTask:
    return MemoryTask(TaskOptions(items=items, seed=seed, extra={"history_tokens": history}))


@pytest.fixture(scope="module")
def items() -> list[Item]:
    return make(items=10, seed=3).load()


def by_category(items: list[Item], category: str) -> Item:
    return next(item for item in items if item.category == category)


def history_chars(item: Item) -> int:
    return sum(len(text_of(m)) for m in item.messages[1:-1])


# -- items -------------------------------------------------------------------------------
def test_same_seed_same_items_other_seed_other_items() -> None:
    first, again, other = make(seed=7).load(), make(seed=7).load(), make(seed=8).load()
    assert first == again
    assert [i.meta for i in first] == [i.meta for i in again]
    assert [i.messages for i in first] != [i.messages for i in other]
    assert sum(a.messages != b.messages for a, b in zip(first, other, strict=True)) >= 8


def test_items_count_and_ids() -> None:
    loaded = make(items=7).load()
    assert [item.item_id for item in loaded] == [f"{i:04d}" for i in range(7)]


def test_categories_rotate(items: list[Item]) -> None:
    assert [item.category for item in items] == [
        CATEGORIES[i % len(CATEGORIES)] for i in range(len(items))
    ]
    assert set(CATEGORIES) == {
        "single-session-fact", "knowledge-update", "temporal-reasoning", "preference",
        "abstention",
    }


def test_items_start_with_the_system_message_and_end_with_a_question(
    items: list[Item],
) -> None:
    for item in items:
        assert item.messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert item.messages[-1]["role"] == "user"
        assert item.messages[-1]["content"].rstrip().endswith(".")  # "Reply with just ..."
        assert "?" in item.messages[-1]["content"]
        history = item.messages[1:-1]
        assert history, "every item has a history"
        # The history alternates user / assistant, starting with the user.
        assert [m["role"] for m in history] == ["user", "assistant"] * (len(history) // 2)
        assert _DATED.match(history[0]["content"]), "sessions start with their date"


def test_history_grows_with_history_tokens() -> None:
    sizes = {h: [history_chars(i) for i in make(items=5, history=h).load()]
             for h in (200, 1000, 3000)}
    for index in range(5):
        assert sizes[200][index] < sizes[1000][index] < sizes[3000][index]
    for h, chars in sizes.items():
        assert all(c >= 4 * h for c in chars)  # at least the target, four chars a token
        assert all(c < 4 * h + 3000 for c in chars)  # and not far past it


def _dated_before(item: Item, index: int) -> str:
    for message in reversed(item.messages[1 : index + 1]):
        match = _DATED.match(text_of(message))
        if match:
            return match.group(1)
    raise AssertionError("no dated session before the evidence")


def test_evidence_is_in_the_history() -> None:
    for item in make(items=15, seed=11, history=800).load():
        history = [text_of(m) for m in item.messages[1:-1]]
        joined = "\n".join(history)
        if item.category == "abstention":
            assert item.answer == "unknown"
            assert item.meta["evidence_session"] is None
            assert "Please remember this" not in joined
            continue
        assert isinstance(item.meta["evidence_session"], int)
        if item.category == "knowledge-update":
            new, old = item.answer["answer"], item.answer["old"]
            assert new != old
            assert f"now I live in {new}" in joined
            assert f"I live in {old}." in joined
        elif item.category == "temporal-reasoning":
            index = next(i for i, text in enumerate(history, start=1) if "lesson" in text)
            assert _dated_before(item, index) == item.answer  # the session's date
        else:
            assert re.search(rf"\b{re.escape(item.answer)}\b", joined)


@pytest.mark.parametrize("position", ["early", "anywhere"])
def test_declared_evidence_is_the_planted_turn_verbatim_in_one_message(position: str) -> None:
    for seed in range(4):
        loaded = MemoryTask(TaskOptions(items=10, seed=seed, extra={
            "history_tokens": 300 * (seed + 1), "evidence_position": position})).load()
        for item in loaded:
            texts = [text_of(m) for m in item.messages[1:-1]]
            if item.category == "abstention":
                assert item.evidence == ()
                continue
            for span in item.evidence:
                assert sum(span in text for text in texts) == 1, (seed, item.item_id, span)
            stated = item.evidence[0]
            assert stated.startswith("Please remember this: ")
            if item.category == "knowledge-update":
                assert f"now I live in {item.answer['answer']}." in stated
            elif item.category == "temporal-reasoning":
                assert item.evidence[1] == f"[{item.answer}]"  # the session's date tag
                assert len(item.evidence) == 2
            else:
                assert re.search(rf"\b{re.escape(item.answer)}\b", stated)
            if item.category != "temporal-reasoning":
                assert len(item.evidence) == 1


def _sessions(item: Item) -> list[int]:
    """Index in ``item.messages`` of each session's first message."""
    return [i for i, m in enumerate(item.messages) if _DATED.match(text_of(m))]


def _evidence_indexes(item: Item) -> list[int]:
    return [i for i, m in enumerate(item.messages) if "Please remember this" in text_of(m)]


@pytest.mark.parametrize("position", ["early", "anywhere"])
def test_evidence_position_early_keeps_it_in_the_oldest_quarter(position: str) -> None:
    loaded = MemoryTask(TaskOptions(items=40, seed=5, extra={
        "history_tokens": 2000, "evidence_position": position})).load()
    depths = []
    for item in loaded:
        if item.category == "abstention":
            continue
        starts = _sessions(item)
        for index in _evidence_indexes(item):
            session = sum(1 for start in starts if start <= index) - 1
            depths.append(session / len(starts))
    assert depths
    if position == "early":
        assert max(depths) < 0.25  # every planted statement is among the oldest sessions
    else:
        assert max(depths) > 0.5  # spread over the whole history


def test_early_is_the_default_and_a_bad_position_is_refused() -> None:
    from pytest_budgetbench.tasks.memory import EVIDENCE_POSITION

    assert make().option("evidence_position") == "early"
    with pytest.raises(ValueError, match=r"early\|anywhere"):
        EVIDENCE_POSITION.parse("late")


def test_knowledge_update_states_the_old_city_first_even_in_a_short_history() -> None:
    for seed in range(40):
        for item in make(items=10, seed=seed, history=100).load():
            if item.category != "knowledge-update":
                continue
            texts = [text_of(m) for m in item.messages]
            old = item.answer["old"]
            first_old = next(i for i, t in enumerate(texts) if t.endswith(f"I live in {old}."))
            moved = next(i for i, t in enumerate(texts) if "I moved from" in t)
            assert first_old < moved, (seed, item.item_id)


# -- grader ------------------------------------------------------------------------------
def grade(item: Item, reply: str) -> float:
    return make().grade(item, reply).quality


def test_grader_version() -> None:
    assert MemoryTask.grader_version == "memory-contains/1"
    item = make(items=1).load()[0]
    assert make().grade(item, "x").grader == "memory-contains/1"


def test_fact_answers(items: list[Item]) -> None:
    item = by_category(items, "single-session-fact")
    name = item.answer
    other = next(n for n in PET_NAMES if n != name)
    assert grade(item, name) == 1.0
    assert grade(item, f"Your pet is called {name}.") == 1.0
    assert grade(item, f"**{name}**") == 1.0
    assert grade(item, f"{name.upper()}!") == 1.0
    assert grade(item, "") == 0.0
    assert grade(item, "   \n\t ") == 0.0
    assert grade(item, "I don't know") == 0.0
    assert grade(item, "unknown") == 0.0
    ramble = (f"Well, thinking back over everything we talked about, including the recipes "
              f"and the tips, I believe the name you mentioned was probably {other}, "
              f"though I could be misremembering some of the details here.")
    assert grade(item, ramble) == 0.0
    assert grade(item, name + "s") == 0.0  # whole words only


def test_only_the_first_line_counts(items: list[Item]) -> None:
    item = by_category(items, "single-session-fact")
    result = make().grade(item, f"\n\nLet me think.\n{item.answer}")
    assert result.extracted == "Let me think."
    assert result.quality == 0.0
    result = make().grade(item, f"  {item.answer}  \nmore")
    assert result.extracted.strip() == item.answer
    assert result.quality == 1.0


def test_abstention_answers(items: list[Item]) -> None:
    item = by_category(items, "abstention")
    assert grade(item, "I don't know") == 1.0
    assert grade(item, "I don\u2019t know.") == 1.0
    assert grade(item, "Unknown.") == 1.0
    assert grade(item, "That was not mentioned.") == 1.0
    assert grade(item, "Her name is Anna.") == 0.0
    assert grade(item, "") == 0.0
    assert grade(item, "  ") == 0.0


def test_knowledge_update_answers(items: list[Item]) -> None:
    item = by_category(items, "knowledge-update")
    new, old = item.answer["answer"], item.answer["old"]
    assert grade(item, new) == 1.0
    assert grade(item, f"You live in {new} now.") == 1.0
    assert grade(item, old) == 0.0
    assert grade(item, f"You moved from {old} to {new}.") == 0.0
    assert grade(item, f"{new} or {old}") == 0.0
    assert grade(item, "I don't know") == 0.0


def test_temporal_answers(items: list[Item]) -> None:
    item = by_category(items, "temporal-reasoning")
    month, day = item.answer.split(",")[0].split()
    assert grade(item, item.answer) == 1.0
    assert grade(item, f"It was on {month} {day}.") == 1.0
    assert grade(item, f"{month} {int(day) + 10}, 2024") == 0.0
    assert grade(item, "I don't know") == 0.0


def test_preference_answers(items: list[Item]) -> None:
    item = by_category(items, "preference")
    question = item.messages[-1]["content"]
    first, second = re.search(r"prefer, (\w+) or (\w+)\?", question).groups()  # type: ignore[union-attr]
    other = second if item.answer == first else first
    assert item.answer in (first, second)
    assert grade(item, item.answer) == 1.0
    assert grade(item, f"**{item.answer.capitalize()}**") == 1.0
    assert grade(item, other) == 0.0
