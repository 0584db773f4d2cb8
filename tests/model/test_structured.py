"""Structured auxiliary output: the form an endpoint takes a JSON schema in, found once per
endpoint; the schema on the aux calls that expect JSON; the response cache's key."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.cache.responses import CachingChatModel, ResponseStore, request_key
from pytest_budgetbench.engine.aux_calls import RecordedAuxModel
from pytest_budgetbench.errors import EndpointError, RequestRejected
from pytest_budgetbench.messages import Message
from pytest_budgetbench.model.chat import ChatModel
from pytest_budgetbench.model.structured import (
    PROBE_SCHEMA,
    Schema,
    StructuredOutput,
    probe,
    response_format,
)
from pytest_budgetbench.strategies.mem0 import EXTRACTION_SCHEMA
from pytest_budgetbench.tokens.approximate import ApproxCounter
from tests.fake_openai import FakeOpenAI

QUESTION: list[Message] = [{"role": "user", "content": "What is my dog called?"}]
SCHEMA = Schema("answer", {"type": "object", "properties": {"name": {"type": "string"}},
                           "required": ["name"]})


def chat_of(fake: FakeOpenAI) -> ChatModel:
    return ChatModel(fake.base_url, fake.model, attempts=1, backoff_s=0.0)


def probes(fake: FakeOpenAI) -> list[str]:
    """The forms of the probe requests the fake received, in order."""
    return [request["response_format"]["type"] for request in fake.requests
            if "response_format" in request
            and json.dumps(PROBE_SCHEMA.schema) in json.dumps(request["response_format"])]


# -- the forms and the probe ---------------------------------------------------------------
def test_the_two_forms_carry_the_schema_where_each_server_reads_it() -> None:
    assert response_format("json_schema", SCHEMA) == {
        "type": "json_schema", "json_schema": {"name": "answer", "schema": dict(SCHEMA.schema)}}
    assert response_format("json_object", SCHEMA) == {"type": "json_object",
                                                      "schema": dict(SCHEMA.schema)}
    assert response_format("none", SCHEMA) is None


@pytest.mark.parametrize(
    ("takes", "status", "found", "tried"),
    [({"json_schema", "json_object"}, 400, "json_schema", ["json_schema"]),  # OpenAI, vLLM
     ({"json_object"}, 500, "json_object", ["json_schema", "json_object"]),  # llama-cpp-py
     ({"json_object"}, 422, "json_object", ["json_schema", "json_object"]),
     (set(), 400, "none", ["json_schema", "json_object"])],  # a server that takes neither
)
def test_the_probe_finds_the_form_the_endpoint_takes(
    fake: FakeOpenAI, takes: set[str], status: int, found: str, tried: list[str],
) -> None:
    fake.response_formats, fake.reject_status, fake.constrained = takes, status, True
    assert probe(chat_of(fake)) == found
    assert probes(fake) == tried


def test_a_probe_of_an_endpoint_that_fails_on_everything_raises(fake: FakeOpenAI) -> None:
    fake.faults = ["500", "500", "500"]  # both forms, then the probe without one
    with pytest.raises(EndpointError, match="500"):
        probe(chat_of(fake))
    assert len(fake.requests) == 3


def test_a_rejected_response_format_is_a_request_rejected_error_never_retried(
    fake: FakeOpenAI,
) -> None:
    fake.response_formats, fake.reject_status = {"json_object"}, 422
    chat = ChatModel(fake.base_url, fake.model, attempts=3, backoff_s=0.0)
    with pytest.raises(RequestRejected, match="422"):
        chat.complete(QUESTION, max_tokens=8,
                      response_format=response_format("json_schema", SCHEMA))
    assert len(fake.requests) == 1


def test_a_form_accepted_but_not_followed_gives_way_to_one_followed(fake: FakeOpenAI) -> None:
    answers = iter(["not json", '{"ok": true}'])  # the json_schema probe's, then the other's
    fake.responder = lambda _messages: next(answers)
    assert probe(chat_of(fake)) == "json_object"
    assert probes(fake) == ["json_schema", "json_object"]


def test_a_form_accepted_but_never_followed_is_still_sent(fake: FakeOpenAI) -> None:
    assert probe(chat_of(fake)) == "json_schema"  # the fake ignores it; parsing stays lenient


# -- once per endpoint ---------------------------------------------------------------------
def test_the_form_is_probed_once_per_endpoint_across_models_and_runs(
    fake: FakeOpenAI, tmp_path: Path,
) -> None:
    fake.response_formats, fake.constrained = {"json_object"}, True
    path = tmp_path / "responses.sqlite"

    def structured(run_id: str, identity: str = "http://fake") -> StructuredOutput:
        store = ResponseStore(path, run_id=run_id)
        chat = CachingChatModel(chat_of(fake), store, endpoint=identity)
        return StructuredOutput("auto", chat, identity=identity, model=fake.model, memo=store)

    first, second = structured("run-a"), structured("run-a")  # two workers, say
    assert first.form == "json_object" and first.form == "json_object"
    assert second.form == "json_object"
    assert structured("run-b").form == "json_object"  # a later run
    assert probes(fake) == ["json_schema", "json_object"]
    assert structured("run-b", "http://another").form == "json_object"
    assert len(probes(fake)) == 4  # another endpoint is probed for itself


@pytest.mark.parametrize(("setting", "form"), [("off", "none"), ("json_schema", "json_schema"),
                                               ("json_object", "json_object")])
def test_a_chosen_form_is_not_probed(fake: FakeOpenAI, setting: Any, form: str) -> None:
    structured = StructuredOutput(setting, chat_of(fake), identity="x", model="m")
    assert structured.form == form and fake.requests == []


# -- the aux call --------------------------------------------------------------------------
def aux_of(fake: FakeOpenAI, setting: Any) -> RecordedAuxModel:
    chat = chat_of(fake)
    structured = StructuredOutput(setting, chat, identity="x", model=fake.model)
    return RecordedAuxModel(chat, ApproxCounter(), 1000, "cell", strategy="s",
                            structured=structured)


@pytest.mark.parametrize(
    ("takes", "setting", "sent"),
    [({"json_schema", "json_object"}, "auto", response_format("json_schema", SCHEMA)),
     ({"json_object"}, "auto", response_format("json_object", SCHEMA)),
     (set(), "auto", None),
     ({"json_schema", "json_object"}, "off", None)],
)
def test_an_aux_call_sends_its_schema_in_the_endpoints_form_or_not_at_all(
    fake: FakeOpenAI, takes: set[str], setting: str, sent: dict[str, Any] | None,
) -> None:
    fake.response_formats = takes
    aux = aux_of(fake, setting)
    aux.complete(QUESTION, max_tokens=8, purpose="extract", schema=SCHEMA)
    call = fake.requests[-1]
    assert call["messages"] == QUESTION and call.get("response_format") == sent
    (recorded,) = aux.calls
    assert recorded.row()["response_format"] == (sent["type"] if sent else "none")


def test_an_aux_call_without_a_schema_sends_none_and_probes_nothing(fake: FakeOpenAI) -> None:
    aux = aux_of(fake, "auto")
    aux.complete(QUESTION, max_tokens=8, purpose="summary")
    assert [("response_format" in r) for r in fake.requests] == [False]
    assert "response_format" not in aux.calls[0].row()  # the row as it always was


def test_the_schema_is_not_counted_as_prompt_tokens(fake: FakeOpenAI) -> None:
    aux = aux_of(fake, "json_schema")
    aux.complete(QUESTION, max_tokens=8, purpose="a", schema=SCHEMA)
    aux.complete(QUESTION, max_tokens=8, purpose="b")
    assert aux.calls[0].input_tokens == aux.calls[1].input_tokens


# -- the response cache's key --------------------------------------------------------------
def test_a_request_without_a_response_format_keeps_the_key_it_always_had() -> None:
    params = {"temperature": 0.0, "seed": 0, "max_tokens": 8}
    canonical = json.dumps({"endpoint": "http://h:1/v1", "model": "m", "params": params,
                            "messages": QUESTION}, sort_keys=True, ensure_ascii=False,
                           separators=(",", ":"))
    before = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    assert request_key("http://h:1/v1", "m", params, QUESTION) == before
    assert request_key("http://h:1/v1", "m", params, QUESTION, response_format=None) == before
    with_schema = request_key("http://h:1/v1", "m", params, QUESTION,
                              response_format=response_format("json_object", SCHEMA))
    other_form = request_key("http://h:1/v1", "m", params, QUESTION,
                             response_format=response_format("json_schema", SCHEMA))
    assert len({before, with_schema, other_form}) == 3


def test_the_cache_answers_a_schemad_request_only_with_a_schemad_reply(
    fake: FakeOpenAI, tmp_path: Path,
) -> None:
    chat = CachingChatModel(chat_of(fake), ResponseStore(tmp_path / "r.sqlite", run_id="r"))
    sent = response_format("json_schema", SCHEMA)
    assert not chat.complete(QUESTION, max_tokens=8).cached
    assert not chat.complete(QUESTION, max_tokens=8, response_format=sent).cached
    assert chat.complete(QUESTION, max_tokens=8, response_format=sent).cached
    assert len(fake.requests) == 2


# -- the schemas beside their parsers ------------------------------------------------------
def test_the_least_reply_each_schema_allows_is_one_its_parser_calls_well_formed() -> None:
    from pytest_budgetbench.strategies.amem import (
        EVOLUTION_SCHEMA,
        NOTE_SCHEMA,
        parse_evolution,
        parse_note,
    )
    from pytest_budgetbench.strategies.mem0 import parse_extraction
    from pytest_budgetbench.strategies.memgpt import EDIT_SCHEMA, SEARCH_SCHEMA, parse_calls
    from tests.fake_openai import least_instance

    def least(schema: Schema) -> str:
        return json.dumps(least_instance(dict(schema.schema)))

    assert parse_extraction(least(EXTRACTION_SCHEMA))[1]
    assert parse_note(least(NOTE_SCHEMA))[1]
    assert parse_evolution(least(EVOLUTION_SCHEMA))[1]
    assert parse_calls(least(EDIT_SCHEMA))[1] and parse_calls(least(SEARCH_SCHEMA))[1]
    one_edit = {"calls": [{"name": "core_memory_append",
                           "arguments": {"label": "human", "content": "likes tea"}}]}
    assert parse_calls(json.dumps(one_edit)) == ([("core_memory_append",
                                                   one_edit["calls"][0]["arguments"])], True)
