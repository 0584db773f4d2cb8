"""The persistent embedding cache: float32 vectors in SQLite, shared by every process.

A vector is addressed by its *space* (which model, which of its files, which backend and
export: :attr:`~pytest_budgetbench.embeddings.SentenceTransformerEmbedder.space`) and the
sha256 of its text, so vectors of two backends or two versions of a model never mix.
The file is in WAL mode: readers never wait, and xdist workers that write the same
vectors at once each insert or ignore (a vector is a function of its key, so the first
one written is as good as any).

The file sits beside the response cache, as ``embeddings.sqlite`` (see
``wiring.embedding_store_path``); nothing in it ever goes stale, so it has no refresh mode.
Every vector carries a checksum of its space, key and bytes: one that fails it (or has
none, from before checksums) is a miss, computed again (see
:mod:`pytest_budgetbench.cache.database`).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_budgetbench.cache.database import AS_BYTES, REJECTED_SCHEMA, Entry
from pytest_budgetbench.cache.spaced import SpacedValues

STORE_FILE = "embeddings.sqlite"

_SCHEMA = REJECTED_SCHEMA + """
CREATE TABLE IF NOT EXISTS vectors (
    space TEXT NOT NULL,
    key TEXT NOT NULL,
    vector BLOB NOT NULL,
    checksum TEXT,
    PRIMARY KEY (space, key)
) WITHOUT ROWID;
"""

SAME_VECTOR_TOLERANCE = 1e-5
"""Two vectors of one key that differ by no more than this in any component are the same
vector when caches are merged (L2-normalised: a component is at most 1 in size)."""


class VectorStore(SpacedValues):
    """Vectors as float32 bytes, by (space, text key), in one SQLite file."""

    label = "embedding cache"
    table = "vectors"
    value_column = "vector"
    value_sql = AS_BYTES.format("vector")
    value_noun = "vector"

    def __init__(self, path: Path) -> None:
        super().__init__(path, _SCHEMA)

    def checked_form(self, value: Any) -> object:
        return bytes(value)

    def same_value(self, ours: Entry, theirs: Entry) -> bool:
        """Equal within SAME_VECTOR_TOLERANCE, component by component: another machine's
        CPU may round a vector of the same model and text in its last bits."""
        mine, yours = bytes(ours["vector"]), bytes(theirs["vector"])
        if mine == yours:
            return True
        if len(mine) != len(yours) or len(mine) % 4:
            return False
        a, b = array("f", mine), array("f", yours)
        return all(abs(x - y) <= SAME_VECTOR_TOLERANCE for x, y in zip(a, b, strict=True))

    def load(self, space: str, keys: Sequence[str]) -> dict[str, bytes]:
        """The stored vectors of ``keys`` in ``space`` (absent and rejected keys are left
        out: a vector that fails its checksum is deleted, to be computed again)."""
        return {key: bytes(vector) for key, vector in self.load_values(space, keys).items()}

    def save(self, space: str, vectors: Mapping[str, bytes]) -> None:
        """Store ``vectors`` in one transaction; a key already there is kept as it is."""
        self.save_values(space, vectors)
