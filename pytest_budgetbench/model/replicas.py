"""Several replicas of one model: requests spread by least in-flight, and failover.

A team that serves one model on several vLLM or llama.cpp servers gives every URL
(``--budgetbench-endpoint=URL,URL`` or the flag repeated). :class:`ReplicaPool` is a
:class:`~pytest_budgetbench.model.backend.ChatBackend` over one
:class:`~pytest_budgetbench.model.chat.ChatModel` per URL:

- A request goes to the usable replica with the fewest requests in flight from this
  process, never past ``per_replica`` requests at one replica
  (``--budgetbench-concurrency``, one by default). With request slots (a slot directory
  per replica, as :class:`~pytest_budgetbench.model.chat.RequestSlots` keeps them) the bound
  holds across xdist workers too; the in-flight counts that choose a replica are this
  process's own. Among those as free, it goes where this process last sent the longest
  start of its messages (ties in turn): a server reuses the prompt it holds from its
  start (llama.cpp keeps its last one), so an agent episode's calls, each the previous
  one's prompt and more, and an item's cells, which share its first messages, stay on one
  replica instead of starting cold on another.
- A replica whose request fails after its retries for a reason of the server's
  (:class:`~pytest_budgetbench.errors.EndpointUnavailable`: refused or dropped
  connections, timeouts, 429s, 5xx) is taken out for a cool-down, doubled for each failure
  in a row (30 s, 60 s, ... up to 10 min), and the request goes to another replica. A
  failure of the request itself (a 400) would be the same at every replica: it is raised
  as it is.
- A reply that cannot be used (:class:`~pytest_budgetbench.errors.MalformedReply`: a 200
  whose body is not JSON, no choices, tool calls that share an id) may be the replica's or
  the model's: the request goes to another replica. Where that one's reply is usable, the
  first replica is at fault and is taken out as for a 5xx; where every replica's reply is
  malformed, the model's reply is, no replica is taken out, and the request raises
  MalformedReply, as one endpoint would.
- A replica comes back when its cool-down ends; its next request tells whether it is up
  again. When every replica is out, a request still goes to the one that comes back
  first, so an outage of all of them is what it is with one endpoint: each request tries,
  and errors. A request every replica has failed raises the last failure, an
  EndpointError: never an answer.

Which replica answered changes no reply: the response cache keys on the pool's identity
(:attr:`~pytest_budgetbench.model.endpoint.Endpoint.identity`, the model), never on a replica.
Each replica taken out, and each one back, is told to ``on_event`` as a
:class:`~pytest_budgetbench.records.replicas.ReplicaEvent` (the run keeps them in
``replicas.jsonl``, through that module; the summary names them), with its URL redacted.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_budgetbench.errors import EndpointError, EndpointUnavailable, MalformedReply
from pytest_budgetbench.messages import Message, Tool, shared_prefix
from pytest_budgetbench.model.chat import ChatModel, Completion, RequestSlots
from pytest_budgetbench.model.tool_parser import ToolParser
from pytest_budgetbench.records.replicas import ReplicaEvent
from pytest_budgetbench.redact import redact, redact_url

COOLDOWN_S = 30.0
"""How long a replica that failed is left out, doubled for each failure in a row."""
MAX_COOLDOWN_S = 600.0
SLOT_POLL_S = 0.01
"""How often a request waiting for a slot another process holds looks again."""



@dataclass
class Replica:
    """One replica's client and what the pool knows of it (under the pool's lock)."""

    chat: ChatModel
    index: int
    slots: RequestSlots | None = None
    in_flight: int = 0
    out_until: float = 0.0
    """When it may take requests again (the pool's clock); 0 while it is in."""
    failures: int = 0
    """Failures in a row, each ending a request's retries; 0 after a success."""
    last_prompt: tuple[str, ...] = ()
    """The messages this process last sent it, each by its digest (what it may hold)."""

    @property
    def label(self) -> str:
        return redact_url(self.chat.base_url)


class ReplicaPool:
    """One model at several URLs, as one chat backend (see the module's docstring).

    ``slots_dir``: where each replica's request slots live (``replica-<i>`` under it),
    so that ``per_replica`` bounds the requests at a replica across processes; without it
    the bound is this process's. ``first`` is the replica first in line (an xdist worker's
    number, so that workers do not all start at one replica). ``clock`` is for tests."""

    def __init__(self, chats: Sequence[ChatModel], *, per_replica: int = 1,
                 slots_dir: Path | None = None,
                 on_event: Callable[[ReplicaEvent], None] | None = None,
                 cooldown_s: float = COOLDOWN_S, max_cooldown_s: float = MAX_COOLDOWN_S,
                 first: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        if not chats:
            raise ValueError("a ReplicaPool needs at least one replica")
        if len({(chat.model, chat.temperature, chat.seed, chat.tool_parser)
                for chat in chats}) != 1:
            raise ValueError("a ReplicaPool's replicas must serve one model with one set "
                             "of generation parameters")
        self.replicas = [
            Replica(chat, index, RequestSlots(slots_dir / f"replica-{index}", per_replica)
                    if slots_dir is not None else None)
            for index, chat in enumerate(chats)]
        self.per_replica = per_replica
        self._on_event = on_event
        self._cooldown_s = cooldown_s
        self._max_cooldown_s = max_cooldown_s
        self._clock = clock
        self._changed = threading.Condition()
        self._turn = first % len(self.replicas)
        """The replica first in line among those with as few requests in flight."""

    # -- what a response cache reads of the client it wraps ---------------------------------
    @property
    def model(self) -> str:
        return self.replicas[0].chat.model

    @property
    def params(self) -> dict[str, Any]:
        return self.replicas[0].chat.params

    @property
    def tool_parser(self) -> ToolParser:
        return self.replicas[0].chat.tool_parser

    @property
    def base_url(self) -> str:
        """No one URL answers for the pool: a response cache must be given its identity."""
        return ""

    # -- requests ------------------------------------------------------------------------
    def complete(self, messages: Sequence[Message], *, max_tokens: int,
                 tools: Sequence[Tool] | None = None,
                 response_format: Mapping[str, Any] | None = None) -> Completion:
        request = {"max_tokens": max_tokens, "tools": tools, "response_format": response_format}
        prompt = message_digests(messages, tools)
        tried: set[int] = set()
        malformed: list[tuple[Replica, MalformedReply]] = []
        while True:
            replica, slot = self._acquire(tried, prompt)
            outcome = self._ask(replica, slot, messages, request)
            if isinstance(outcome, Completion):
                self._back_in(replica)
                for bad, exc in malformed:  # this reply is usable: theirs were their fault
                    self._take_out(bad, exc)
                return outcome
            if isinstance(outcome, MalformedReply):
                malformed.append((replica, outcome))
            tried.add(replica.index)
            if len(tried) == len(self.replicas):
                raise self._no_answer(outcome, len(tried), len(malformed))

    def _ask(self, replica: Replica, slot: int | None, messages: Sequence[Message],
             request: dict[str, Any]) -> Completion | EndpointUnavailable | MalformedReply:
        """``replica``'s reply, or the failure after which another replica may answer (any
        other is raised). A replica that failed for a reason of the server's is taken out
        before its slot is freed, so that no request waiting for the slot picks it."""
        try:
            completion: Completion = replica.chat.complete(messages, **request)
            return completion
        except EndpointUnavailable as exc:
            self._take_out(replica, exc)
            return exc
        except MalformedReply as exc:  # whose fault it is, another replica's reply tells
            return exc
        finally:
            self._release(replica, slot)

    def _no_answer(self, last: EndpointError, tried: int, malformed: int) -> EndpointError:
        """The error of a request that no replica answered usably: MalformedReply where one
        replied malformed (the model's reply may be: no replica is blamed for it)."""
        if not malformed:
            return EndpointUnavailable(redact(
                f"every replica of model {self.model!r} failed this request ({tried} of "
                f"{tried}); the last: {last}"))
        why = ("every one replied malformed, so the fault is the model's reply, not a "
               "replica's, and none was taken out for it" if malformed == tried
               else f"{malformed} replied malformed, the others failed")
        return MalformedReply(redact(
            f"no replica of model {self.model!r} gave a usable reply to this request ({tried} "
            f"tried; {why}); the last: {last}"))

    def _acquire(self, tried: set[int], prompt: tuple[str, ...] = ()
                 ) -> tuple[Replica, int | None]:
        """The replica this request (``prompt``: its messages' digests) goes to and the
        slot it holds there, waiting while every candidate is at its bound."""
        with self._changed:
            while True:
                chosen = self._pick(tried, prompt)
                if chosen is not None:
                    replica, slot = chosen
                    replica.in_flight += 1
                    replica.last_prompt = prompt
                    self._turn = (replica.index + 1) % len(self.replicas)
                    return replica, slot
                # A slot another process frees sends no notice here: look again soon.
                self._changed.wait(SLOT_POLL_S if self.replicas[0].slots else None)

    def _pick(self, tried: set[int], prompt: tuple[str, ...] = ()
              ) -> tuple[Replica, int | None] | None:
        """The least loaded candidate under its bound, with its slot; None when none is."""
        for replica in self._candidates(tried, prompt):
            if replica.in_flight >= self.per_replica:
                continue
            if replica.slots is None:
                return replica, None
            slot = replica.slots.try_take()
            if slot is not None:
                return replica, slot
        return None

    def _candidates(self, tried: set[int], prompt: tuple[str, ...] = ()) -> list[Replica]:
        """The replicas in while this request has not tried them, fewest in flight first,
        then the longest start of ``prompt`` last sent there, then in turn; when none is,
        the one back first (a last resort, so an outage of every replica errors each
        request as one endpoint would)."""
        now = self._clock()
        untried = [r for r in self.replicas if r.index not in tried]
        usable = [r for r in untried if r.out_until <= now]
        if not usable:
            usable = [min(untried, key=lambda r: r.out_until)]
        count = len(self.replicas)
        return sorted(usable, key=lambda r: (r.in_flight, -shared_start(r.last_prompt, prompt),
                                             (r.index - self._turn) % count))

    def _release(self, replica: Replica, slot: int | None) -> None:
        if slot is not None and replica.slots is not None:
            replica.slots.release(slot)
        with self._changed:
            replica.in_flight -= 1
            self._changed.notify_all()

    def _take_out(self, replica: Replica, exc: EndpointError) -> None:
        """Leave ``replica`` out for its cool-down; a replica already out (another request
        to it failed first) keeps the cool-down it has."""
        with self._changed:
            now = self._clock()
            if replica.out_until > now:
                return
            replica.failures += 1
            cooldown = min(self._max_cooldown_s,
                           self._cooldown_s * 2 ** (replica.failures - 1))
            replica.out_until = now + cooldown
        self._tell({"event": "out", "replica": replica.label, "cooldown_s": cooldown,
                    "error": redact(str(exc))})

    def _back_in(self, replica: Replica) -> None:
        with self._changed:
            was_out = replica.failures > 0
            replica.failures, replica.out_until = 0, 0.0
        if was_out:
            self._tell({"event": "back", "replica": replica.label})

    def _tell(self, event: ReplicaEvent) -> None:
        if self._on_event is not None:
            self._on_event(event)

    @property
    def out(self) -> list[str]:
        """The replicas out now (redacted URLs)."""
        now = self._clock()
        with self._changed:
            return [r.label for r in self.replicas if r.out_until > now]


def message_digests(messages: Sequence[Message], tools: Sequence[Tool] | None = None
                    ) -> tuple[str, ...]:
    """A request's tools and messages, each by a digest: what routing compares."""
    return tuple(hashlib.sha1(json.dumps(part, sort_keys=True, default=str).encode(),
                              usedforsecurity=False).hexdigest()
                 for part in (list(tools or ()), *messages))


def shared_start(first: Sequence[str], second: Sequence[str]) -> int:
    """How many leading messages two requests' digests (:func:`message_digests`) share,
    when their tools are the same (the tools come first in a rendered prompt)."""
    return max(shared_prefix(first, second) - 1, 0)
