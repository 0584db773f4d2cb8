"""LangChain's policies as shipped: the lossless bridge, the conformance kit, the budget as
LangChain's parameter, its estimate beside the exact count, and its model calls through the
runner's auxiliary model."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_budgetbench.errors import BudgetExceeded, EndpointError, StrategyError
from pytest_budgetbench.messages import Message, check_tool_pairs
from pytest_budgetbench.options import resolve_values
from pytest_budgetbench.strategies import REGISTRY
from pytest_budgetbench.strategies.base import Regime, Strategy, StrategyContext
from pytest_budgetbench.testing import (
    TOOLS,
    EchoAuxModel,
    agent_trajectories,
    check_agent_episodes,
    check_strategy,
    default_context,
    tool_counter,
)
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.base import TokenCounter
from tests.sweeps import rows_of, sweep_args

pytest.importorskip("langchain.agents.middleware")

from langchain_core.messages import convert_to_messages, convert_to_openai_messages

from pytest_budgetbench.strategies.frameworks import langchain as lc
from pytest_budgetbench.strategies.frameworks._langchain_messages import Bridge

POLICIES = [lc.TrimMessages, lc.TrimMessagesExact, lc.Summarization, lc.SummarizationExact,
            lc.ClearToolUses, lc.ClearToolUsesExact]
SUMMARY_OPENING = "Here is a summary of the conversation to date:"


# -- histories -------------------------------------------------------------------------------
def tool_step(index: int, result_words: int = 40) -> list[Message]:
    call_id = f"call_{index}"
    return [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {
                "name": "search_files", "arguments": json.dumps({"query": f"file {index}"})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": f"result {index} " * result_words},
    ]


def episode(steps: int, result_words: int = 40) -> list[Message]:
    """A system message, a user turn, then ``steps`` tool steps: an agent mid-episode."""
    messages: list[Message] = [{"role": "system", "content": "You are a coding agent."},
                               {"role": "user", "content": "Find the failing test."}]
    for index in range(steps):
        messages += tool_step(index, result_words)
    return messages


def chat(turns: int, words: int = 30) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": "Answer briefly."}]
    for index in range(turns):
        messages.append({"role": "user", "content": f"On day {index} I walked the dog. " * 3})
        messages.append({"role": "assistant", "content": f"Noted day {index}.\n" + "ok\n" * words})
    messages.append({"role": "user", "content": "Where did I walk the dog?"})
    return messages


def context(tokens: TokenCounter, aux: Any = None, tools: Sequence[Any] = (),
            **options: Any) -> StrategyContext:
    return StrategyContext(tokens=tokens.with_tools(list(tools)), aux=aux,
                           tools=list(tools), options=options)


def run(cls: type[Strategy], messages: list[Message], budget: int,
        ctx: StrategyContext) -> tuple[list[Message], StrategyContext]:
    strategy = cls()
    strategy.reset(ctx)
    return strategy.apply(copy.deepcopy(messages), budget), ctx


class LimitedAux:
    """An auxiliary model that records each call it is asked for and, as the runner's,
    raises BudgetExceeded for a prompt over ``limit``; ``error`` fails every call."""

    def __init__(self, tokens: TokenCounter, limit: int = 10**9, reply: str = "the dog park",
                 error: Exception | None = None) -> None:
        self.tokens, self.limit, self.reply, self.error = tokens, limit, reply, error
        self.asked: list[tuple[str, int, list[Message]]] = []

    def complete(self, messages: Sequence[Message], *, max_tokens: int, purpose: str,
                 schema: Any = None) -> str:
        counted = self.tokens.count_messages(messages)
        self.asked.append((purpose, counted, list(messages)))
        if self.error is not None:
            raise self.error
        if counted > self.limit:
            raise BudgetExceeded(f"aux prompt of {counted} over {self.limit}")
        return self.reply


# -- the bridge --------------------------------------------------------------------------------
@st.composite
def varied_trajectories(draw: st.DrawFn) -> list[Message]:
    """Agent trajectories with what LangChain's converter does not keep as it was: content
    None or "" beside calls, text part lists, arguments with other spacing and escapes,
    names, vendor keys."""
    messages = draw(agent_trajectories())
    for message in messages:
        if message.get("tool_calls") and draw(st.booleans()):
            message["content"] = draw(st.sampled_from([None, "", "thinking"]))
        for call in message.get("tool_calls") or []:
            args = json.loads(call["function"]["arguments"])
            if draw(st.booleans()):
                call["function"]["arguments"] = json.dumps(
                    {**args, "n": [1, 2]}, ensure_ascii=True, separators=(",", ":"))
        if message["role"] in ("user", "assistant") and isinstance(message.get("content"), str) \
                and draw(st.integers(0, 4)) == 0:
            message["content"] = [{"type": "text", "text": message["content"]},
                                  {"type": "text", "text": "über 東京"}]
        if message["role"] == "user" and draw(st.integers(0, 5)) == 0:
            message["name"] = "bob"
        if message["role"] == "assistant" and draw(st.integers(0, 5)) == 0:
            message["reasoning_content"] = "a vendor's extra key"
    return messages


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=varied_trajectories())
def test_the_bridge_round_trip_is_the_identity(messages: list[Message]) -> None:
    pristine = copy.deepcopy(messages)
    bridge = Bridge(messages)
    assert bridge.to_openai(bridge.messages) == pristine
    assert messages == pristine


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=agent_trajectories())
def test_langchains_own_round_trip_keeps_roles_calls_results_and_order(
        messages: list[Message]) -> None:
    """What langchain_core's converters keep on their own: everything but an absent content
    beside calls (None -> "") and the text of the arguments (equal as JSON)."""
    back = convert_to_openai_messages(convert_to_messages(copy.deepcopy(messages)))
    assert [m["role"] for m in back] == [m["role"] for m in messages]
    for sent, got in zip(messages, back, strict=True):
        assert got.get("content") == (sent.get("content") or ""
                                      if sent.get("tool_calls") else sent["content"])
        assert got.get("tool_call_id") == sent.get("tool_call_id")
        calls = [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for c in sent.get("tool_calls") or []]
        assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in got.get("tool_calls") or []] == calls


def test_langchains_converter_loses_what_the_bridge_restores() -> None:
    """The losses the bridge exists for; when a LangChain release stops losing them, this
    fails and the bridge's repairs can go."""
    messages: list[Message] = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "reasoning_content": "r", "tool_calls": [
            {"id": "c", "type": "function",
             "function": {"name": "f", "arguments": '{"q":"\\u00e9"}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "r"},
    ]
    back = convert_to_openai_messages(convert_to_messages(copy.deepcopy(messages)))
    assert back[0]["content"] == "a\nb"
    assert back[1]["content"] == "" and "reasoning_content" not in back[1]
    assert back[1]["tool_calls"][0]["function"]["arguments"] == '{"q": "é"}'
    bridge = Bridge(messages)
    assert bridge.to_openai(bridge.messages) == messages


def test_what_the_framework_changed_comes_back_through_langchains_converter() -> None:
    messages = episode(1)
    messages[2]["tool_calls"].append({"id": "call_9", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"query":  "Lisbon"}'}})
    messages.append({"role": "tool", "tool_call_id": "call_9", "content": "sunny"})
    bridge = Bridge(messages)
    call, result = bridge.messages[2], bridge.messages[3]
    calls = [dict(c, args={}) if c["id"] == "call_0" else c for c in call.tool_calls]  # type: ignore[attr-defined]
    changed = [call.model_copy(update={"tool_calls": calls}),
               result.model_copy(update={"content": "[cleared]"})]
    assert bridge.to_openai(changed) == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "id": "call_0", "function": {"name": "search_files",
                                                              "arguments": "{}"}},
            messages[2]["tool_calls"][1]]},  # the untouched call keeps its own text
        {"role": "tool", "tool_call_id": "call_0", "content": "[cleared]"}]


@pytest.mark.parametrize(("message", "named"), [
    ({"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA"}}]},
     "'input_audio' content part (message 1"),
    ({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]},
     "tool call 'c1' of message 1: its arguments are not a JSON object"),
    ({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]},
     "tool call 'c2' of message 1"),
])
def test_what_langchain_cannot_carry_is_refused_by_name(message: Message, named: str) -> None:
    messages = [{"role": "system", "content": "s"}, message, {"role": "user", "content": "q"}]
    with pytest.raises(StrategyError, match=named.replace("(", r"\(")):
        run(lc.TrimMessages, messages, 100, context(ApproxCounter()))


# -- the kit -------------------------------------------------------------------------------------
def with_options(**options: Any) -> Any:
    def make(tokens: TokenCounter, budget: int) -> StrategyContext:
        made = default_context(tokens, budget)
        made.options.update(options)
        return made
    return make


def roomy_aux(**options: Any) -> Any:
    """The kit's context with a summariser that takes any prompt: LangChain's summary
    prompt alone is ~600 tokens, over most of the kit's budgets (that violation is
    test_a_summary_retry_still_over_budget_is_the_cells_budget_exceeded)."""
    def make(tokens: TokenCounter, budget: int) -> StrategyContext:
        made = with_options(**options)(tokens, budget)
        made.aux = EchoAuxModel(tokens, 10**9)
        return made
    return make


@pytest.mark.parametrize("cls", [lc.TrimMessages, lc.TrimMessagesExact])
def test_trim_messages_conforms(cls: type[lc.TrimMessages]) -> None:
    """Chat histories with LangChain's recommended defaults; agent episodes with
    start_on=human,ai (with start_on=human it drops the turn in progress, see below)."""
    check_strategy(type(cls.__name__, (cls,), {"handles_tools": False}), max_examples=40)
    check_agent_episodes(cls, context_factory=with_options(langchain_start_on=("human", "ai")),
                         max_examples=40)


@pytest.mark.parametrize("cls", [lc.Summarization, lc.SummarizationExact])
def test_summarization_conforms(cls: type[lc.Summarization]) -> None:
    """At LangChain's keep (20 messages: the kit's histories are rarely longer, so few
    summaries) and at keep=messages:3, which summarises in most examples."""
    check_strategy(cls, context_factory=roomy_aux(), max_examples=30)
    check_strategy(cls, context_factory=roomy_aux(langchain_summarization_keep=("messages", 3)),
                   max_examples=30)


@pytest.mark.parametrize("cls", [lc.ClearToolUses, lc.ClearToolUsesExact])
def test_clear_tool_uses_conforms(cls: type[lc.ClearToolUses]) -> None:
    check_strategy(cls, max_examples=40)


def test_only_trim_messages_exact_means_to_fit_and_all_handle_tools() -> None:
    assert [cls.fits_budget for cls in POLICIES] == [False, True, False, False, False, False]
    assert all(cls.handles_tools for cls in POLICIES)
    assert Regime.AUXILIARY_MODEL in lc.Summarization.regimes


def test_registered_under_names_that_say_framework_and_policy_and_need_the_extra() -> None:
    for cls in POLICIES:
        assert REGISTRY.resolve(cls.name) is cls
        assert cls.name.startswith("langchain_") and cls.requires[0].extra == "langchain"
    assert {r.module for r in lc.Summarization.requires} == {"langchain_core", "langchain"}


# -- trim_messages -------------------------------------------------------------------------------
def test_the_default_start_on_drops_the_turn_in_progress_and_says_so() -> None:
    """An agent's turn (its user message and every step since) over max_tokens: LangChain
    keeps the system message alone; human,ai keeps the newest steps, pairs whole."""
    messages = episode(6)
    tokens = ApproxCounter()
    budget = tokens.count_messages([messages[0], *messages[-4:]]) + 2
    kept, ctx = run(lc.TrimMessagesExact, messages, budget, context(tokens))
    assert kept == messages[:1]
    assert ctx.info["framework"]["answerable"] is False
    kept, ctx = run(lc.TrimMessagesExact, messages, budget,
                    context(tokens, langchain_start_on=("human", "ai")))
    assert kept == [messages[0], *messages[-4:]] and ctx.info["framework"]["answerable"]


@pytest.mark.parametrize("cls", POLICIES)
def test_an_agent_trajectory_keeps_every_pair_at_every_budget(cls: type[Strategy]) -> None:
    messages = episode(8)
    tokens = tool_counter(TOOLS)
    for budget in range(100, tokens.count_messages(messages) + 200, 97):
        ctx = context(ApproxCounter(), aux=EchoAuxModel(tokens, 10**9), tools=TOOLS)
        kept, _ = run(cls, messages, budget, ctx)
        check_tool_pairs(kept, cls.name)
        assert kept[0] == messages[0]


def test_the_estimate_is_langchains_count_and_misses_the_tools() -> None:
    """A prompt of known count: the approximate counter with TOOLS counts every 4
    characters a token, 4 a message, plus the schemas; LangChain counts (characters +
    role) / 4 rounded up per message, plus 3 a message, and no tools."""
    messages = chat(2)
    tokens = ApproxCounter()
    known = tokens.count_messages(messages, TOOLS)
    langchain = sum(math.ceil((len(m["content"]) + len(m["role"])) / 4) + 3 for m in messages)
    kept, ctx = run(lc.TrimMessages, messages, 10_000, context(tokens, tools=TOOLS))
    assert kept == messages
    assert ctx.estimated_tokens == langchain
    assert known - ctx.estimated_tokens >= tokens.count_messages([], TOOLS) - 10
    assert ctx.info["framework"]["counter"] == "count_tokens_approximately"
    kept, ctx = run(lc.TrimMessagesExact, messages, 10_000, context(tokens, tools=TOOLS))
    assert ctx.estimated_tokens == known and ctx.info["framework"]["counter"] == "exact"


def test_as_shipped_it_overflows_by_the_tools_and_exact_fits() -> None:
    messages = chat(12)
    tokens = ApproxCounter()
    budget = 600
    kept, ctx = run(lc.TrimMessages, messages, budget, context(tokens, tools=TOOLS))
    assert ctx.estimated_tokens is not None and ctx.estimated_tokens <= budget
    assert tokens.count_messages(kept, TOOLS) > budget
    kept, ctx = run(lc.TrimMessagesExact, messages, budget, context(tokens, tools=TOOLS))
    counted = tokens.count_messages(kept, TOOLS)
    assert counted <= budget and ctx.estimated_tokens == counted
    # The exact counter's parts sum to the prompt: nothing more would have fitted.
    head, rest = kept[:1], kept[1:]
    dropped = messages[len(messages) - len(rest) - 2:len(messages) - len(rest)]
    assert tokens.count_messages([*head, *dropped, *rest], TOOLS) > budget


def test_options_reach_trim_messages() -> None:
    messages = chat(6)
    tokens = ApproxCounter()
    kept, _ = run(lc.TrimMessages, messages, 150, context(tokens))
    assert kept[0] == messages[0]
    kept, _ = run(lc.TrimMessages, messages, 150, context(tokens, langchain_include_system=False))
    assert messages[0] not in kept
    kept, _ = run(lc.TrimMessages, messages, 150,
                  context(tokens, langchain_start_on=None, langchain_allow_partial=True))
    assert kept[1]["content"] not in [m["content"] for m in messages]  # a partial message


def test_options_parse_langchain_values_and_refuse_others() -> None:
    values = resolve_values(lc.TrimMessages, {"langchain_start_on": "human,tool",
                                              "langchain_end_on": "none",
                                              "langchain_allow_partial": "yes"}, "--opt")
    assert values == {"langchain_start_on": ("human", "tool"), "langchain_end_on": None,
                      "langchain_include_system": True, "langchain_allow_partial": True}
    values = resolve_values(lc.Summarization, {"langchain_summarization_keep": "tokens:300",
                                               "langchain_trim_tokens_to_summarize": "none"}, "")
    assert values["langchain_summarization_keep"] == ("tokens", 300)
    assert values["langchain_trim_tokens_to_summarize"] is None
    assert values["langchain_summary_max_tokens"] == "auto"
    for cls, key, raw in [(lc.TrimMessages, "langchain_start_on", "user"),
                          (lc.Summarization, "langchain_summarization_keep", "fraction:2"),
                          (lc.ClearToolUses, "langchain_clear_tool_uses_keep", "-1")]:
        with pytest.raises(Exception, match=f"{key} .*must be"):
            resolve_values(cls, {key: raw}, "--budgetbench-strategy-options")


# -- SummarizationMiddleware ---------------------------------------------------------------
def test_a_summary_is_the_aux_models_reply_to_langchains_prompt_and_pairs_survive() -> None:
    messages = episode(16, result_words=10)
    tokens = ApproxCounter()
    aux = LimitedAux(tokens)
    kept, ctx = run(lc.Summarization, messages, 500, context(tokens, aux=aux))
    assert [purpose for purpose, _, _ in aux.asked] == ["summary"]
    prompt = aux.asked[0][2]
    assert "Context Extraction Assistant" in prompt[0]["content"]  # LangChain's own prompt
    assert kept[0] == messages[0]
    assert kept[1] == {"role": "user", "content": f"{SUMMARY_OPENING}\n\nthe dog park"}
    assert kept[2:] == messages[-20:]  # LangChain's keep: the newest 20 messages
    check_tool_pairs(kept, "summarization")
    assert ctx.info["framework"]["summarized"] and ctx.estimated_tokens is not None


def test_no_summary_below_the_trigger_and_the_exact_trigger_sees_the_tools() -> None:
    messages = episode(16, result_words=10)
    tokens = ApproxCounter()
    shipped = sum(math.ceil((len(m.get("content") or "") + len(m["role"])
                             + len(repr(m.get("tool_calls", "")))) / 4) for m in messages)
    budget = tokens.count_messages(messages, TOOLS) - 5
    aux = LimitedAux(tokens)
    kept, _ = run(lc.Summarization, messages, budget, context(tokens, aux=aux, tools=TOOLS))
    assert kept == messages and aux.asked == [] and shipped < budget
    kept, _ = run(lc.SummarizationExact, messages, budget, context(tokens, aux=aux, tools=TOOLS))
    assert len(aux.asked) == 1 and kept[1]["content"].startswith(SUMMARY_OPENING)


def test_a_summary_prompt_over_budget_is_retried_shorter_as_langchain_does() -> None:
    messages = episode(16, result_words=10)
    tokens = ApproxCounter()
    roomy = LimitedAux(tokens)
    run(lc.Summarization, messages, 500, context(tokens, aux=roomy))
    first = roomy.asked[0][1]
    aux = LimitedAux(tokens, limit=first - 1)
    kept, ctx = run(lc.Summarization, messages, 500, context(tokens, aux=aux))
    assert aux.asked[0][1] == first
    assert len(aux.asked) == 2 and aux.asked[1][1] < first
    assert "[... middle of conversation omitted ...]" in aux.asked[1][2][0]["content"]
    assert ctx.info["framework"]["summary_overflows"] == 1
    assert kept[1]["content"].startswith(SUMMARY_OPENING)


def test_a_summary_retry_still_over_budget_is_the_cells_budget_exceeded() -> None:
    messages = episode(16, result_words=10)
    tokens = ApproxCounter()
    aux = EchoAuxModel(tokens, 300, strategy="langchain_summarization")
    with pytest.raises(BudgetExceeded, match=r"auxiliary call 'summary'.*budget 300"):
        run(lc.Summarization, messages, 300, context(tokens, aux=aux))
    assert aux.calls == 0


def test_a_runner_error_in_a_summary_reaches_the_runner_unwrapped_and_is_not_retried() -> None:
    error = EndpointError("the endpoint is down")
    aux = LimitedAux(ApproxCounter(), error=error)
    with pytest.raises(EndpointError) as raised:
        run(lc.Summarization, episode(16, 10), 500, context(ApproxCounter(), aux=aux))
    assert raised.value is error and len(aux.asked) == 1


def test_keep_as_a_fraction_is_of_the_budget() -> None:
    messages = episode(16, result_words=10)
    tokens = ApproxCounter()
    kept, _ = run(lc.Summarization, messages, 500, context(
        tokens, aux=LimitedAux(tokens), langchain_summarization_keep=("fraction", 0.2)))
    assert 2 < len(kept) < 12 and kept[-1] == messages[-1]
    check_tool_pairs(kept, "summarization")


# -- ContextEditingMiddleware / ClearToolUsesEdit -----------------------------------------
def test_older_results_are_cleared_the_newest_three_kept_pairs_whole() -> None:
    messages = episode(6)
    tokens = ApproxCounter()
    kept, ctx = run(lc.ClearToolUses, messages, 300, context(tokens))
    results = [m["content"] for m in kept if m["role"] == "tool"]
    assert results[:3] == ["[cleared]"] * 3
    assert results[3:] == [m["content"] for m in messages if m["role"] == "tool"][3:]
    assert [m["role"] for m in kept] == [m["role"] for m in messages]
    assert kept[2] == messages[2]  # the calls untouched (clear_tool_inputs is false)
    assert ctx.info["framework"]["cleared"] == 3


def test_clear_tool_uses_options_and_its_trigger_counts() -> None:
    messages = episode(6)
    tokens = ApproxCounter()
    kept, _ = run(lc.ClearToolUses, messages, 300, context(
        tokens, langchain_clear_tool_uses_keep=1, langchain_clear_tool_inputs=True,
        langchain_placeholder="[gone]"))
    assert [m["content"] for m in kept if m["role"] == "tool"][:5] == ["[gone]"] * 5
    assert json.loads(kept[2]["tool_calls"][0]["function"]["arguments"]) == {}
    # Between LangChain's count (no tools) and the exact one: only _exact clears.
    budget = tokens.count_messages(messages, TOOLS) - 5
    kept, ctx = run(lc.ClearToolUses, messages, budget, context(tokens, tools=TOOLS))
    assert kept == messages and ctx.estimated_tokens is not None and ctx.estimated_tokens < budget
    kept, ctx = run(lc.ClearToolUsesExact, messages, budget, context(tokens, tools=TOOLS))
    assert ctx.info["framework"]["cleared"] == 3
    assert ctx.estimated_tokens == tokens.count_messages(kept, TOOLS)


# -- in a sweep ------------------------------------------------------------------------------
def test_a_framework_raising_is_that_cells_strategy_error_and_nothing_else_is_lost(
        pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import langchain_core.messages

    real = langchain_core.messages.trim_messages

    def trim_or_fail(messages: Any, **kwargs: Any) -> Any:
        if kwargs["max_tokens"] == 1024:
            raise RuntimeError("LangChain broke")
        return real(messages, **kwargs)

    monkeypatch.setattr(langchain_core.messages, "trim_messages", trim_or_fail)
    result = pytester.runpytest(
        "--budgetbench-model=none", f"--budgetbench-out={tmp_path / 'out'}",
        "-p", "no:cacheprovider", "--budgetbench-tokenizer=approx", "--budgetbench-items=2",
        "--budgets=1024,2048", "--budgetbench-report=off",
        "--budgetbench-strategies=langchain_trim_messages,truncation")
    rows = rows_of(tmp_path)
    failed = {(r["strategy"], r["budget"]): r for r in rows if r["status"] == "error"}
    assert set(failed) == {("langchain_trim_messages", 1024)}
    assert "RuntimeError: LangChain broke" in failed["langchain_trim_messages", 1024]["error"]
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows
                                  if (r["strategy"], r["budget"]) not in failed)
    shipped = [r for r in rows if r["strategy"] == "langchain_trim_messages"
               and r["status"] == "ok"]
    assert all(r["estimated_tokens"] and r["estimated_tokens"] != r["counted_tokens"]
               for r in shipped)
    assert result.ret != 0


def test_a_sweeps_summaries_are_aux_calls_on_the_row_within_the_budget(
        pytester: pytest.Pytester, tmp_path: Path, fake: Any) -> None:
    def respond(messages: list[dict[str, Any]]) -> str:
        if "Context Extraction Assistant" in str(messages[0].get("content")):
            return "The user walks the dog in the park."
        return "the park"

    fake.responder = respond
    pytester.runpytest(*sweep_args(
        fake, tmp_path, "--budgetbench-strategies=langchain_summarization",
        "--budgets=2048", "--budgetbench-items=2"))
    rows = rows_of(tmp_path)
    assert len(rows) == 2
    for row in rows:
        assert row["status"] == "ok", row["error"]
        assert [call["purpose"] for call in row["aux_calls"]] == ["summary"]
        assert row["aux_calls"][0]["input_tokens"] <= 2048
        framework = row["strategy_info"]["framework"]
        # LangChain read 4000 tokens of history, over the budget: its retry, cut, fitted.
        assert framework["summarized"] is True and framework["summary_overflows"] == 1
        assert row["estimated_tokens"] and row["counted_tokens"] <= 2048


def test_with_tools_over_the_budget_the_exact_trim_keeps_no_message() -> None:
    """BFCL's case: the schemas alone exceed max_tokens by the run's count, so LangChain
    keeps nothing; as shipped its counter does not see them and keeps the user turn."""
    messages: list[Message] = [{"role": "user", "content": "Book me a flight."}]
    tokens = ApproxCounter()
    budget = tokens.count_messages([], TOOLS) - 1
    kept, ctx = run(lc.TrimMessagesExact, messages, budget, context(tokens, tools=TOOLS))
    assert kept == [] and ctx.info["framework"]["answerable"] is False
    kept, ctx = run(lc.TrimMessages, messages, budget, context(tokens, tools=TOOLS))
    assert kept == messages and tokens.count_messages(kept, TOOLS) > budget


def test_no_langsmith_trace_leaves_the_run_even_when_the_environment_asks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from langsmith.utils import tracing_is_enabled

    monkeypatch.setenv("LANGSMITH_TRACING", "true")
    assert tracing_is_enabled()
    seen: list[object] = []

    class TracingAux(LimitedAux):
        def complete(self, messages: Sequence[Message], **kwargs: Any) -> str:
            seen.append(tracing_is_enabled())
            return super().complete(messages, **kwargs)

    tokens = ApproxCounter()
    run(lc.Summarization, episode(16, 10), 500, context(tokens, aux=TracingAux(tokens)))
    assert seen == [False]
