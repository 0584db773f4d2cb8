"""The base of the token-count and vector caches: values by (space, content key) on the
checked, mergeable database, loaded with their checksums, saved and counted once for both."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_budgetbench.cache.database import (
    AS_BYTES,
    SAME_CHECKSUM,
    Entry,
    SharedDatabase,
    entry_checksum,
    rejection,
    text_of_bytes,
)

# SQLite's default limit on the parameters of one statement is 999 on old builds.
_KEYS_PER_QUERY = 500


class SpacedValues(SharedDatabase):
    """Values by (space, content key): a value is a function of its key, so nothing in the
    file goes stale and processes that write the same value at once each insert or ignore
    (the first one written is as good as any). The token counts and the vectors.

    A subclass names its ``table`` and ``value_column`` and how a value is read
    (``value_sql``) and checksummed (:meth:`checked_form`); loading, rejecting a value that
    fails its checksum, saving and counting are here, once."""

    key_columns = ("space", "key")
    value_column = "value"
    value_sql = "value"
    """The SELECT expression of the value (a TEXT or BLOB column is read as bytes)."""

    def checked_form(self, value: Any) -> object:
        """The value as its checksum covers it."""
        return value

    def checksum_of(self, entry: Entry) -> str:
        return entry_checksum(entry["space"], entry["key"],
                              self.checked_form(entry[self.value_column]))

    def load_values(self, space: str, keys: Sequence[str]) -> dict[str, Any]:
        """The stored values of ``keys`` in ``space``; absent keys are left out, and so is a
        value that fails its checksum: it is deleted and logged, to be made again."""
        found: dict[str, Any] = {}
        rejected: dict[str, tuple[bytes | None, str]] = {}
        for start in range(0, len(keys), _KEYS_PER_QUERY):
            batch = keys[start : start + _KEYS_PER_QUERY]
            rows = self._read(
                f"SELECT key, {self.value_sql}, {AS_BYTES.format('checksum')} "
                f"FROM {self.table} WHERE space = ? AND key IN ({','.join('?' * len(batch))})",
                (space, *batch))
            for key, value, raw_checksum in rows:
                expected = entry_checksum(space, key, self.checked_form(value))
                reason = rejection(text_of_bytes(raw_checksum), expected)
                if reason is None:
                    found[key] = value
                else:
                    rejected[key] = (raw_checksum, reason)
        if rejected:
            with self._transaction() as db:
                for key, (raw_checksum, reason) in rejected.items():
                    db.execute(f"DELETE FROM {self.table} WHERE space = ? AND key = ? AND "
                               f"{SAME_CHECKSUM}", (space, key, raw_checksum))
                    self._reject(db, f"{space}/{key}", reason)
        return found

    def save_values(self, space: str, values: Mapping[str, Any]) -> None:
        """Store ``values`` in one transaction; a key already there is kept as it is."""
        if not values:
            return
        with self._transaction() as db:
            db.executemany(
                f"INSERT OR IGNORE INTO {self.table} VALUES (?, ?, ?, ?)",
                ((space, key, value, entry_checksum(space, key, self.checked_form(value)))
                 for key, value in values.items()))

    def count(self, space: str | None = None) -> int:
        """Values stored in ``space`` (or in all spaces)."""
        if space is None:
            rows = self._read(f"SELECT COUNT(*) FROM {self.table}")
        else:
            rows = self._read(f"SELECT COUNT(*) FROM {self.table} WHERE space = ?", (space,))
        return int(rows[0][0])
