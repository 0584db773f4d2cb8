"""pytest-xdist, in one place: what the controller hands its workers, how a process knows
it is a worker and what it was handed, how the sweep's cells are scheduled, and how a
SIGTERMed controller stops.

xdist is optional: nothing here imports it until its own hooks call :func:`make_scheduler`.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.pytest_face import nodeids
from pytest_budgetbench.pytest_face.nodeids import GATES_SCOPE, SWEEP_NODE

if TYPE_CHECKING:
    import pytest

WORKER_KEY = "budgetbench"
"""The run's state in ``workerinput``: its directory and endpoints, named once by the
controller."""


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def worker_state(config: pytest.Config) -> dict[str, Any] | None:
    """What the controller handed this worker, or None in the controller (or without xdist)."""
    workerinput = getattr(config, "workerinput", None)
    return workerinput.get(WORKER_KEY) if workerinput else None



def is_distributed(config: pytest.Config) -> bool:
    """Tests go out to xdist workers (``-n``/``--dist``): this process is their controller."""
    return getattr(config.option, "dist", "no") != "no"


def hand_to_worker(node: Any, state: dict[str, Any]) -> None:
    """Give a worker the run's state (``pytest_configure_node``)."""
    node.workerinput[WORKER_KEY] = state


def make_scheduler(config: pytest.Config, log: Any, groups: dict[str, str]) -> Any:
    """xdist's loadgroup scheduling, where a cell's group comes from its id, not from an
    ``@group`` suffix of its node id: ids stay the same with and without ``-n``, and the
    gates go out last, after every cell they judge was handed out."""
    from xdist.scheduler import LoadGroupScheduling

    class SweepScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeids.is_gate_nodeid(nodeid):
                return GATES_SCOPE
            params = nodeids.params_of(nodeid)
            group = groups.get(params)
            if group is None and params:
                group = next((g for cell_id, g in groups.items()
                              if params.startswith(cell_id + "-")
                              or params.endswith("-" + cell_id)), None)
            if group is not None:
                return f"{SWEEP_NODE}-group:{group}"
            return str(super()._split_scope(nodeid))

        def _assign_work_unit(self, node: Any) -> None:
            if GATES_SCOPE in self.workqueue and len(self.workqueue) > 1:
                self.workqueue.move_to_end(GATES_SCOPE)
            super()._assign_work_unit(node)

    return SweepScheduling(config, log)


def stop_workers_on_sigterm() -> Callable[[], None]:
    """Make SIGTERM stop an xdist controller as Ctrl-C does, so that it tears its workers
    down (xdist interrupts a worker's cell, and kills a worker that does not stop) and
    exits after them: a worker never outlives it to append a row. Without this SIGTERM
    ends the controller at once, and each worker finishes its model call and appends its
    row to a run that has ended. A second SIGTERM ends it at once. Returns what undoes it."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    found = signal.getsignal(signal.SIGTERM)
    previous = signal.SIG_DFL if found is None else found

    def interrupt(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, previous)
        raise KeyboardInterrupt("budgetbench: SIGTERM: stopping the xdist workers, then exiting")

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    signal.signal(signal.SIGTERM, interrupt)
    return restore
