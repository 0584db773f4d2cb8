"""Which process this is among pytest-xdist's workers, read from the environment xdist
sets (rows, caches and embedders ask too, below the pytest face)."""

from __future__ import annotations

import os
from typing import Any

import pytest

WORKER_KEY = "budgetbench"
"""The run's state in ``workerinput``: its directory and endpoints, named once by the
controller."""


def worker_id() -> str | None:
    """This worker's name (``gw0``), or None outside xdist's workers."""
    return os.environ.get("PYTEST_XDIST_WORKER")


def worker_count() -> int:
    """How many xdist workers share this machine's cores (1 outside xdist)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    return int(workers) if workers.isdigit() and int(workers) > 0 else 1


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def worker_state(config: pytest.Config) -> dict[str, Any] | None:
    """What the controller handed this worker, or None in the controller (or without xdist)."""
    workerinput = getattr(config, "workerinput", None)
    return workerinput.get(WORKER_KEY) if workerinput else None
