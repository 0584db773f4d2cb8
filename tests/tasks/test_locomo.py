"""LoCoMo: sessions with date-times, official per-category F1, DataErrors, real data."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_budgetbench.errors import ConfigError, DataError
from pytest_budgetbench.messages import text_of
from pytest_budgetbench.tasks import Item, TaskOptions
from pytest_budgetbench.tasks._fixtures import locomo_samples, write_json
from pytest_budgetbench.tasks.locomo import NOT_MENTIONED, LoCoMoTask, f1_multi, score

REAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "locomo" / (
    "locomo_conv26_conv30.json"
)


def _task(
    path: Path | None,
    chunk_tokens: int = 512,
    seed: int = 0,
    grader_variants: dict[str, str] | None = None,
) -> LoCoMoTask:
    return LoCoMoTask(TaskOptions(data_path=path, chunk_tokens=chunk_tokens, seed=seed,
                                  extra={"grader_variants": grader_variants or {}}))


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    return write_json(tmp_path / "locomo10.json", locomo_samples())


@pytest.fixture
def items(data_file: Path) -> list[Item]:
    return _task(data_file).load()


def test_loads_sessions_with_dates(data_file: Path, items: list[Item]) -> None:
    assert [i.category for i in items] == [
        "multi-hop", "temporal", "open-domain", "single-hop", "adversarial"]
    assert items[0].item_id == "conv-fixture/0"
    system, *history, question = items[0].messages
    assert "Caroline and Melanie" in system["content"]
    assert str(history[0]["content"]).startswith("DATE: 1:56 pm on 8 May, 2023 (session 1)")
    assert str(history[-1]["content"]).startswith("DATE: 10:37 am on 27 June, 2023 (session 2)")
    assert 'Caroline said, "I went to a pottery class' in history[0]["content"]
    assert "and shared a photo of a painting of a sunset" in history[0]["content"]
    assert "Question: What did Caroline research? Short answer:" in question["content"]
    # Histories are shared between a conversation's questions, not rebuilt.
    assert items[0].messages[:-1] == items[4].messages[:-1]
    small = _task(data_file, chunk_tokens=16).load()[0]
    assert len(small.messages) > len(items[0].messages)
    assert all("DATE: " in str(m["content"]) for m in small.messages[1:-1])


def test_temporal_and_adversarial_prompts(items: list[Item]) -> None:
    assert "Use DATE of CONVERSATION" in items[1].messages[-1]["content"]
    adversarial = items[4]
    assert adversarial.answer == NOT_MENTIONED
    assert adversarial.meta["adversarial_answer"] == "blue"
    final = adversarial.messages[-1]["content"]
    assert "Not mentioned in the conversation" in final and "blue" in final


@pytest.mark.parametrize(
    ("index", "reply", "quality"),
    [
        (0, "adoption agencies, counseling courses", 1.0),
        (0, "counseling courses, adoption agencies", 1.0),
        (0, "adoption agencies", 0.5),
        (0, "", 0.0),
        (1, "7 May 2023", 1.0),
        # Upstream scores the whole reply: 3 of 8 tokens against a 3-token gold.
        (1, "**7 May 2023**\nShe went the day before the chat.", 6 / 11),
        (1, "I don't know", 0.0),
        (2, "Likely yes", 1.0),  # category 3: gold before the first ';'
        (3, "Camped and hiked", 1.0),  # Porter stems: camp, hike
        (3, "Connection refused", 0.0),
        (4, "Not mentioned in the conversation", 1.0),
        (4, "(a) No information available.", 1.0),
        (4, "blue", 0.0),
        (4, "blue\nNot mentioned in the conversation", 1.0),  # the marker on any line
        (4, "", 0.0),
    ],
)
def test_official_scoring(data_file: Path, index: int, reply: str, quality: float) -> None:
    task = _task(data_file)
    grade = task.grade(task.load()[index], reply)
    assert grade.quality == pytest.approx(quality)
    assert grade.grader == "locomo-official-f1/2"


def test_adversarial_option_letters_map_to_their_text(data_file: Path) -> None:
    task = _task(data_file)
    item = task.load()[4]
    options = item.meta["options"]
    assert set(options) == {NOT_MENTIONED, "blue"}
    right = "a" if options[0] == NOT_MENTIONED else "b"
    wrong = "b" if right == "a" else "a"
    for reply in (right, right.upper(), f"({right})", f" ({right}) "):
        assert task.grade(item, reply).quality == 1.0, reply
    for reply in (wrong, f"({wrong})"):
        assert task.grade(item, reply).quality == 0.0, reply
    # Upstream reads any other one- or three-character reply as option (b).
    assert task.grade(item, "c").quality == float(right == "b")


def test_first_line_variant(data_file: Path) -> None:
    task = _task(data_file, grader_variants={"locomo": "first-line"})
    items = task.load()
    grade = task.grade(items[1], "**7 May 2023**\nShe went the day before the chat.")
    assert grade.quality == 1.0
    assert grade.grader == "locomo-official-f1/2+first-line"
    # A hedge is scored whole, as upstream scores it.
    hedge = "7 May 2023\n8 May 2023"
    assert task.grade(items[1], hedge).quality == _task(data_file).grade(items[1], hedge).quality


def test_unknown_grader_variant_is_a_usage_error(data_file: Path) -> None:
    with pytest.raises(ConfigError, match=r"locomo:strict.*known: first-line"):
        _task(data_file, grader_variants={"locomo": "strict"})


def test_partial_f1_by_hand() -> None:
    # "the pottery class" vs "pottery class yesterday": 2 common of 2 and 3 tokens.
    assert score(4, "the pottery class", "pottery class yesterday") == pytest.approx(0.8)
    assert f1_multi("a, b", "x, b") == pytest.approx(0.5)


@given(st.text(max_size=60), st.text(min_size=1, max_size=60), st.sampled_from([1, 2, 3, 4, 5]))
def test_scores_are_in_unit_interval(prediction: str, gold: str, category: int) -> None:
    assert 0.0 <= score(category, prediction, gold) <= 1.0


def test_adversarial_option_order_is_seeded(data_file: Path) -> None:
    finals = {str(_task(data_file, seed=s).load()[4].messages[-1]["content"]) for s in range(8)}
    assert len(finals) == 2
    again = _task(data_file, seed=3).load()[4].messages[-1]
    assert again == _task(data_file, seed=3).load()[4].messages[-1]


def test_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError) as exc:
        _task(tmp_path / "locomo10.json").load()
    message = str(exc.value)
    assert message.startswith("task 'locomo' needs locomo10.json: pass --budgetbench-data-locomo")
    assert "file not found" in message and "\n" not in message

    samples = locomo_samples()
    samples[0]["qa"][2]["category"] = 7
    bad = write_json(tmp_path / "locomo10.json", samples)
    with pytest.raises(DataError) as exc:
        _task(bad).load()
    assert "conv-fixture/qa 2" in str(exc.value) and "\n" not in str(exc.value)

    samples = locomo_samples()
    del samples[0]["conversation"]["session_2_date_time"]
    write_json(bad, samples)
    with pytest.raises(DataError, match="session_2_date_time"):
        _task(bad).load()


def _in_one_message(item: Item) -> bool:
    return all(any(span in text_of(m) for m in item.messages[1:-1]) for span in item.evidence)


def test_evidence_is_the_named_turns_as_the_history_writes_them(items: list[Item]) -> None:
    pottery = 'Caroline said, "I went to a pottery class yesterday and made a blue bowl."'
    assert [item.evidence for item in items] == [
        ('Caroline said, "I have been researching adoption agencies and counseling courses."',),
        (pottery,), (pottery,), ('Melanie said, "My kids love camping and hiking."',),
        (pottery,)]
    assert all(_in_one_message(item) for item in items)


def test_evidence_ids_in_one_entry_and_unknown_ids(tmp_path: Path) -> None:
    samples = locomo_samples()
    samples[0]["qa"][0]["evidence"] = ["D1:2; D2:2", "D9:9"]
    first = _task(write_json(tmp_path / "locomo10.json", samples)).load()[0]
    assert len(first.evidence) == 2
    assert first.evidence[0].startswith('Melanie said, "Lovely! ')
    assert first.evidence[0].endswith(" and shared a photo of a painting of a sunset over a lake.")
    assert _in_one_message(first)


def test_a_turn_a_chunk_boundary_cuts_is_evidence_in_its_parts(tmp_path: Path) -> None:
    """A turn ending in a blank line is cut there by the chunker (its closing quote starts
    the next message): the item keeps its evidence, the part each message holds, instead
    of dropping out of retention as if it declared none."""
    samples = locomo_samples()
    cut = samples[0]["conversation"]["session_2"][0]
    cut["text"] += "\n\n"
    first = _task(write_json(tmp_path / "locomo10.json", samples), chunk_tokens=25).load()[0]
    whole = 'Caroline said, "I have been researching adoption agencies and counseling courses.'
    assert not any(f'{whole}\n\n"' in text_of(m) for m in first.messages)  # it was cut
    assert first.evidence == (whole,)
    assert _in_one_message(first)


@pytest.mark.skipif(not REAL.is_file(), reason="shared LoCoMo data not present")
def test_real_file_evidence_is_verbatim_in_the_history() -> None:
    items = _task(REAL).load()
    assert sum(len(item.evidence) for item in items) == 382
    assert sum(not item.evidence for item in items) == 2  # two QAs name no evidence
    assert all(_in_one_message(item) for item in items)


@pytest.mark.skipif(not REAL.is_file(), reason="shared LoCoMo data not present")
def test_real_file() -> None:
    task = _task(REAL)
    items = task.load()
    assert len(items) == 304
    assert {i.category for i in items} == {
        "multi-hop", "temporal", "open-domain", "single-hop", "adversarial"}
    assert items[0].messages[1]["content"].startswith("DATE: 1:56 pm on 8 May, 2023")
    for item in items:
        if item.category != "adversarial" and str(item.answer).strip():
            # Open-domain golds carry a rationale after ';' that upstream does not score.
            reply = str(item.answer).split(";")[0]
            assert task.grade(item, reply).quality == pytest.approx(1.0), item.item_id
        assert task.grade(item, "").quality == 0.0
