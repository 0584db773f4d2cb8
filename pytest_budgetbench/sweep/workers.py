"""Which process of the sweep this is among pytest-xdist's workers, read from the environment
xdist sets (rows, caches and embedders ask too, below the pytest face; what the controller
hands a worker is :mod:`pytest_budgetbench.pytest_face.xdist`'s)."""

from __future__ import annotations

import os


def worker_id() -> str | None:
    """This worker's name (``gw0``), or None outside xdist's workers."""
    return os.environ.get("PYTEST_XDIST_WORKER")


def worker_count() -> int:
    """How many xdist workers share this machine's cores (1 outside xdist)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    return int(workers) if workers.isdigit() and int(workers) > 0 else 1
