"""The end-of-sweep table in the terminal."""

from __future__ import annotations

from pytest_budgetbench.reports.summary import row_columns, summarise
from pytest_budgetbench.reports.synthetic import make_row
from pytest_budgetbench.reports.terminal import format_table


def test_the_terminal_table_stays_aligned_under_a_long_strategy_name() -> None:
    long_name = "llamaindex_chat_summary_memory_exact"  # 36 characters, over the 22 default
    rows = [make_row(item_id="i0", strategy=name) for name in ("truncation", long_name)]
    header, rule, *lines = format_table(summarise(row_columns(rows), resamples=10, seed=0))
    budget_at = header.index("budget")
    assert header.index("strategy") == 0 and budget_at > len(long_name)
    assert len(rule) == len(header)
    for line in lines:  # every budget ends where the header's does
        assert line[budget_at:budget_at + len("budget")].strip() == "1000"
