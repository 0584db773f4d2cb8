"""check_messages: what the runner accepts from a strategy before it counts a prompt."""

from __future__ import annotations

import json
import math

import pytest

from pytest_budgetbench.messages import check_messages, private_copy


def test_a_valid_prompt_comes_back_unchanged() -> None:
    prompt = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "hi"},
                                     {"type": "image_url", "image_url": {"url": "data:,"}}]},
    ]
    assert check_messages(prompt, "strategy 's'") is prompt


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("text", "must return a list of chat messages"),
        ([{"role": "robot", "content": "x"}], "invalid message at index 0"),
        ([{"role": "user", "content": 3}], "without string or list 'content'"),
        ([{"role": "user", "content": ["a", "b"]}], "content part 0 that is not a"),
        ([{"role": "user", "content": [{"type": "text", "text": 1}]}], "'text' is not a string"),
        ([{"role": "user", "content": "x", "extra": object()}], "JSON cannot hold"),
        ([{"role": "user", "content": "x", "weight": math.nan}], "JSON cannot hold"),
    ],
)
def test_a_bad_prompt_names_its_producer_and_the_fault(prompt: object, expected: str) -> None:
    with pytest.raises(TypeError, match="strategy 's'") as info:
        check_messages(prompt, "strategy 's'")
    assert expected in str(info.value)


def test_a_private_copy_shares_nothing_a_strategy_could_change() -> None:
    originals = [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": [{"type": "text", "text": "part"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    ]
    kept = json.loads(json.dumps(originals))
    copied = private_copy(originals)
    assert copied == originals
    copied[0]["content"] = "changed"
    copied[1]["content"][0]["text"] = "changed"
    copied[2]["tool_calls"][0]["function"]["name"] = "changed"
    copied.append({"role": "user", "content": "more"})
    assert originals == kept


def test_arguments_as_objects_parses_each_calls_json_as_vllm_hands_it_to_a_template() -> None:
    from pytest_budgetbench.messages import arguments_as_objects

    call = {"id": "a", "type": "function",
            "function": {"name": "f", "arguments": '{"key": "R1", "n": [1, 2]}'}}
    broken = {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{not"}}
    scalar = {"id": "c", "type": "function", "function": {"name": "h", "arguments": "3"}}
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [call, broken, scalar]}]
    converted = arguments_as_objects(messages)
    assert converted[0] is messages[0]
    parsed = [c["function"]["arguments"] for c in converted[1]["tool_calls"]]
    assert parsed == [{"key": "R1", "n": [1, 2]}, "{not", "3"]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == call["function"]["arguments"]
