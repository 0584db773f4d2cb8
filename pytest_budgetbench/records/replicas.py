"""replicas.jsonl: the replicas of an endpoint taken out and back during a run, written
and read here.

A :class:`~pytest_budgetbench.model.replicas.ReplicaPool` tells each event; the wiring
stamps it with the process (the xdist worker) and the time and appends it here, and the
terminal summary reads this session's back. A record::

    {"event": "out", "replica": "http://a:8000/v1", "cooldown_s": 30.0,
     "error": "...", "worker": "gw0", "time": 1765000000.0}

(``"back"`` events have no ``cooldown_s`` and no ``error``; ``worker`` is null without
xdist.) URLs and errors are redacted by the pool.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal, NotRequired, TypedDict, cast

from pytest_budgetbench.records import jsonl

REPLICAS_FILE = "replicas.jsonl"

EventKind = Literal["out", "back"]


class ReplicaEvent(TypedDict):
    """One replicas.jsonl record: what the pool tells (``event``, ``replica`` and, for
    "out", ``cooldown_s`` and ``error``) and the stamp the run adds (``worker``, ``time``)."""

    event: EventKind
    replica: str
    """The replica's URL, redacted."""
    cooldown_s: NotRequired[float]
    """How long it is left out ("out" only)."""
    error: NotRequired[str]
    """The failure that took it out, redacted ("out" only)."""
    worker: NotRequired[str | None]
    """The xdist worker that saw it (None without xdist)."""
    time: NotRequired[float]
    """When, as ``time.time()``."""


def append_event(path: Path, event: ReplicaEvent, *, worker: str | None, when: float
                 ) -> None:
    """Append one event, stamped with the process that saw it and when (whole, under the
    file's lock: xdist workers share it)."""
    stamped: ReplicaEvent = {**event, "worker": worker, "time": when}
    jsonl.append_jsonl(path, stamped)


def read_events(path: Path) -> Iterator[ReplicaEvent]:
    """The events of a run in the file's order (none when it has none); a torn line, or
    a record that is not an event (no ``event`` of "out" or "back", a ``time`` that is
    neither a number nor null), is skipped."""
    for record in jsonl.read_jsonl(path):
        if record.get("event") not in ("out", "back"):
            continue
        when = record.get("time")
        if when is not None and (isinstance(when, bool) or not isinstance(when, int | float)):
            continue
        yield cast(ReplicaEvent, record)
