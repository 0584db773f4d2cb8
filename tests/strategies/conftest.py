"""Fixtures of the strategy tests (helpers they import are in ``tests/strategy_helpers.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def fresh_memories(request: pytest.FixtureRequest) -> Iterator[None]:
    """The memories built by the test module's strategy (its module's ``MEMORIES``) cleared
    before and after each test: each test builds its own. A memory-system module uses it
    with ``pytestmark = pytest.mark.usefixtures("fresh_memories")``."""
    memories = request.module.MEMORIES
    memories.clear()
    yield
    memories.clear()
