from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_budgetbench.budget import GGUFCounter
from tests.fake_openai import FakeOpenAI
from tests.strategy_helpers import load_gguf

pytest_plugins = ["pytester"]


@pytest.fixture
def fake_endpoint() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gguf() -> GGUFCounter:
    """The embedded model's exact token counter (skips where llama.cpp is missing)."""
    return load_gguf()
