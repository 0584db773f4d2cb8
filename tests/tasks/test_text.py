"""The shared text helpers: normalisation, token F1, Porter stems, replies, chunking."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_budgetbench.tasks._text import (
    LOCOMO_ARTICLES,
    chunk_text,
    contains_phrase,
    document_messages,
    evidence_in_messages,
    normalize_answer,
    porter_stem,
    says_unanswerable,
    short_answer,
    token_f1,
)

words = st.lists(st.sampled_from(["cat", "dog", "the", "red", "a", "blue", "x1", "and"]),
                 max_size=8)


def test_normalize_answer_is_squad_style() -> None:
    assert normalize_answer("  The Cat's   HAT!  ") == "cats hat"
    assert normalize_answer("An apple, a pear and the plum") == "apple pear and plum"
    assert normalize_answer("apple and pear", LOCOMO_ARTICLES) == "apple pear"
    # Articles go only as whole words: "theatre" keeps its "the".
    assert normalize_answer("theatre") == "theatre"


def test_token_f1_by_hand() -> None:
    f1, precision, recall = token_f1(["a", "b", "c"], ["b", "c", "d", "e"])
    assert precision == pytest.approx(2 / 3)
    assert recall == pytest.approx(1 / 2)
    assert f1 == pytest.approx(2 * (2 / 3) * (1 / 2) / (2 / 3 + 1 / 2))
    assert token_f1([], ["a"]) == (0.0, 0.0, 0.0)
    assert token_f1([], []) == (0.0, 0.0, 0.0)  # nothing said is never a match


@given(words, words)
def test_token_f1_is_bounded_and_symmetric(a: list[str], b: list[str]) -> None:
    f1 = token_f1(a, b)[0]
    assert 0.0 <= f1 <= 1.0
    assert f1 == pytest.approx(token_f1(b, a)[0])


@given(st.text(min_size=1, max_size=40))
def test_token_f1_of_itself_is_one(text: str) -> None:
    tokens = normalize_answer(text).split()
    if tokens:
        assert token_f1(tokens, tokens)[0] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("word", "stem"),
    [
        ("caresses", "caress"), ("ponies", "poni"), ("cats", "cat"), ("feed", "feed"),
        ("agreed", "agre"), ("plastered", "plaster"), ("motoring", "motor"), ("sing", "sing"),
        ("conflated", "conflat"), ("hopping", "hop"), ("falling", "fall"), ("filing", "file"),
        ("happy", "happi"), ("relational", "relat"), ("conditional", "condit"),
        ("generalizations", "gener"), ("running", "run"), ("hopeful", "hope"),
        ("goodness", "good"), ("adjustment", "adjust"), ("adoption", "adopt"),
        ("effective", "effect"), ("controlling", "control"), ("roll", "roll"),
        ("camping", "camp"), ("camped", "camp"), ("hiking", "hike"), ("hiked", "hike"),
        ("is", "is"), ("Running", "run"),
    ],
)
def test_porter_stems_match_the_reference(word: str, stem: str) -> None:
    assert porter_stem(word) == stem


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        ("", ""),
        (None, ""),
        ("   \n  ", ""),
        ("**Paris**", "Paris"),
        ("**Answer:** Paris\nBecause the text says so.", "Paris"),
        ("\n\nFinal answer: 42", "42"),
        ("Answer:\nLondon", "London"),
    ],
)
def test_short_answer(reply: str | None, answer: str) -> None:
    assert short_answer(reply) == answer


@pytest.mark.parametrize(
    ("reply", "abstains"),
    [
        ("I don't know.", True),
        ("I don’t know", True),
        ("That was never mentioned.", True),
        ("The information is not enough to answer.", True),
        ("Paris", False),
        ("", False),
        ("Connection refused", False),
    ],
)
def test_says_unanswerable(reply: str, abstains: bool) -> None:
    assert says_unanswerable(reply) is abstains


def test_contains_phrase_needs_whole_words_and_a_nonempty_needle() -> None:
    assert contains_phrase("I live in **New York** now", "new york")
    assert not contains_phrase("Newark", "new")
    assert not contains_phrase("anything at all", "")
    assert not contains_phrase("anything at all", "the")  # normalises to nothing


@given(st.text(max_size=3000), st.integers(min_value=1, max_value=200))
def test_chunk_text_is_lossless_and_bounded(text: str, chunk_tokens: int) -> None:
    chunks = chunk_text(text, chunk_tokens)
    assert "".join(chunks) == text
    assert all(0 < len(c) <= 4 * chunk_tokens for c in chunks)


def test_chunk_text_prefers_paragraph_breaks() -> None:
    text = "a" * 300 + "\n\n" + "b" * 300
    chunks = chunk_text(text, 100)  # 400 characters a chunk
    assert chunks == ["a" * 300 + "\n\n", "b" * 300]


def test_document_messages_repeat_the_header_on_every_piece() -> None:
    messages = document_messages("word " * 500, 100, header="[2023/05/20]", numbered=True)
    assert len(messages) >= 6
    assert all(m["role"] == "user" for m in messages)
    assert all(str(m["content"]).startswith("[2023/05/20] (part ") for m in messages)
    assert str(messages[-1]["content"]).startswith(f"[2023/05/20] (part {len(messages)}/")
    assert document_messages("   \n ", 10) == []


def test_evidence_cut_by_a_chunk_boundary_becomes_its_parts() -> None:
    """The one rule every task's evidence follows: whole where one message holds it, else
    the parts the cut left in each message; nothing for a span the history lacks."""
    turn = " ".join(f"Sentence {i} gives code C{i}." for i in range(12))
    messages = document_messages(turn, 16, header="[day 1]")
    assert len(messages) > 2 and not any(turn in str(m["content"]) for m in messages)
    parts = evidence_in_messages([turn, "intact span", turn, "not in the history"],
                                 [*messages, {"role": "user", "content": "an intact span"}])
    assert parts[-1] == "intact span"
    assert len(parts) == len(messages) + 1
    assert "".join(parts[:-1]).replace(" ", "") == turn.replace(" ", "")
    assert all(any(part in str(m["content"]) for m in messages) for part in parts[:-1])
    # A part of punctuation alone (a closing quote the cut left) holds nothing to keep.
    quoted = document_messages('Mel said, "' + "x" * 40 + '\n\n"\nnext', 14)
    assert evidence_in_messages(['Mel said, "' + "x" * 40 + '\n\n"'], quoted) == (
        'Mel said, "' + "x" * 40,)
