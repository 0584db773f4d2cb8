"""Persistent token counts: a second sweep over the same data tokenizes nothing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from pytest_budgetbench.cache.counts import COUNTS_FILE, CountDatabase
from pytest_budgetbench.messages import Message, text_of
from pytest_budgetbench.tokens.base import COUNTS_PER_SAVE, TokenCounter
from pytest_budgetbench.tokens.gguf import GGUFCounter
from tests.fake_servers import CountsWith
from tests.strategy_helpers import load_gguf


class WordCounter(TokenCounter):
    """A word counter that records every text it tokenizes, in the space it is given."""

    def __init__(self, space: str | None = "words/1") -> None:
        super().__init__()
        self.space = space
        self.tokenized: list[str] = []

    @property
    def count_space(self) -> str | None:
        return self.space

    def _count_text(self, text: str) -> int:
        self.tokenized.append(text)
        return len(text.split())

    def _count_prompt(self, messages: Sequence[Message]) -> int:
        return 2 + sum(self._count_text(text_of(m)) + 3 for m in messages)


MESSAGES: list[Message] = [{"role": "user", "content": "one two three"},
                           {"role": "assistant", "content": "four five"}]


def counted(counter: TokenCounter) -> tuple[list[int], list[int]]:
    return ([counter.count_text(t) for t in ("alpha beta", "gamma", "alpha beta gamma")],
            [counter.count_message(m) for m in MESSAGES])


def test_a_second_counter_on_the_same_file_reads_every_count_and_tokenizes_nothing(
    tmp_path: Path,
) -> None:
    first = WordCounter()
    first.keep_counts_in(CountDatabase(tmp_path / COUNTS_FILE))
    made = counted(first)
    first.save_counts()
    assert first.tokenized  # the first one did the work

    second = WordCounter()  # a new process: empty memory, the same file
    second.keep_counts_in(CountDatabase(tmp_path / COUNTS_FILE))
    assert counted(second) == made
    assert second.tokenized == []


def test_counts_of_another_space_are_never_read(tmp_path: Path) -> None:
    store = CountDatabase(tmp_path / COUNTS_FILE)
    first = WordCounter("words/1")
    first.keep_counts_in(store)
    counted(first)
    first.save_counts()

    other = WordCounter("words/2")  # another tokenizer: its own counts
    other.keep_counts_in(store)
    counted(other)
    assert len(other.tokenized) == len(first.tokenized)


def test_counts_not_yet_saved_are_written_in_batches_and_at_save(tmp_path: Path) -> None:
    store = CountDatabase(tmp_path / COUNTS_FILE)
    counter = WordCounter()
    counter.keep_counts_in(store)
    for n in range(COUNTS_PER_SAVE - 1):
        counter.count_text(f"text {n}")
    assert store.count() == 0  # held until a batch is full or the cell ends
    counter.count_text("the last of a batch")
    assert store.count() == COUNTS_PER_SAVE
    counter.count_text("one more")
    counter.save_counts()
    assert store.count() == COUNTS_PER_SAVE + 1


def test_a_counter_without_a_space_keeps_nothing(tmp_path: Path) -> None:
    store = CountDatabase(tmp_path / COUNTS_FILE)
    counter = WordCounter(space=None)
    counter.keep_counts_in(store)
    counted(counter)
    counter.save_counts()
    assert store.count() == 0


def test_gguf_counts_read_back_equal_the_tokenizer_and_skip_it(
    tmp_path: Path, gguf: GGUFCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = ["The quick brown fox.", "  leading spaces and ünïcode ✓", "x" * 300]
    messages: list[Message] = [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": texts[1]}]
    first = load_gguf()
    first.keep_counts_in(CountDatabase(tmp_path / COUNTS_FILE))
    made = [first.count_text(t) for t in texts] + [first.count_message(m) for m in messages]
    first.save_counts()

    second = load_gguf()  # a fresh counter of the same GGUF, as a new process makes
    assert second.count_space == first.count_space is not None
    second.keep_counts_in(CountDatabase(tmp_path / COUNTS_FILE))

    def no_tokenizing(*args: object, **kwargs: object) -> None:
        raise AssertionError("a stored count was tokenized again")

    monkeypatch.setattr(second, "_count_text", no_tokenizing)
    monkeypatch.setattr(second, "_count_prompt", no_tokenizing)
    read = [second.count_text(t) for t in texts] + [second.count_message(m) for m in messages]
    assert read == made
    assert made[:3] == [gguf.count_text(t) for t in texts]  # what the tokenizer says


def test_a_rerun_of_a_sweep_reads_its_counts_from_beside_the_response_cache(
    pytester: pytest.Pytester, fake_endpoint: object, tmp_path: Path
) -> None:
    from pytest_budgetbench.embedded_server.models import embedded_gguf_path

    # The fake counts prompts as the GGUF does (else its chars/4 would say they were cut).
    fake_endpoint.server = CountsWith(load_gguf())  # type: ignore[attr-defined]
    args = ["--budgets=256,1024", "--budgetbench-items=2",
            "--budgetbench-strategies=truncation,rag",
            f"--budgetbench-endpoint={fake_endpoint.base_url}",  # type: ignore[attr-defined]
            f"--budgetbench-tokenizer=gguf:{embedded_gguf_path('smollm2')}",
            f"--budgetbench-out={tmp_path / 'out'}", "--budgetbench-report=off",
            "-p", "no:cacheprovider"]
    # Two processes, as two sweeps are (in one, process-wide caches would hide the store).
    pytester.runpytest_subprocess(*args).assert_outcomes(passed=8)
    store = CountDatabase(tmp_path / "out" / COUNTS_FILE)
    kept = store.count()
    assert kept > 0  # every cell saved what it counted

    pytester.runpytest_subprocess(*args).assert_outcomes(passed=8)
    assert store.count() == kept  # the rerun counted nothing new
    runs = sorted(p for p in (tmp_path / "out").iterdir() if p.is_dir())
    counts = [sorted((r["cell_id"], r["counted_tokens"]) for r in map(
        json.loads, (run / "cells.jsonl").read_text().splitlines())) for run in runs]
    assert len(counts) == 2 and counts[0] == counts[1]
