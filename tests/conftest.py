from __future__ import annotations

from collections.abc import Iterator

import numpy  # noqa: F401 - see below
import pytest

from pytest_budgetbench.budget import GGUFCounter
from tests.fake_openai import FakeOpenAI
from tests.strategy_helpers import load_gguf

pytest_plugins = ["pytester"]
# numpy is imported here, once: an in-process pytester run imports it for the summary's
# bootstrap interval, pytester then drops the modules the run imported, and numpy cannot
# be imported a second time in one process.


@pytest.fixture
def fake_endpoint() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gguf() -> GGUFCounter:
    """The embedded model's exact token counter (skips where llama.cpp is missing)."""
    return load_gguf()
