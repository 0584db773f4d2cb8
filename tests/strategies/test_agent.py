"""The agent strategies (pair_truncation, observation_masking, tool_result_clearing,
condenser) on tool-call trajectories, the conformance kit's agent episodes, and every
built-in strategy on a tool history: kept pairs, or a refusal."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.engine.aux_calls import RecordedAuxModel
from pytest_budgetbench.messages import Message, check_tool_pairs, exchanges, text_of
from pytest_budgetbench.model.chat import Completion
from pytest_budgetbench.strategies import (
    REGISTRY,
    Strategy,
    StrategyContext,
    load_strategy,
    tool_refusal,
    tool_strategies,
)
from pytest_budgetbench.strategies.condenser import Condenser
from pytest_budgetbench.strategies.observation_masking import ObservationMasking
from pytest_budgetbench.strategies.pair_truncation import PairTruncation
from pytest_budgetbench.strategies.plain import plain_strategy_class
from pytest_budgetbench.strategies.tool_result_clearing import ToolResultClearing
from pytest_budgetbench.testing import (
    TOOLS,
    HashingEmbedder,
    call_points,
    check_agent_output,
    check_strategy,
    tool_counter,
)
from pytest_budgetbench.tokens.base import TokenCounter
from tests.strategy_helpers import ScriptedAux

AGENT_STRATEGIES = [PairTruncation, ObservationMasking, ToolResultClearing, Condenser]
SYSTEM: Message = {"role": "system", "content": "You are an agent with tools."}
TASK: Message = {"role": "user", "content": "Find the weather in every city I named."}


def call(call_id: str, name: str = "get_weather", city: str = "Lisbon") -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps({"city": city})}}


def step(index: int, parallel: int = 1, size: int = 400) -> list[Message]:
    """An assistant message making ``parallel`` calls, and their results of ``size``
    characters, each naming its step."""
    ids = [f"call_{index}_{k}" for k in range(parallel)]
    results = [{"role": "tool", "tool_call_id": i,
                "content": (f"step {index} result {i}: " + "sunny and warm " * size)[:size]}
               for i in ids]
    return [{"role": "assistant", "content": None,
             "tool_calls": [call(i, city=f"city{index}") for i in ids]}, *results]


def episode(steps: int, parallel: int = 1, size: int = 400) -> list[Message]:
    messages = [SYSTEM, TASK]
    for index in range(steps):
        messages += step(index, parallel, size)
    return messages


def counter() -> TokenCounter:
    return tool_counter(TOOLS)


def run(strategy: Strategy, messages: Sequence[Message], budget: int,
        tokens: TokenCounter | None = None, **context: Any) -> list[Message]:
    context.setdefault("embedder_factory", HashingEmbedder)
    strategy.reset(StrategyContext(tokens=tokens or counter(), tools=TOOLS, **context))
    return strategy.apply(messages, budget)


def placeholders(prompt: Sequence[Message]) -> list[Message]:
    return [m for m in prompt if text_of(m).startswith("[tool result omitted:")]


# -- the conformance kit on the agent strategies -----------------------------------------
@pytest.mark.parametrize("factory", [*AGENT_STRATEGIES, "truncation", "full_context"])
def test_tool_strategies_conform_on_chats_and_agent_episodes(factory: Any) -> None:
    cls = REGISTRY.resolve(factory) if isinstance(factory, str) else factory
    check_strategy(cls, max_examples=25)


class _Claims(Strategy):
    name = "claims"
    handles_tools = True

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        return list(messages)


@pytest.mark.parametrize(("drop", "error"), [
    (slice(3, 4), "broke a tool-call pair"),  # a result without its call
    (slice(2, 3), "broke a tool-call pair"),  # a call without its result... and vice versa
    (slice(-1, None), "did not end with the last unit"),
])
def test_the_kit_names_an_agent_output_that_breaks_a_rule(drop: slice, error: str) -> None:
    messages = [*episode(steps=3), {"role": "assistant", "content": "Sunny."},
                {"role": "user", "content": "And tomorrow?"}]
    output = list(messages)
    del output[drop]
    with pytest.raises((AssertionError, ValueError), match=error):
        check_agent_output(_Claims(), messages, 100_000, output, counter())


def test_the_kit_holds_an_agent_output_to_the_budget() -> None:
    tokens = counter()
    messages = episode(steps=3)
    budget = tokens.count_messages(messages) - 1
    with pytest.raises(AssertionError, match="over budget"):
        check_agent_output(_Claims(), messages, budget, messages, tokens)


# -- pair_truncation ---------------------------------------------------------------------
def test_pair_truncation_keeps_the_task_and_the_newest_whole_steps() -> None:
    tokens = counter()
    messages = episode(steps=6, parallel=2)
    units = exchanges(messages[2:])
    expected = [SYSTEM, TASK, *units[-2][0:], *units[-1]]
    budget = tokens.count_messages(expected)
    assert tokens.count_messages([SYSTEM, TASK, *units[-3], *units[-2], *units[-1]]) > budget
    output = run(PairTruncation(), messages, budget, tokens)
    assert output == expected
    check_tool_pairs(output, "test")


def test_pair_truncation_sends_what_fits_unchanged() -> None:
    messages = episode(steps=3)
    assert run(PairTruncation(), messages, 100_000) == messages


def test_pair_truncation_at_the_minimum_sends_task_and_last_step() -> None:
    tokens = counter()
    messages = episode(steps=5, parallel=3)
    last = exchanges(messages)[-1]
    budget = tokens.count_messages([SYSTEM, TASK, *last])
    assert run(PairTruncation(), messages, budget, tokens) == [SYSTEM, TASK, *last]


def test_pair_truncation_drops_a_task_too_long_for_the_budget_before_the_last_step() -> None:
    tokens = counter()
    long_task = {"role": "user", "content": "Do this: " + "very long " * 400}
    messages = [SYSTEM, long_task, *step(0), *step(1)]
    last = messages[-2:]
    budget = tokens.count_messages([SYSTEM, *last]) + 10
    assert run(PairTruncation(), messages, budget, tokens) == [SYSTEM, *last]


def test_pair_truncation_ends_with_a_later_user_turn() -> None:
    tokens = counter()
    later = {"role": "user", "content": "And now book a flight to the sunniest one."}
    messages = [*episode(steps=4), {"role": "assistant", "content": "Done."}, later]
    budget = tokens.count_messages([SYSTEM, TASK, later]) + 5
    assert run(PairTruncation(), messages, budget, tokens) == [SYSTEM, TASK, later]


# -- observation_masking -----------------------------------------------------------------
def test_observation_masking_masks_all_but_the_newest_steps_results() -> None:
    messages = episode(steps=6)
    output = run(ObservationMasking(), messages, 100_000)
    check_tool_pairs(output, "test")
    assert len(output) == len(messages)  # calls, results and turns all kept
    assert [m.get("tool_calls") for m in output] == [m.get("tool_calls") for m in messages]
    masked = placeholders(output)
    assert [m["tool_call_id"] for m in masked] == ["call_0_0", "call_1_0", "call_2_0"]
    assert text_of(masked[0]) == "[tool result omitted: 400 characters from get_weather]"
    assert output[-6:] == messages[-6:]  # the newest three steps verbatim


def test_observation_masking_keeps_as_many_steps_as_asked() -> None:
    messages = episode(steps=4, parallel=3)
    output = run(ObservationMasking(), messages, 100_000, options={"masking_keep": 1})
    assert len(placeholders(output)) == 9
    assert output[-4:] == messages[-4:]  # every parallel result of the last step


def test_observation_masking_leaves_results_shorter_than_a_placeholder() -> None:
    messages = episode(steps=5, size=20)
    assert run(ObservationMasking(), messages, 100_000) == messages


def test_observation_masking_drops_the_oldest_steps_when_masking_is_not_enough() -> None:
    tokens = counter()
    messages = episode(steps=8)
    masked_all = run(ObservationMasking(), messages, 100_000, tokens)
    budget = tokens.count_messages(masked_all) - 1
    output = run(ObservationMasking(), messages, budget, tokens)
    assert tokens.count_messages(output) <= budget
    assert output[:2] == [SYSTEM, TASK] and output[-6:] == messages[-6:]
    assert output[2]["tool_calls"][0]["id"] != "call_0_0"  # the oldest step went whole
    check_tool_pairs(output, "test")


def test_observation_masking_declares_its_option() -> None:
    assert [o.key for o in ObservationMasking.declared_options] == ["masking_keep"]


# -- tool_result_clearing ----------------------------------------------------------------
def test_clearing_changes_nothing_under_the_trigger() -> None:
    tokens = counter()
    messages = episode(steps=6)
    budget = int(tokens.count_messages(messages) / 0.8) + 1
    assert run(ToolResultClearing(), messages, budget, tokens) == messages


def test_clearing_clears_the_oldest_results_down_to_the_target() -> None:
    tokens = counter()
    messages = episode(steps=20)
    budget = int(tokens.count_messages(messages) / 0.9)  # past the 0.8 trigger
    strategy = ToolResultClearing()
    output = run(strategy, messages, budget, tokens)
    cleared = [m["tool_call_id"] for m in placeholders(output)]
    assert cleared == [f"call_{i}_0" for i in range(len(cleared))]  # oldest first
    assert tokens.count_messages(output) <= 0.5 * budget
    # Just enough: with the newest cleared result back it would be over the target.
    newest = output.index(placeholders(output)[-1])
    assert tokens.count_messages([*output[:newest], messages[newest],
                                  *output[newest + 1:]]) > 0.5 * budget
    assert output[-6:] == messages[-6:]  # the newest 3 steps kept
    assert strategy.context.info["tool_result_clearing"] == {"clearings": 1,
                                                            "cleared": len(cleared)}


def test_cleared_results_stay_cleared_as_the_episode_grows() -> None:
    tokens = counter()
    messages = episode(steps=12)
    budget = int(tokens.count_messages(messages[:2 + 2 * 10]) / 0.9)
    strategy = ToolResultClearing()
    strategy.reset(StrategyContext(tokens=tokens, tools=TOOLS))
    first = strategy.apply(messages[:2 + 2 * 10], budget)
    second = strategy.apply(messages[:2 + 2 * 11], budget)
    assert second[:len(first)] == first  # the prefix is unchanged: no new clearing
    assert strategy.context.info["tool_result_clearing"]["clearings"] == 1


def test_clearing_forgets_its_state_on_a_new_episode() -> None:
    tokens = counter()
    messages = episode(steps=10)
    budget = int(tokens.count_messages(messages) / 0.9)
    strategy = ToolResultClearing()
    strategy.reset(StrategyContext(tokens=tokens, tools=TOOLS))
    strategy.apply(messages, budget)
    other = episode(steps=2)
    assert strategy.apply(other, budget) == other


def test_clearing_drops_units_when_clearing_all_it_may_is_not_enough() -> None:
    tokens = counter()
    messages = episode(steps=6, parallel=2, size=1500)
    last = exchanges(messages)[-1]
    budget = tokens.count_messages([SYSTEM, TASK, *last]) + 50
    output = run(ToolResultClearing(), messages, budget, tokens)
    assert output == [SYSTEM, TASK, *last]


# -- condenser -----------------------------------------------------------------------------
def summariser(reply: str = "The agent checked the weather.") -> Any:
    return lambda _prompt: reply


def condenser_run(messages: Sequence[Message], budget: int, reply: str = "Checked weather.",
                  **options: Any) -> tuple[list[Message], ScriptedAux, StrategyContext]:
    tokens = counter()
    aux = ScriptedAux(tokens, budget, summariser(reply))
    context = StrategyContext(tokens=tokens, tools=TOOLS, aux=aux, options=options)
    strategy = Condenser()
    strategy.reset(context)
    return strategy.apply(messages, budget), aux, context


def test_condenser_sends_a_fitting_trajectory_unchanged_without_a_call() -> None:
    messages = episode(steps=3)
    output, aux, _context = condenser_run(messages, 100_000)
    assert output == messages and aux.calls == []


def test_condenser_summarises_the_oldest_steps_into_one_message_after_the_task() -> None:
    tokens = counter()
    messages = episode(steps=10)
    budget = tokens.count_messages(messages) - 50
    output, aux, context = condenser_run(messages, budget)
    assert tokens.count_messages(output) <= budget
    check_tool_pairs(output, "test")
    assert aux.purposes() == ["condenser"]
    assert output[:2] == [SYSTEM, TASK]
    summary = output[2]
    assert summary["role"] == "user" and text_of(summary).endswith("Checked weather.")
    kept = output[3:]
    assert kept == messages[len(messages) - len(kept):]  # the newest steps, verbatim
    forgotten = messages[2:len(messages) - len(kept)]
    assert text_of(summary).startswith(f"[Summary of {len(forgotten)} earlier messages")
    sent = aux.prompts()[-1]
    assert "result of get_weather: step 0 result" in sent
    assert "called get_weather(" in sent
    assert context.info["condenser"]["condensations"] == 1


def test_condenser_reuses_and_extends_its_summary_as_the_episode_grows() -> None:
    tokens = counter()
    messages = episode(steps=30)
    budget = tokens.count_messages(messages[:2 + 2 * 10])
    replies = iter(["first summary", "second summary", "third summary", "fourth summary"])
    aux = ScriptedAux(tokens, budget, lambda _prompt: next(replies))
    strategy = Condenser()
    strategy.reset(StrategyContext(tokens=tokens, tools=TOOLS, aux=aux))
    calls_after: list[int] = []
    for steps in range(1, 31):
        prompt = strategy.apply(messages[:2 + 2 * steps], budget)
        assert tokens.count_messages(prompt) <= budget
        check_tool_pairs(prompt, "test")
        calls_after.append(len(aux.calls))
    # Condensed only now and then, not at every call once the budget was first reached.
    assert 2 <= len(aux.calls) <= 4 and calls_after[9] == 0
    second = text_of(aux.calls[1][2][-1])
    assert "Summary so far:\nfirst summary" in second
    assert "step 0 result" not in second  # only the newly forgotten steps are read again
    latest = ["first", "second", "third", "fourth"][len(aux.calls) - 1]
    assert text_of(prompt[2]).endswith(f"{latest} summary")  # the newest summary is sent


def test_condenser_keeps_going_on_an_empty_reply() -> None:
    tokens = counter()
    messages = episode(steps=10)
    budget = tokens.count_messages(messages) - 50
    output, aux, context = condenser_run(messages, budget, reply="  ")
    assert context.aux_failures == len(aux.calls) == 1
    assert "were left out to fit the context budget" in text_of(output[2])
    assert tokens.count_messages(output) <= budget


def test_condenser_cuts_a_reply_longer_than_asked() -> None:
    messages = episode(steps=10)
    budget = counter().count_messages(messages) // 2
    _output, _aux, context = condenser_run(messages, budget, reply="word " * 2000,
                                           condenser_summary_tokens=40)
    assert 0 < context.info["condenser"]["summary_tokens"] <= 40


def test_condenser_reads_more_than_one_call_holds_in_several_calls_within_budget() -> None:
    tokens = counter()
    messages = episode(steps=12, size=1200)
    last = messages[-2:]
    budget = tokens.count_messages([SYSTEM, TASK, *last]) + 500
    output, aux, _context = condenser_run(messages, budget)  # ScriptedAux asserts each fits
    assert len(aux.calls) > 1 and set(aux.purposes()) == {"condenser"}
    assert all(counted <= budget for _purpose, counted, _prompt in aux.calls)
    assert tokens.count_messages(output) <= budget and output[-2:] == last


def test_condenser_makes_no_call_the_budget_cannot_hold() -> None:
    tokens = counter()
    messages = episode(steps=6)
    last = messages[-2:]
    budget = tokens.count_messages([SYSTEM, TASK, *last]) + 20
    output, aux, _context = condenser_run(messages, budget)
    assert aux.calls == []
    assert tokens.count_messages(output) <= budget and output[-2:] == last


class _EchoChat:
    """A chat backend replying with the first words of the prompt's last message."""

    def complete(self, messages: Sequence[Message], *, max_tokens: int,
                 tools: Sequence[Any] | None = None) -> Completion:
        return Completion(" ".join(text_of(messages[-1]).split()[:max_tokens // 2]),
                          None, max_tokens // 2, 0.01)


def test_condenser_calls_are_budgeted_and_recorded_by_the_runners_aux_model() -> None:
    tokens = counter()
    messages = episode(steps=12, size=900)
    budget = tokens.count_messages(messages) // 3
    aux = RecordedAuxModel(_EchoChat(), tokens, budget, "agent-0000-condenser-1000",
                           strategy="condenser")
    strategy = Condenser()
    strategy.reset(StrategyContext(tokens=tokens, tools=TOOLS, aux=aux))
    for end in call_points(messages):
        assert tokens.count_messages(strategy.apply(messages[:end], budget)) <= budget
    assert aux.calls and {c.purpose for c in aux.calls} == {"condenser"}
    assert max(c.input_tokens for c in aux.calls) <= budget


def test_condenser_without_an_auxiliary_model_says_so() -> None:
    messages = episode(steps=10)
    strategy = Condenser()
    strategy.reset(StrategyContext(tokens=counter(), tools=TOOLS))
    with pytest.raises(RuntimeError, match="auxiliary model"):
        strategy.apply(messages, counter().count_messages(messages) // 2)


# -- every built-in strategy on a tool history -------------------------------------------
def test_the_tool_strategies_are_the_ones_that_declare_it() -> None:
    assert tool_strategies() == ["condenser", "full_context", "langchain_clear_tool_uses",
                                 "langchain_clear_tool_uses_exact", "langchain_summarization",
                                 "langchain_summarization_exact", "langchain_trim_messages",
                                 "langchain_trim_messages_exact", "observation_masking",
                                 "pair_truncation", "rag", "tool_result_clearing",
                                 "truncation"]


@pytest.mark.parametrize("name", sorted(REGISTRY.builtin))
def test_every_builtin_keeps_pairs_or_refuses_tool_histories(name: str) -> None:
    cls = REGISTRY.resolve(name)
    refusal = tool_refusal(cls)
    if not cls.handles_tools:
        assert refusal is not None
        assert refusal.startswith(f"strategy '{name}' does not handle tool calls (")
        assert refusal.endswith("; use one of: " + ", ".join(tool_strategies()))
        return
    assert refusal is None
    tokens = counter()
    messages = [*episode(steps=6, parallel=2), {"role": "assistant", "content": "Sunny."},
                {"role": "user", "content": "Which city was warmest?"}, *step(6, parallel=3)]
    for budget in (tokens.count_messages(messages) // 3, tokens.count_messages(messages) // 2):
        # A policy not held to fitting (a framework's, as shipped) is not held to its
        # summaries fitting either: in a sweep that is a recorded violation, not a bug.
        aux = ScriptedAux(tokens, budget if cls.fits_budget else None,
                          summariser())
        strategy = load_strategy(name)
        output = run(strategy, messages, budget, tokens, aux=aux)
        check_tool_pairs(output, name)
        assert output[-4:] == messages[-4:]


def test_a_plain_strategy_may_declare_that_it_handles_tools() -> None:
    def keep_all(messages: Sequence[Message], budget: int) -> list[Message]:
        return list(messages)

    refused = plain_strategy_class("m:keep_all", keep_all)
    assert refused is not None and tool_refusal(refused) is not None
    keep_all.handles_tools = True  # type: ignore[attr-defined]
    handled = plain_strategy_class("m:keep_all", keep_all)
    assert handled is not None and tool_refusal(handled) is None


# -- through the plugin, on a chat task ----------------------------------------------------
def test_the_agent_strategies_run_a_chat_sweep_with_their_options(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    from tests.strategy_helpers import graded_sweep

    rows = graded_sweep(pytester, tmp_path, None, 8, "--budgets=512", "--budgetbench-items=2",
                        "--budgetbench-strategies=pair_truncation,observation_masking,"
                        "tool_result_clearing,condenser",
                        "--budgetbench-strategy-options=masking_keep=2,clearing_trigger=0.9,"
                        "condenser_summary_tokens=64",
                        "--budgetbench-task-options=history_tokens=1200")
    condensed = [r for r in rows if r["strategy"] == "condenser"]
    assert all(r["strategy_info"]["condenser"]["condensations"] == 1 for r in condensed)
    assert all(call["purpose"] == "condenser" for r in condensed for call in r["aux_calls"])


def test_rag_on_a_trajectory_keeps_the_units_most_like_the_latest_request() -> None:
    """Over budget, rag keeps the front, the last unit, and the earlier steps whose text
    is nearest the latest user turn (the hashing embedder ranks by shared words)."""
    tokens = counter()
    messages = [*episode(steps=6), {"role": "user", "content": "Which city was warmest?"},
                *step(6)]
    budget = tokens.count_messages(messages) // 2
    output = run(load_strategy("rag"), messages, budget, tokens)
    check_tool_pairs(output, "rag")
    assert tokens.count_messages(output) <= budget
    assert output[:2] == messages[:2] and output[-2:] == messages[-2:]
    assert len(output) < len(messages)
    kept = [m for m in output if m in messages]
    assert kept == output  # nothing rewritten, only whole units left out, order kept


def test_truncation_of_a_trajectory_without_system_prompt_ending_in_a_result_sends_it(
) -> None:
    """No head and no query (the last message is a tool result): the last unit is the
    prompt's anchor, never an empty prompt (which no chat template renders)."""
    messages = [{"role": "user", "content": "Find the report."}, *step(1), *step(2)]
    tokens = counter()
    assert messages[-1]["role"] == "tool"
    output = run(load_strategy("truncation"), messages, 1, tokens)
    assert output == messages[-2:]
