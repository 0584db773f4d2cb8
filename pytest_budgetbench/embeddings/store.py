"""The persistent embedding cache: float32 vectors in SQLite, shared by every process.

A vector is addressed by its *space* (which model, which of its files, which backend and
export: :attr:`~pytest_budgetbench.embeddings.SentenceTransformerEmbedder.space`) and the
sha256 of its text, so vectors of two backends or two versions of a model never mix.
The file is in WAL mode: readers never wait, and xdist workers that write the same
vectors at once each insert or ignore (a vector is a function of its key, so the first
one written is as good as any).

The file sits beside the response cache, as ``embeddings.sqlite`` (see
``wiring.embedding_store_path``); nothing in it ever goes stale, so it has no refresh mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_budgetbench.cache import SharedDatabase

STORE_FILE = "embeddings.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS vectors (
    space TEXT NOT NULL,
    key TEXT NOT NULL,
    vector BLOB NOT NULL,
    PRIMARY KEY (space, key)
) WITHOUT ROWID;
"""

# SQLite's default limit on the parameters of one statement is 999 on old builds.
_KEYS_PER_QUERY = 500


class VectorStore(SharedDatabase):
    """Vectors as float32 bytes, by (space, text key), in one SQLite file."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, _SCHEMA)

    def load(self, space: str, keys: Sequence[str]) -> dict[str, bytes]:
        """The stored vectors of ``keys`` in ``space`` (absent keys are left out)."""
        found: dict[str, bytes] = {}
        db = self._db()
        for start in range(0, len(keys), _KEYS_PER_QUERY):
            batch = keys[start : start + _KEYS_PER_QUERY]
            marks = ",".join("?" * len(batch))
            rows = db.execute(
                f"SELECT key, vector FROM vectors WHERE space = ? AND key IN ({marks})",
                (space, *batch),
            )
            found.update((key, bytes(vector)) for key, vector in rows)
        return found

    def save(self, space: str, vectors: Mapping[str, bytes]) -> None:
        """Store ``vectors`` in one transaction; a key already there is kept as it is."""
        if not vectors:
            return
        with self._transaction() as db:
            db.executemany(
                "INSERT OR IGNORE INTO vectors VALUES (?, ?, ?)",
                ((space, key, vector) for key, vector in vectors.items()),
            )

    def count(self, space: str | None = None) -> int:
        """Vectors stored in ``space`` (or in all spaces)."""
        if space is None:
            row = self._db().execute("SELECT COUNT(*) FROM vectors").fetchone()
        else:
            row = self._db().execute(
                "SELECT COUNT(*) FROM vectors WHERE space = ?", (space,)).fetchone()
        return int(row[0])
