"""The OpenHands SDK's condensers as strategies (strategies/frameworks/openhands.py).

The SDK needs Python 3.12: on 3.11 this module skips, and CI runs it in its second venv,
``.venv312`` (``.ci/run``), where ``BUDGETBENCH_REQUIRE_OPENHANDS=1`` makes a missing SDK
a failure rather than a skip.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if sys.version_info < (3, 12):
    pytest.skip("the OpenHands SDK needs Python 3.12 or newer: CI runs these tests in "
                ".venv312 (.ci/run)", allow_module_level=True)
if not os.environ.get("BUDGETBENCH_REQUIRE_OPENHANDS") and importlib.util.find_spec(
        "openhands") is None:  # found, not imported: import_sdk sets it offline first
    pytest.skip("pip install 'pytest-budgetbench[openhands]'", allow_module_level=True)

from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_budgetbench.errors import BudgetExceeded, StrategyError
from pytest_budgetbench.messages import Message, check_tool_pairs, text_of
from pytest_budgetbench.strategies import REGISTRY
from pytest_budgetbench.strategies.base import StrategyContext
from pytest_budgetbench.strategies.frameworks import _openhands_events as events
from pytest_budgetbench.strategies.frameworks.openhands import (
    OPTIONS,
    SHIPPED_COUNTER,
    SUMMARY_PURPOSE,
    OpenHandsLLMSummarizing,
    OpenHandsLLMSummarizingExact,
    OpenHandsNoOp,
)
from pytest_budgetbench.testing import (
    TOOLS,
    EchoAuxModel,
    agent_trajectories,
    check_strategy,
    histories,
    last_unit,
    tool_counter,
)
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.base import TokenCounter
from tests.fake_openai import FakeOpenAI
from tests.strategy_helpers import ScriptedAux
from tests.sweeps import rows_of, sweep_args

events.import_sdk()
APPROX = ApproxCounter()
TEMPLATE_START = "You are maintaining a context-aware state summary"  # OpenHands' own


def long_chat(turns: int = 40) -> list[Message]:
    """A system message, ``turns`` long user/assistant turns, a question: 5,382 tokens by
    the approximate counter."""
    messages: list[Message] = [{"role": "system", "content": "You are helpful."}]
    for turn in range(turns):
        messages += [{"role": "user", "content": f"turn {turn}: I like item {turn} and "
                      + "blah " * 60},
                     {"role": "assistant", "content": f"ok {turn} " + "yes " * 40}]
    return [*messages, {"role": "user", "content": "what did I like at turn 3?"}]


def context(aux: Any = None, tokens: TokenCounter = APPROX, **options: Any) -> StrategyContext:
    return StrategyContext(tokens=tokens, aux=aux, options=options)


# -- conversion --------------------------------------------------------------------------
@st.composite
def shaped(draw: st.DrawFn, base: st.SearchStrategy[list[Message]]) -> list[Message]:
    """``base``'s messages, some with content as a list of text parts, some with a name,
    some assistant calls with "" content rather than None."""
    messages = copy.deepcopy(draw(base))
    for message in messages:
        text = message.get("content")
        if isinstance(text, str) and message["role"] != "tool" and draw(st.booleans()):
            cut = draw(st.integers(0, len(text)))
            message["content"] = [{"type": "text", "text": text[:cut]},
                                  {"type": "text", "text": text[cut:]}]
        if message["role"] == "user" and draw(st.integers(0, 4)) == 0:
            message["name"] = "alice"
        if message.get("tool_calls") and message["content"] is None and draw(st.booleans()):
            message["content"] = ""
    return messages


@settings(max_examples=80, deadline=None)
@given(shaped(st.one_of(agent_trajectories(), histories())))
def test_messages_cross_to_openhands_events_and_back_without_loss(
        messages: list[Message]) -> None:
    converted = events.to_events(messages)
    assert events.to_messages(converted, events.originals_of(messages)) == messages


def test_events_are_the_ones_an_openhands_agent_logs() -> None:
    from openhands.sdk.event import (
        ActionEvent,
        LLMConvertibleEvent,
        MessageEvent,
        ObservationEvent,
        SystemPromptEvent,
    )

    calls = [{"id": f"call_{k}", "type": "function",
              "function": {"name": f"tool_{k}", "arguments": json.dumps({"q": k})}}
             for k in range(2)]
    messages: list[Message] = [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "go"},
        {"role": "assistant", "content": "thinking", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_0", "content": "zero"},
        {"role": "tool", "tool_call_id": "call_1", "content": "one"}]
    made = events.to_events(messages)
    assert [type(e) for e in made] == [SystemPromptEvent, MessageEvent, ActionEvent,
                                       ActionEvent, ObservationEvent, ObservationEvent]
    first, second, result = made[2], made[3], made[5]
    assert (first.tool_call.id, first.tool_call.arguments) == ("call_0", '{"q": 0}')
    assert [t.text for t in first.thought] == ["thinking"] and not second.thought
    assert first.llm_response_id == second.llm_response_id
    assert (result.action_id, result.tool_name) == (second.id, "tool_1")
    # The SDK's own conversion joins the response's calls into one assistant message.
    joined = LLMConvertibleEvent.events_to_messages(made[2:4])
    assert [c.id for c in joined[0].tool_calls] == ["call_0", "call_1"]


def test_a_summary_crosses_as_the_sdk_serialises_it() -> None:
    from openhands.sdk.event.condenser import CondensationSummaryEvent

    made = [*events.to_events([{"role": "user", "content": "hi"}]),
            CondensationSummaryEvent(summary="USER_CONTEXT: hi")]
    assert events.to_messages(made, {}) == [{"role": "user", "content": "hi"},
                                            {"role": "user", "content": "USER_CONTEXT: hi"}]


@pytest.mark.parametrize(("message", "named"), [
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
     "'image_url' content part"),
    ({"role": "developer", "content": "be brief"}, "'developer' message"),
])
def test_what_openhands_cannot_carry_is_refused_by_name(message: Message, named: str) -> None:
    strategy = OpenHandsNoOp()
    strategy.reset(context())
    with pytest.raises(StrategyError, match=named):
        strategy.apply([message, {"role": "user", "content": "q?"}], 4096)


# -- the conformance kit -----------------------------------------------------------------
@pytest.mark.parametrize("cls", [OpenHandsNoOp, OpenHandsLLMSummarizing,
                                 OpenHandsLLMSummarizingExact])
def test_policy_passes_the_conformance_kit(cls: type) -> None:
    check_strategy(cls, max_examples=40)


def test_registered_under_names_that_say_framework_and_policy() -> None:
    assert REGISTRY.resolve("openhands_llm_summarizing") is OpenHandsLLMSummarizing
    assert REGISTRY.resolve("openhands_llm_summarizing_exact") is OpenHandsLLMSummarizingExact
    assert REGISTRY.resolve("openhands_no_op") is OpenHandsNoOp


def test_options_are_the_condensers_parameters_at_its_defaults() -> None:
    from openhands.sdk.context.condenser import LLMSummarizingCondenser

    fields = LLMSummarizingCondenser.model_fields
    for option in OPTIONS[:-1]:
        parameter = option.key.removeprefix("openhands_")
        assert option.default == fields[parameter].default, option.key


# -- counting ------------------------------------------------------------------------------
KNOWN: list[Message] = [{"role": "system", "content": "You are helpful."},
                        {"role": "user", "content": "hello" + " hello" * 99}]


def test_shipped_estimate_is_litellms_count_not_the_runs() -> None:
    """"hello" x 100 is 100 cl100k tokens and "You are helpful." 4; litellm adds 3 a
    message, 1 for its role, 3 for the reply: OpenHands counts 8 + 104 + 3 = 115, the
    approximate counter (4 a message, chars / 4, 3 a prompt) 8 + 154 + 3 = 165."""
    strategy = OpenHandsNoOp()
    strategy.reset(ctx := context())
    assert strategy.apply(KNOWN, 4096) == KNOWN
    assert APPROX.count_messages(KNOWN) == 165
    assert ctx.estimated_tokens == 115
    assert ctx.info["framework"] == {"framework": "openhands", "policy": "NoOpCondenser",
                                     "counter": SHIPPED_COUNTER}


def joined(prompt: list[Message]) -> list[Message]:
    """``prompt`` as OpenHands counts it: its ``events_to_messages`` joins consecutive
    user turns (the summary and a user turn beside it), its serialiser with a newline."""
    out: list[Message] = []
    for message in prompt:
        if out and message["role"] == out[-1]["role"] == "user":
            out[-1] = {"role": "user", "content": f"{text_of(out[-1])}\n{text_of(message)}"}
        else:
            out.append(message)
    return out


def test_shipped_estimate_counts_the_tools_as_openhands_declares_them() -> None:
    """An agent's tools are on its SystemPromptEvent, as ClientTools: OpenHands counts
    each with the ``summary`` and ``security_risk`` fields it adds to the schema."""
    from openhands.sdk.tool.client_tool import ClientTool, ClientToolSpec

    strategy = OpenHandsNoOp()
    strategy.reset(ctx := StrategyContext(tokens=APPROX.with_tools(TOOLS), tools=TOOLS))
    assert strategy.apply(KNOWN, 4096) == KNOWN
    schemas = [ClientTool.from_spec(ClientToolSpec(
        name=t["function"]["name"], description=t["function"]["description"],
        parameters=t["function"]["parameters"])).to_openai_tool(True) for t in TOOLS]
    assert all({"summary", "security_risk"} <= set(t["function"]["parameters"]["properties"])
               for t in schemas)
    import litellm

    assert ctx.estimated_tokens == litellm.token_counter(
        model="openai/budgetbench", messages=KNOWN, tools=schemas) > 115 + 300


def test_a_tool_openhands_cannot_declare_is_named() -> None:
    bad = [{"type": "function", "function": {"name": "odd", "description": "",
                                             "parameters": {"type": "string"}}}]
    strategy = OpenHandsNoOp()
    strategy.reset(StrategyContext(tokens=APPROX, tools=bad))
    with pytest.raises(StrategyError, match="openhands cannot declare the tool 'odd'"):
        strategy.apply(KNOWN, 4096)


def test_exact_variant_counts_with_the_runs_counter() -> None:
    strategy = OpenHandsLLMSummarizingExact()
    strategy.reset(ctx := context(EchoAuxModel(APPROX, 2048)))
    prompt = strategy.apply(long_chat(), 2048)
    assert len(joined(prompt)) == len(prompt) - 1  # one summary, a user turn after it
    assert ctx.estimated_tokens == APPROX.count_messages(joined(prompt))
    assert APPROX.count_messages(prompt) <= 2048
    assert ctx.info["framework"]["counter"] == "exact"


def test_as_shipped_its_counter_lets_an_overflow_through() -> None:
    """cl100k counts these words at about a token a word, chars/4 at 1.25: the shipped
    condenser believes it fits, the run's count says it does not."""
    strategy = OpenHandsLLMSummarizing()
    strategy.reset(ctx := context(EchoAuxModel(APPROX, 2048)))
    prompt = strategy.apply(long_chat(), 2048)
    assert ctx.estimated_tokens is not None and ctx.estimated_tokens <= 2048
    assert APPROX.count_messages(prompt) > 2048


# -- the summariser ------------------------------------------------------------------------
def test_summaries_are_auxiliary_calls_with_openhands_prompt() -> None:
    aux = ScriptedAux(APPROX, limit=2048, reply="USER_CONTEXT: likes items 0 to 9")
    strategy = OpenHandsLLMSummarizingExact()
    strategy.reset(ctx := context(aux))
    prompt = strategy.apply(long_chat(), 2048)
    assert aux.calls and set(aux.purposes()) == {SUMMARY_PURPOSE}
    assert all(text_of(call.prompt[0]).startswith(TEMPLATE_START) for call in aux.calls)
    assert all("<EVENT>" in text_of(call.prompt[1]) for call in aux.calls)
    summaries = [m for m in prompt if text_of(m) == "USER_CONTEXT: likes items 0 to 9"]
    assert summaries == [{"role": "user", "content": "USER_CONTEXT: likes items 0 to 9"}]
    assert prompt[:2] == long_chat()[:2] and prompt[-1] == long_chat()[-1]  # keep_first 2
    assert ctx.info["framework"]["condensations"] == len(aux.calls)


def test_a_summary_call_over_the_aux_budget_raises_budget_exceeded() -> None:
    """The condenser takes any exception of its LLM for a failed call and retries: an aux
    call over budget must get past it, as for the project's own summarisers."""
    strategy = OpenHandsLLMSummarizing()
    strategy.reset(context(EchoAuxModel(APPROX, budget=600)))
    with pytest.raises(BudgetExceeded):
        strategy.apply(long_chat(), 2048)


def test_without_an_auxiliary_model_it_says_so() -> None:
    strategy = OpenHandsLLMSummarizing()
    strategy.reset(context(None))
    with pytest.raises(StrategyError, match="needs the runner's auxiliary model"):
        strategy.apply(long_chat(), 2048)


def test_below_its_summary_prompt_it_sends_the_view_as_it_stands() -> None:
    """At 1,024 no summary call of OpenHands' fits: no call is made, the condenser gives
    up (NoCondensationAvailableException) and the whole history goes, as OpenHands falls
    back; the row says why."""
    aux = ScriptedAux(APPROX, limit=1024)
    strategy = OpenHandsLLMSummarizingExact()
    strategy.reset(ctx := context(aux))
    assert strategy.apply(long_chat(), 1024) == long_chat()
    assert aux.calls == []
    assert "over the budget 1024" in ctx.info["framework"]["gave_up"]


def test_options_reach_the_condenser_and_its_refusal_is_a_strategy_error() -> None:
    aux = ScriptedAux(APPROX, reply="S")
    strategy = OpenHandsLLMSummarizingExact()
    strategy.reset(context(aux, openhands_keep_first=5))
    prompt = strategy.apply(long_chat(), 2048)
    assert prompt[:5] == long_chat()[:5] and prompt[5] == {"role": "user", "content": "S"}
    strategy.reset(context(aux, openhands_keep_first=200))
    with pytest.raises(StrategyError, match="keep_first must be less than max_size // 2"):
        strategy.apply(long_chat(), 2048)


# -- agent episodes ------------------------------------------------------------------------
def episode(steps: int = 12) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": "You use tools."},
                               {"role": "user", "content": "find the files"}]
    for step in range(steps):
        calls = [{"id": f"c{step}_{k}", "type": "function",
                  "function": {"name": "search_files", "arguments": json.dumps({"query": k})}}
                 for k in range(2)]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": call["id"],
                      "content": f"result {call['id']} " + "data " * 80} for call in calls]
    return messages


def test_an_agent_episode_keeps_its_tool_pairs_and_its_condensations() -> None:
    tokens = tool_counter()
    aux = ScriptedAux(APPROX, reply="COMPLETED: searched")
    strategy = OpenHandsLLMSummarizingExact()
    strategy.reset(context(aux, tokens))
    full = episode()
    for end in range(5, len(full) + 1, 3):  # after each step's results
        prompt = strategy.apply(full[:end], 1500)
        check_tool_pairs(prompt, "openhands")
        assert prompt[-3:] == last_unit(full[:end]) and prompt[:2] == full[:2]
        assert tokens.count_messages(prompt) <= 1500
    calls = len(aux.calls)
    assert calls > 0
    strategy.reset(context(again := ScriptedAux(APPROX, reply="COMPLETED: searched"), tokens))
    assert strategy.apply(full, 1500) == prompt and len(again.calls) == calls


# -- in a sweep ----------------------------------------------------------------------------
def test_a_framework_error_is_its_cells_strategy_error_and_nothing_else_is_lost(
        pytester: pytest.Pytester, fake: FakeOpenAI, tmp_path: Path) -> None:
    result = pytester.runpytest(*sweep_args(
        fake, tmp_path, "--budgetbench-strategies=truncation,openhands_llm_summarizing",
        "--budgetbench-strategy-options=openhands_keep_first=200",
        "--budgets=512", "--budgetbench-items=2"))
    rows = rows_of(tmp_path)
    by_strategy = {(r["strategy"], r["status"]) for r in rows}
    assert by_strategy == {("truncation", "ok"), ("openhands_llm_summarizing", "error")}, rows
    errors = [r["error"] for r in rows if r["status"] == "error"]
    assert all("keep_first must be less than max_size // 2" in e for e in errors)
    result.assert_outcomes(passed=2, errors=2)


def test_a_sweep_records_the_estimate_and_the_summary_calls_on_each_row(
        pytester: pytest.Pytester, fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.responder = lambda messages: ("USER_CONTEXT: a summary" if TEMPLATE_START in
                                       text_of(messages[0]) else "an answer")
    result = pytester.runpytest(*sweep_args(
        fake, tmp_path, "--budgetbench-strategies=openhands_no_op,openhands_llm_summarizing",
        "--budgets=2048", "--budgetbench-items=2"))
    rows = {row["strategy"]: row for row in rows_of(tmp_path) if row["item_id"].endswith("0")}
    assert set(rows) == {"openhands_no_op", "openhands_llm_summarizing"}, result.stdout.str()
    for name, row in rows.items():
        framework = row["strategy_info"]["framework"]
        assert framework["counter"] == SHIPPED_COUNTER and row["estimated_tokens"] > 0, name
        assert row["estimated_tokens"] != row["counted_tokens"]  # cl100k, not chars/4
    summarised = rows["openhands_llm_summarizing"]
    assert [c["purpose"] for c in summarised["aux_calls"]] == [SUMMARY_PURPOSE] * len(
        summarised["aux_calls"]) and summarised["aux_calls"]
    assert rows["openhands_no_op"]["aux_calls"] == []


def test_importing_the_sdk_stays_offline_and_quiet() -> None:
    code = ("from pytest_budgetbench.strategies.frameworks import _openhands_events as e; "
            "e.import_sdk(); import os, litellm; "
            "print(os.environ['LITELLM_LOCAL_MODEL_COST_MAP'], "
            "litellm.disable_hf_tokenizer_download)")
    env = {k: v for k, v in os.environ.items() if k not in (
        "OPENHANDS_SUPPRESS_BANNER", "LITELLM_LOCAL_MODEL_COST_MAP", "LOG_AUTO_CONFIG")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300, check=True)
    assert done.stdout.split() == ["True", "True"] and done.stderr == ""

