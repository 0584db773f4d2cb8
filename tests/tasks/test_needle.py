"""needle: a seeded RULER-style generator over essays or generated filler."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_budgetbench.errors import DataError
from pytest_budgetbench.tasks import Item, TaskOptions
from pytest_budgetbench.tasks._fixtures import needle_haystack
from pytest_budgetbench.tasks.needle import DEPTHS, NEEDLE_COUNTS, NeedleTask, string_match_all

REAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "ruler_haystack" / (
    "paul_graham_essays"
)


def _task(path: Path | None = None, seed: int = 0, items: int | None = None,
          history_tokens: int = 1000) -> NeedleTask:
    return NeedleTask(TaskOptions(data_path=path, seed=seed, items=items, chunk_tokens=128,
                                  extra={"history_tokens": history_tokens}))


def _history(item: Item) -> str:
    return " ".join(str(m["content"]) for m in item.messages[1:-1])


def test_deterministic_from_the_seed() -> None:
    assert _task(seed=1).load() == _task(seed=1).load()
    assert _task(seed=1).load()[0].answer != _task(seed=2).load()[0].answer


def test_categories_cover_every_depth_and_needle_count() -> None:
    items = _task().load()
    expected = {f"depth-{d}/needles-{k}" for d in DEPTHS for k in NEEDLE_COUNTS}
    assert {i.category for i in items} == expected
    assert len(_task(items=4).load()) == 4


def test_needles_are_hidden_at_their_depth() -> None:
    for item in _task().load():
        history = _history(item)
        assert len(item.answer) == item.meta["needles"]
        for value in item.answer:
            assert history.count(f"is: {value}.") == 1
        chunks = [str(m["content"]) for m in item.messages[1:-1]]
        assert len(chunks) > 3, "the haystack must span several messages"
        where = next(i for i, c in enumerate(chunks) if str(item.answer[0]) in c)
        if item.meta["depth"] == 0:
            assert where == 0
        if item.meta["depth"] == 100:
            assert where == len(chunks) - 1
        assert item.meta["key"] in item.messages[-1]["content"]


@pytest.mark.parametrize("chunk_tokens", [32, 128, 512])
def test_declared_evidence_is_each_needle_verbatim_in_one_message(
    tmp_path: Path, chunk_tokens: int
) -> None:
    for folder in (None, needle_haystack(tmp_path / "essays")):
        task = NeedleTask(TaskOptions(data_path=folder, chunk_tokens=chunk_tokens,
                                      extra={"history_tokens": 1000}))
        for item in task.load():
            assert item.evidence == tuple(
                f"One of the special magic numbers for {item.meta['key']} is: {value}."
                for value in item.answer)
            chunks = [str(m["content"]) for m in item.messages[1:-1]]
            for span in item.evidence:
                assert sum(span in chunk for chunk in chunks) == 1


def test_a_needle_split_across_messages_is_declared_in_its_parts() -> None:
    """Evidence's one rule (tasks._text.evidence_in_messages): a cut span is its parts."""
    task = NeedleTask(TaskOptions(chunk_tokens=4, items=3, extra={"history_tokens": 200}))
    for item in task.load():
        chunks = [str(m["content"]) for m in item.messages[1:-1]]
        assert all(any(span in chunk for chunk in chunks) for span in item.evidence)
        needle = f"One of the special magic numbers for {item.meta['key']} is: {item.answer[0]}."
        assert not any(needle in chunk for chunk in chunks)  # cut, so given in parts
        assert " ".join(item.evidence).replace(" ", "") == needle.replace(" ", "")


def test_haystack_size_follows_history_tokens() -> None:
    small = sum(len(str(m["content"])) for m in _task(history_tokens=500).load()[0].messages)
    large = sum(len(str(m["content"])) for m in _task(history_tokens=4000).load()[0].messages)
    assert 1800 < small < 3000 and 15000 < large < 17500


def test_essay_directory_is_used(tmp_path: Path) -> None:
    folder = needle_haystack(tmp_path / "essays")
    item = _task(folder).load()[0]
    assert item.meta["haystack"] == "files"
    assert "_essay.txt: the figures" in _history(item)
    assert "_essay.txt" not in _history(_task().load()[0])
    assert _task().load()[0].meta["haystack"] == "generated"


@pytest.mark.parametrize(
    ("reply", "quality"),
    [
        ("1234567 and 7654321", 1.0),
        ("The numbers are **1234567**.", 0.5),
        ("", 0.0),
        ("I don't know", 0.0),
        ("Connection refused", 0.0),
    ],
)
def test_string_match_all(reply: str, quality: float) -> None:
    assert string_match_all(reply, ["1234567", "7654321"]) == quality


def test_grade() -> None:
    task = _task()
    item = next(i for i in task.load() if i.meta["needles"] == 2)
    first, second = item.answer
    assert task.grade(item, f"They are {first}, {second}.").quality == 1.0
    half = task.grade(item, f"Only {first}")
    assert half.quality == 0.5 and half.extracted == first
    assert task.grade(item, "").quality == 0.0
    assert half.grader == "ruler-string-match-all/1"


def test_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError) as exc:
        _task(tmp_path / "nope").load()
    assert "task 'needle'" in str(exc.value) and "--budgetbench-data-needle" in str(exc.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no text"):
        _task(tmp_path / "empty").load()


@pytest.mark.skipif(not REAL.is_dir(), reason="shared RULER haystack not present")
def test_real_essays() -> None:
    items = _task(REAL, history_tokens=2000).load()
    assert all(i.meta["haystack"] == "files" for i in items)
    history = _history(items[0])
    assert "special magic numbers" in history and len(history) > 7000
