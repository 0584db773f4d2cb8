"""The token-count cache: counts by (counter space, content key), beside the response cache,
so a prompt is tokenized once per machine (:class:`~pytest_budgetbench.tokens.base.CountStore`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pytest_budgetbench.cache.database import (
    AS_BYTES,
    REJECTED_SCHEMA,
    SAME_CHECKSUM,
    Entry,
    SharedDatabase,
    entry_checksum,
    rejection,
    text_of_bytes,
)

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


class CountDatabase(SharedDatabase):
    """Token counts by (counter space, content key), beside the response cache: a count
    is a function of its key, so nothing in it goes stale and xdist workers that write the
    same count at once each insert or ignore
    (:class:`~pytest_budgetbench.tokens.base.CountStore`)."""

    label = "token-count cache"
    table = "counts"
    key_columns = ("space", "key")
    value_noun = "count"

    def __init__(self, path: Path) -> None:
        super().__init__(path, _COUNTS_SCHEMA)

    def checksum_of(self, entry: Entry) -> str:
        return entry_checksum(entry["space"], entry["key"], entry["tokens"])

    def lookup(self, space: str, key: str) -> int | None:
        """The stored count, or None (absent, or rejected by its checksum: counted again)."""
        rows = self._read(f"SELECT tokens, {AS_BYTES.format('checksum')} FROM counts "
                          "WHERE space = ? AND key = ?", (space, key))
        if not rows:
            return None
        tokens, raw_checksum = rows[0]
        reason = rejection(text_of_bytes(raw_checksum), entry_checksum(space, key, tokens))
        if reason is None:
            return int(tokens)
        with self._transaction() as db:
            db.execute(f"DELETE FROM counts WHERE space = ? AND key = ? AND {SAME_CHECKSUM}",
                       (space, key, raw_checksum))
            self._reject(db, f"{space}/{key}", reason)
        return None

    def save(self, space: str, counts: Mapping[str, int]) -> None:
        with self._transaction() as db:
            db.executemany(
                "INSERT OR IGNORE INTO counts VALUES (?, ?, ?, ?)",
                ((space, key, int(tokens), entry_checksum(space, key, int(tokens)))
                 for key, tokens in counts.items()))

    def count(self) -> int:
        return int(self._read("SELECT COUNT(*) FROM counts")[0][0])
