"""Structured output: an auxiliary reply that should be JSON asks the endpoint to follow a
JSON schema, in the form the endpoint takes, found once per endpoint.

Endpoints constrain decoding to a schema through ``response_format``, in one of two forms:

- ``json_schema``: ``{"type": "json_schema", "json_schema": {"name", "schema"}}``, as
  OpenAI (structured outputs), vLLM (guided decoding) and llama.cpp's own server take it;
- ``json_object``: ``{"type": "json_object", "schema": {...}}``, the only form
  llama-cpp-python's server (the embedded model's) takes: it answers the other with a
  500 whose body is the validation error (0.3.x).

``--budgetbench-structured-output`` chooses: ``auto`` (default) finds the form with a
probe, ``json_schema`` or ``json_object`` sends that form unprobed, ``off`` sends none.
The probe is a tiny request (a one-field schema, a few tokens): the first form the
endpoint accepts (no error) and answers with JSON that fits the probe's schema is the
endpoint's form, else the first it accepts; when it fails on both, the form is ``none``
and nothing is sent (see :func:`probe`). Either way the
strategies' lenient parsing reads the reply, and a reply it cannot use is counted as an
``aux_failure`` exactly as before: a schema makes fewer of them, never hides one.

The form found is kept in the response cache (under a key of its own), so every xdist
worker, thread and later run on the same endpoint asks once: a worker that finds another
probing waits for its answer (the cache's claims). Without a response cache (sampled
replies) each process probes once. A request sent with a schema keys the cache on its
``response_format`` too; one without keeps its key (:func:`~pytest_budgetbench.cache.responses.
request_key`). A ``response_format`` is not part of the prompt: llama.cpp turns the
schema into a grammar that constrains sampling, and counts no token for it.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any, Literal

from pytest_budgetbench.errors import EndpointError
from pytest_budgetbench.messages import Message, Schema
from pytest_budgetbench.model.backend import ChatBackend, Completion

if TYPE_CHECKING:
    from pytest_budgetbench.cache.responses import ResponseStore

Setting = Literal["auto", "json_schema", "json_object", "off"]
Form = Literal["json_schema", "json_object", "none"]
FORMS: tuple[Form, ...] = ("json_schema", "json_object")
"""The forms a probe tries, in this order (the standard one first)."""

PROBE_VERSION = 1
"""Part of the probe's cache key: a change to the probe asks every endpoint again."""


PROBE_SCHEMA = Schema("probe", {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                "required": ["ok"]})
PROBE_MESSAGES: tuple[Message, ...] = (
    {"role": "user", "content": 'Reply with the JSON object {"ok": true} and nothing else.'},)
PROBE_MAX_TOKENS = 16


def response_format(form: Form, schema: Schema) -> dict[str, Any] | None:
    """The ``response_format`` that asks for ``schema`` in ``form``; None for ``none``."""
    if form == "json_schema":
        return {"type": "json_schema",
                "json_schema": {"name": schema.name, "schema": dict(schema.schema)}}
    if form == "json_object":
        return {"type": "json_object", "schema": dict(schema.schema)}
    return None


def follows_probe(text: str) -> bool:
    """Whether a probe's reply is the JSON its schema asks for (``{"ok": <bool>}``)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and isinstance(value.get("ok"), bool)


def probe(chat: ChatBackend) -> Form:
    """The first form ``chat``'s endpoint accepts and follows; else the first it accepts
    (sending it does no harm: its replies are parsed as leniently as any); ``none`` when
    it takes neither.

    A form the endpoint fails on is not taken: a 400 or 422, and also a 500 after the
    client's retries (llama-cpp-python's server answers a ``json_schema`` it cannot read
    with a 500 whose body is the validation error). When both fail, the probe is sent once
    more without a ``response_format``: its failure (the endpoint is down) is raised, as
    for any request, and nothing is kept; its success means ``none``."""
    accepted: list[Form] = []
    for form in FORMS:
        try:
            reply = chat.complete(PROBE_MESSAGES, max_tokens=PROBE_MAX_TOKENS,
                                  response_format=response_format(form, PROBE_SCHEMA))
        except EndpointError:
            continue
        if follows_probe(reply.text):
            return form
        accepted.append(form)
    if accepted:
        return accepted[0]
    chat.complete(PROBE_MESSAGES, max_tokens=PROBE_MAX_TOKENS)  # raises when it is down
    return "none"


class StructuredOutput:
    """The ``response_format`` one endpoint gets for a reply that should follow a schema.

    ``chat`` is the endpoint's client (its probe goes through it); ``memo``, the response
    cache, keeps the form found under a key of ``identity`` and ``model`` (see the module's
    docstring). Thread-safe: the first caller probes, the others wait for its answer."""

    def __init__(self, setting: Setting, chat: ChatBackend, *, identity: str, model: str,
                 memo: ResponseStore | None = None) -> None:
        self.setting = setting
        self._chat = chat
        self._identity = identity
        self._model = model
        self._memo = memo
        self._form: Form | None = None
        self._lock = threading.Lock()

    @property
    def form(self) -> Form:
        """The form this endpoint's schemas are sent in (probed on first use under auto)."""
        with self._lock:
            if self._form is None:
                self._form = self._resolve()
            return self._form

    def response_format(self, schema: Schema) -> dict[str, Any] | None:
        return response_format(self.form, schema)

    def _resolve(self) -> Form:
        if self.setting == "off":
            return "none"
        if self.setting != "auto":
            return self.setting
        if self._memo is None:
            return probe(self._chat)
        return self._remembered()

    def _remembered(self) -> Form:
        from pytest_budgetbench.cache.responses import once, request_key

        assert self._memo is not None
        key = request_key(self._identity, self._model,
                          {"structured_output_probe": PROBE_VERSION}, [])

        def found() -> Completion:
            return Completion(text=probe(self._chat), prompt_tokens=None,
                              completion_tokens=None, latency_s=0.0)

        text = once(self._memo, key, found).text
        return next((form for form in FORMS if form == text), "none")

