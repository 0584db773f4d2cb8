"""Helpers of the tests that run a sweep through pytester: its arguments against the fake
endpoint, the rows it recorded (read through their owner, records.cells), and a user's
strategy that ignores its budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.records.cells import CELLS_FILE, read_rows
from tests.fake_openai import FakeOpenAI


def sweep_args(fake: FakeOpenAI, tmp: Path, *extra: str) -> list[str]:
    """A small sweep against ``fake``, writing under ``tmp/out``; ``extra`` options come
    last, so they override these."""
    return [
        "--budgetbench-strategies=full_context,truncation",
        f"--budgetbench-endpoint={fake.base_url}",
        "--budgetbench-tokenizer=approx",
        f"--budgetbench-out={tmp / 'out'}",
        "--budgetbench-report=off",
        "-p", "no:cacheprovider",
        *extra,
    ]


def rows_of(tmp: Path) -> list[dict[str, Any]]:
    """The rows of the one run under ``tmp/out``, in the file's order."""
    (cells,) = (tmp / "out").glob(f"*/{CELLS_FILE}")
    return list(read_rows(cells))


def add_greedy_strategy(pytester: pytest.Pytester) -> None:
    """A user's strategy, importable as greedy:Greedy, that ignores its budget."""
    pytester.makepyfile(
        greedy="""
        from pytest_budgetbench.strategies import Strategy

        class Greedy(Strategy):
            name = "greedy"

            def apply(self, messages, budget):
                return list(messages)
        """
    )
    pytester.syspathinsert()
