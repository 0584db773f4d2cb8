"""Where answers come from: the endpoint the controller resolves once per session, as rows,
run.json and the response cache name it: one URL, the embedded server, or several replicas
of one model (:mod:`~pytest_budgetbench.model.replicas`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_budgetbench.model.chat import REPLY_NEUTRAL_FLAGS, redact_url
from pytest_budgetbench.records.run_json import ServerRecord

EMBEDDED_LABEL = "embedded"
"""The embedded server's ``endpoint`` in rows and run.json: it starts on the first cache
miss, if at all, on a new port every run, so no URL would say anything."""

MODEL_FREE_LABEL = "none"
"""A model-free sweep's ``endpoint`` and ``model`` in rows and run.json: nothing answers."""


@dataclass(frozen=True)
class Endpoint:
    """Where answers come from, as resolved once per session by the controller.

    The embedded server's endpoint is known from its GGUF alone: ``base_url`` is empty
    until (and unless) the server is started at session start; a launcher gives the URL
    of one started on demand."""

    base_url: str = field(repr=False)  # may hold credentials: tracebacks repr endpoints
    model: str
    embedded: bool = False
    gguf_path: str | None = None
    server_flags: dict[str, Any] = field(default_factory=dict)
    replicas: tuple[str, ...] = field(default=(), repr=False)
    """Every URL of a model served by several replicas, ``base_url`` first (its token
    counts are every replica's); empty for one URL."""
    sends: bool = True
    """False for a model-free sweep's (``--budgetbench-model=none``): no model answers, so
    prompts are counted and checked, and nothing is sent."""
    server: ServerRecord = field(default_factory=ServerRecord)
    """What answers at ``base_url`` and its context size
    (:func:`~pytest_budgetbench.model.servers.detect_server`), probed once by the
    controller; empty for the embedded server and a model-free sweep."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicas", tuple(self.replicas))  # a worker gets a list

    @property
    def label(self) -> str:
        """The endpoint as rows and run.json show it (secrets redacted): a pool's URLs, as
        given, comma-separated."""
        if self.replicas:
            return ",".join(redact_url(url) for url in self.replicas)
        if not self.sends:
            return MODEL_FREE_LABEL
        return EMBEDDED_LABEL if self.embedded else redact_url(self.base_url)

    @property
    def identity(self) -> str:
        """Who answers, for the response cache: the URL, or for the embedded server its
        model file and the flags that shape replies (not its port, new every session, nor
        its context size or OpenMP wait policy, which change no reply).

        Several replicas of one model are the model, ``replicas:<model>``: which replica
        answers, how many there are and where they run (pods get new addresses) change no
        reply, so adding a replica keeps the cache. Two pools that serve different weights
        under one model id would share replies: give such models their own ids."""
        if self.replicas:
            return f"replicas:{self.model}"
        if not self.embedded:
            return self.base_url
        flags = ",".join(f"{k}={v}" for k, v in sorted(self.server_flags.items())
                         if k not in REPLY_NEUTRAL_FLAGS)
        return f"embedded:{Path(self.gguf_path or '').name}:{flags}"
