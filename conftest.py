"""Repository conftest: a sweep (``pytest --budgets=...``) runs only the sweep's cells,
not this project's own test suite."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    sweeping = config.getoption("budgetbench_budgets") or config.getini("budgetbench_budgets")
    own_tests = config.rootpath / "tests"
    if sweeping and (collection_path == own_tests or own_tests in collection_path.parents):
        return True
    return None
