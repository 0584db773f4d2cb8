"""The token-count cache: counts by (counter space, content key), beside the response cache,
so a prompt is tokenized once per machine (:class:`~pytest_budgetbench.tokens.base.CountStore`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pytest_budgetbench.cache.database import REJECTED_SCHEMA
from pytest_budgetbench.cache.spaced import SpacedValues

_COUNTS_SCHEMA = REJECTED_SCHEMA + """
CREATE TABLE IF NOT EXISTS counts (
    space TEXT NOT NULL,
    key TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    checksum TEXT,
    PRIMARY KEY (space, key)
) WITHOUT ROWID;
"""


COUNTS_FILE = "counts.sqlite"


class CountDatabase(SpacedValues):
    """Token counts by (counter space, content key), beside the response cache
    (:class:`~pytest_budgetbench.tokens.base.CountStore`)."""

    label = "token-count cache"
    table = "counts"
    value_column = value_sql = "tokens"
    value_noun = "count"

    def __init__(self, path: Path) -> None:
        super().__init__(path, _COUNTS_SCHEMA)

    def lookup(self, space: str, key: str) -> int | None:
        """The stored count, or None (absent, or rejected by its checksum: counted again)."""
        tokens = self.load_values(space, [key]).get(key)
        return None if tokens is None else int(tokens)

    def save(self, space: str, counts: Mapping[str, int]) -> None:
        self.save_values(space, {key: int(tokens) for key, tokens in counts.items()})
