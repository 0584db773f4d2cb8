"""pytest-xdist support, in :mod:`pytest_budgetbench.distributed`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_budgetbench import distributed

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
