"""pytest-xdist support, in :mod:`pytest_budgetbench.pytest_face.xdist`."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from pytest_budgetbench.pytest_face import xdist as distributed
from pytest_budgetbench.sweep.workers import worker_count

pytest.importorskip("xdist")


def test_a_worker_reads_what_the_controller_handed_it() -> None:
    node = SimpleNamespace(workerinput={})
    distributed.hand_to_worker(node, {"run_dir": "/tmp/run"})
    worker = SimpleNamespace(workerinput=node.workerinput)
    assert distributed.worker_state(worker) == {"run_dir": "/tmp/run"}  # type: ignore[arg-type]
    assert distributed.is_worker(worker)  # type: ignore[arg-type]
    controller = SimpleNamespace()
    assert distributed.worker_state(controller) is None  # type: ignore[arg-type]
    assert not distributed.is_worker(controller)  # type: ignore[arg-type]


def test_cells_go_out_by_group_and_gates_last_together(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig("--tx", "2*popen")
    scheduler = distributed.make_scheduler(config, None, {"needle-0-plain-512": "g1"})
    scope = scheduler._split_scope
    assert scope("budgetbench::cell[needle-0-plain-512]") == "budgetbench-group:g1"
    # A user's test over budget_cell, beside another parameter, joins the cell's group.
    assert scope("tests/test_x.py::test_y[needle-0-plain-512-1]") == "budgetbench-group:g1"
    assert scope("budgetbench::gate[max-violation-rate plain@512]") == "budgetbench::gate"


def test_the_embedder_shares_the_cores_among_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_budgetbench.embeddings.backends import default_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    assert (worker_count(), default_threads()) == (1, 4)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    assert (worker_count(), default_threads()) == (2, 2)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "junk")
    assert worker_count() == 1
