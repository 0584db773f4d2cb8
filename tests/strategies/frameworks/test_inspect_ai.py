"""inspect_ai's compaction policies: inspect's own code behind the strategy interface, the
conversion both ways, its counter as shipped against the run's, and its summaries as
budgeted auxiliary calls."""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_budgetbench.errors import BudgetExceeded, StrategyError
from pytest_budgetbench.messages import Message, check_tool_pairs, text_of
from pytest_budgetbench.strategies import REGISTRY, load_strategy
from pytest_budgetbench.strategies.base import Regime, Strategy, StrategyContext
from pytest_budgetbench.strategies.frameworks import inspect_ai as module
from pytest_budgetbench.testing import (
    TOOLS,
    EchoAuxModel,
    agent_trajectories,
    call_points,
    check_strategy,
    tool_counter,
)
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.base import TokenCounter
from tests.fake_openai import FakeOpenAI
from tests.strategies.frameworks.offline import run_offline
from tests.strategy_helpers import ScriptedAux, memory_items
from tests.sweeps import rows_of, sweep_args

pytest.importorskip("inspect_ai")
# inspect 0.3.285's own retry set-up, on every model call: not this project's to fix.
pytestmark = pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated")
bridge = pytest.importorskip("pytest_budgetbench.strategies.frameworks._inspect_bridge")

NAMES = {
    "inspect_compaction_trim": ("CompactionTrim", False),
    "inspect_compaction_trim_exact": ("CompactionTrim", True),
    "inspect_compaction_edit": ("CompactionEdit", False),
    "inspect_compaction_edit_exact": ("CompactionEdit", True),
    "inspect_compaction_summary": ("CompactionSummary", False),
    "inspect_compaction_summary_exact": ("CompactionSummary", True),
}
SUMMARY_HEADER = "[CONTEXT COMPACTION SUMMARY]"


def run(strategy: Strategy, messages: Sequence[Message], budget: int, tokens: TokenCounter,
        **context: Any) -> tuple[list[Message], StrategyContext]:
    ctx = StrategyContext(tokens=tokens, **context)
    strategy.reset(ctx)
    return strategy.apply(messages, budget), ctx


def chat(turns: int, words: int = 12) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": "Answer briefly."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"On day {i} I walked the dog. " * words})
        messages.append({"role": "assistant", "content": f"Noted, day {i}. " * words})
    return [*messages, {"role": "user", "content": "Where did I walk the dog?"}]


def tool_episode(steps: int) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": "Use the tools."},
                               {"role": "user", "content": "Find the warmest city."}]
    for i in range(steps):
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"query": f"c{i}"})}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{i}",
                      "content": f"City {i}: {20 + i} degrees. " * 20}]
    return messages


class Short:
    """An auxiliary model that always writes one short summary, with no budget of its own:
    for properties of the prompt (the budget of aux calls is tested on its own)."""

    def __init__(self) -> None:
        self.calls: list[list[Message]] = []

    def complete(self, messages: Sequence[Message], *, max_tokens: int, purpose: str,
                 schema: Any = None) -> str:
        self.calls.append(list(messages))
        return "<analysis>thinking</analysis>\n<summary>The user walks a dog.</summary>"


# -- the registry ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(NAMES))
def test_each_name_runs_inspects_own_policy_in_its_variant(name: str) -> None:
    cls: Any = REGISTRY.resolve(name)
    policy, exact = NAMES[name]
    assert cls.name == name and cls.policy == policy and cls.exact is exact
    assert cls.framework == "inspect_ai" and cls.handles_tools and not cls.fits_budget
    assert module.INSPECT in cls.requires and (module.O200K in cls.requires) is not exact
    assert (Regime.AUXILIARY_MODEL in cls.regimes) is (policy == "CompactionSummary")
    from inspect_ai import model as inspect_model

    strategy: Any = cls()
    strategy.reset(StrategyContext(tokens=ApproxCounter()))
    assert type(strategy.compaction_strategy()) is getattr(inspect_model, policy)


def test_the_registry_resolves_them_without_importing_inspect() -> None:
    code = ("import sys; from pytest_budgetbench.strategies import REGISTRY; "
            f"[REGISTRY.resolve(n) for n in {sorted(NAMES)!r}]; "
            "print('inspect_ai' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"


def test_a_missing_extra_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from pytest_budgetbench.errors import MissingDependency, check_installed

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "quicktok" else found(name, *a))
    with pytest.raises(MissingDependency) as raised:
        check_installed(module.InspectCompactionTrim.requires, "the inspect_compaction_trim "
                        "strategy")
    assert str(raised.value) == ("the inspect_compaction_trim strategy needs the 'quicktok-v1' "
                                 "package: pip install 'pytest-budgetbench[inspect-ai]'")
    check_installed(module.InspectCompactionTrimExact.requires, "the exact variant")


def test_options_take_inspects_values_and_refuse_others() -> None:
    assert module.threshold("0.5") == 0.5 and module.threshold("3000") == 3000
    assert module.turns("all") == "all" and module.turns("2") == 2
    for bad in ("0", "1.5", "x", "-1"):
        with pytest.raises(ValueError, match="share of the window"):
            module.threshold(bad)
    with pytest.raises(ValueError, match="true or false"):
        module.boolean("yes")
    defaults = {o.key: o.default for cls in map(REGISTRY.resolve, NAMES)
                for o in cls.declared_options}
    assert defaults == {  # inspect_ai 0.3.285's own defaults, but the summary reply cap
        "inspect_threshold": 0.9, "inspect_memory": True, "inspect_preserve": 0.8,
        "inspect_keep_thinking_turns": 1, "inspect_keep_tool_uses": 3,
        "inspect_keep_tool_inputs": True, "inspect_exclude_tools": None,
        "inspect_instructions": None, "inspect_prompt": None, "inspect_max_tokens": 1024}


# -- conversion --------------------------------------------------------------------------------
@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """Agent trajectories, some user turns as lists of text parts, some arguments not JSON."""
    messages = copy.deepcopy(draw(agent_trajectories()))
    for message in messages:
        if message["role"] == "user" and draw(st.booleans()):
            message["content"] = [{"type": "text", "text": part}
                                  for part in message["content"].split(" ", 1)]
        for call in message.get("tool_calls") or []:
            if draw(st.integers(0, 4)) == 0:
                call["function"]["arguments"] = '{"query":"no spaces", "n": [1, 2.50]}'
            elif draw(st.integers(0, 4)) == 0:
                call["function"]["arguments"] = "not json at all"
    return messages


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(messages=conversations())
def test_messages_cross_to_inspect_and_back_without_loss(messages: list[Message]) -> None:
    pristine = copy.deepcopy(messages)
    converter = bridge.Converter()
    chats = asyncio.run(converter.to_inspect(messages))
    assert messages == pristine  # inspect's converter edits what it is given: a copy
    assert [c.role for c in chats] == [m["role"] for m in messages]
    assert [c.id for c in chats] == [f"m{i}" for i in range(len(messages))]
    for chat_message, message in zip(chats, messages, strict=True):
        if message["role"] == "tool":
            assert chat_message.tool_call_id == message["tool_call_id"] and chat_message.function
        for call, parsed in zip(message.get("tool_calls") or [],
                                getattr(chat_message, "tool_calls", None) or [],
                                strict=True):
            assert (parsed.id, parsed.function) == (call["id"], call["function"]["name"])
    converter.originals.clear()  # every message back through inspect's own converter
    back = asyncio.run(converter.to_openai(chats))
    assert back == pristine


def test_inspects_whole_list_converter_would_fold_a_reply_into_the_call() -> None:
    """Why messages cross one at a time: given the list, inspect merges an assistant reply
    that follows a tool result into the message that made the call."""
    from inspect_ai.model import messages_from_openai

    messages = [*tool_episode(1), {"role": "assistant", "content": "It is city 0."}]
    given: Any = copy.deepcopy(messages)
    assert len(asyncio.run(messages_from_openai(given))) == 4
    assert len(asyncio.run(bridge.Converter().to_inspect(messages))) == 5


def test_a_part_inspect_cannot_carry_is_refused_by_name() -> None:
    messages = chat(1)
    messages[1]["content"] = [{"type": "text", "text": "see"},
                              {"type": "image_url", "image_url": {"url": "data:,"}}]
    with pytest.raises(StrategyError, match="'image_url' content part"):
        run(load_strategy("inspect_compaction_trim_exact"), messages, 4096, ApproxCounter())


# -- the conformance kit -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["inspect_compaction_trim", "inspect_compaction_trim_exact",
                                  "inspect_compaction_edit", "inspect_compaction_edit_exact"])
def test_trim_and_edit_conform(name: str) -> None:
    check_strategy(REGISTRY.resolve(name), max_examples=15)


def summary_context(tokens: TokenCounter, budget: int) -> StrategyContext:
    return StrategyContext(tokens=tokens, item_id="conformance", aux=Short())


@pytest.mark.parametrize("name", ["inspect_compaction_summary",
                                  "inspect_compaction_summary_exact"])
def test_summary_conforms_with_an_aux_model_not_held_to_the_budget(name: str) -> None:
    """inspect's summary call (the conversation and its ~1,260-token prompt) is over small
    budgets by design: that is a budgeted aux violation, tested on its own below."""
    check_strategy(REGISTRY.resolve(name), max_examples=10, context_factory=summary_context)


# -- counting ---------------------------------------------------------------------------------
def test_as_shipped_counts_as_inspect_o200k_base_plus_a_tenth() -> None:
    import tiktoken

    messages = chat(2)
    prompt, ctx = run(load_strategy("inspect_compaction_trim"), messages, 100_000, ApproxCounter())
    assert prompt == messages  # under the threshold: nothing to do
    text = "\n".join(text_of(m) for m in messages)
    expected = int(len(tiktoken.get_encoding("o200k_base").encode(text)) * 1.1)
    assert ctx.estimated_tokens == expected + 1  # and 1 for no tools, as inspect counts them
    assert ctx.info["framework"]["counter"] == "inspect-o200k_base+10%"


def test_the_o200k_file_is_tiktokens_own_rebuilt_offline() -> None:
    import hashlib

    assert hashlib.sha256(bridge.o200k_file()).hexdigest() == bridge.O200K_SHA256


def test_the_shipped_variant_counts_in_a_process_with_no_network_and_no_cache(
        tmp_path: Path) -> None:
    """In a fresh process, every connection refused and tiktoken's cache empty: inspect's
    o200k_base count works, nothing is fetched, and nothing is left in the work dir."""
    work = tmp_path / "strategy-files"
    done = run_offline(
        "from pathlib import Path\n"
        "from pytest_budgetbench.strategies import load_strategy\n"
        "from pytest_budgetbench.strategies.base import StrategyContext\n"
        "from pytest_budgetbench.tokens.approximate import ApproxCounter\n"
        "s = load_strategy('inspect_compaction_trim')\n"
        f"ctx = StrategyContext(tokens=ApproxCounter(), work_dir=Path({str(work)!r}))\n"
        "s.reset(ctx)\n"
        "s.apply([{'role': 'user', 'content': 'hello world'}], 1000)\n"
        "print(ctx.estimated_tokens)\n", tmp_path / "empty")
    assert done.stdout.split()[-1] == "3"  # 2 o200k tokens, +10 % rounded down, +1 for tools
    assert list(work.iterdir()) == []


def test_the_estimate_is_on_the_row_and_differs_from_a_known_count() -> None:
    """The approximate counter's count is known (characters / 4 plus framing); inspect's
    o200k count of the same prompt is not it, and the exact variant's is."""
    tokens = ApproxCounter()
    messages = chat(3)
    known = tokens.count_messages(messages)
    _, shipped = run(load_strategy("inspect_compaction_edit"), messages, 100_000, tokens)
    _, exact = run(load_strategy("inspect_compaction_edit_exact"), messages, 100_000, tokens)
    assert exact.estimated_tokens == known
    assert shipped.estimated_tokens is not None and shipped.estimated_tokens != known
    assert exact.info["framework"]["counter"] == "exact"


def test_the_exact_trim_gets_under_the_threshold_where_the_shipped_one_misjudges() -> None:
    tokens = ApproxCounter()
    item = memory_items(1, 3000)[0]
    budget = 1024
    exact_prompt, exact = run(load_strategy("inspect_compaction_trim_exact"), item.messages,
                              budget, tokens)
    assert exact.info["framework"]["insufficient"] is None
    assert exact.estimated_tokens is not None
    assert tokens.count_messages(exact_prompt) == exact.estimated_tokens <= int(0.9 * budget)
    shipped_prompt, shipped = run(load_strategy("inspect_compaction_trim"), item.messages,
                                  budget, tokens)
    assert shipped.estimated_tokens is not None and shipped.estimated_tokens <= int(0.9 * budget)
    assert tokens.count_messages(shipped_prompt) != shipped.estimated_tokens
    assert shipped.info["framework"]["compactions"] > 0


class NoEmptyPrompt(ApproxCounter):
    """As a chat template that reads ``messages[0]`` (Qwen's): an empty prompt fails."""

    def count_messages(self, messages: Sequence[Message], tools: Any = None) -> int:
        if not messages:
            raise ValueError("list object has no element 0")
        return super().count_messages(messages, tools)


def test_the_exact_variant_never_counts_an_empty_prompt() -> None:
    tokens = NoEmptyPrompt()
    messages = chat(20)
    for name in ("inspect_compaction_trim_exact", "inspect_compaction_edit_exact"):
        prompt, ctx = run(load_strategy(name), messages, 600, tokens)
        assert ctx.estimated_tokens == tokens.count_messages(prompt)


def test_the_exact_variant_counts_the_tools_inspect_is_given() -> None:
    tokens = tool_counter(TOOLS)
    messages = tool_episode(2)
    prompt, ctx = run(load_strategy("inspect_compaction_trim_exact"), messages, 100_000, tokens,
                      tools=TOOLS)
    assert prompt == messages and ctx.estimated_tokens == tokens.count_messages(messages)
    _, shipped = run(load_strategy("inspect_compaction_trim"), messages, 100_000, tokens,
                     tools=TOOLS)
    _, bare = run(load_strategy("inspect_compaction_trim"), messages, 100_000, tokens)
    assert shipped.estimated_tokens is not None and bare.estimated_tokens is not None
    assert shipped.estimated_tokens > bare.estimated_tokens + 50  # inspect counts the schemas


# -- what each policy does -------------------------------------------------------------------
def test_trim_keeps_the_system_the_first_turn_and_the_newest_share() -> None:
    tokens = ApproxCounter()
    messages = chat(30)
    prompt, ctx = run(load_strategy("inspect_compaction_trim_exact"), messages, 1500, tokens)
    assert prompt[:2] == messages[:2] and prompt[-1] == messages[-1]
    assert all(m in messages for m in prompt)  # trim rewrites nothing
    assert len(prompt) < len(messages) and ctx.info["framework"]["calls"] == 31


def test_edit_clears_older_tool_results_and_keeps_the_pairs() -> None:
    tokens = tool_counter(TOOLS)
    messages = tool_episode(6)
    budget = tokens.count_messages(messages) * 17 // 20
    prompt, ctx = run(load_strategy("inspect_compaction_edit_exact"), messages, budget, tokens,
                      tools=TOOLS)
    check_tool_pairs(prompt, "edit")
    assert len(prompt) == len(messages) and prompt[-6:] == messages[-6:]  # 3 results kept
    assert [m["tool_calls"] for m in prompt[2::2]] == [m["tool_calls"] for m in messages[2::2]]
    cleared = [m for m in prompt if m["role"] == "tool" and m not in messages]
    assert cleared and {m["content"] for m in cleared} == {"(Tool result removed)"}
    assert [m["tool_call_id"] for m in cleared] == [f"call_{i}" for i in range(len(cleared))]
    assert ctx.info["framework"]["insufficient"] is None and ctx.estimated_tokens is not None
    assert tokens.count_messages(prompt) == ctx.estimated_tokens <= int(0.9 * budget)


def test_edit_on_a_chat_without_tools_is_inspects_insufficient_and_sends_it_all() -> None:
    tokens = ApproxCounter()
    messages = chat(10)
    prompt, ctx = run(load_strategy("inspect_compaction_edit_exact"), messages, 300, tokens)
    assert prompt == messages
    assert ctx.info["framework"]["insufficient"].startswith("Compaction insufficient")


def test_an_episode_is_one_conversation_compacted_call_by_call() -> None:
    tokens = tool_counter(TOOLS)
    messages = tool_episode(8)
    budget = tokens.count_messages(messages) // 2
    strategy = load_strategy("inspect_compaction_trim_exact")
    strategy.reset(StrategyContext(tokens=tokens, tools=TOOLS))
    prompts = [strategy.apply(messages[:end], budget) for end in call_points(messages)]
    assert strategy.context.info["framework"]["calls"] == len(prompts)
    for end, prompt in zip(call_points(messages), prompts, strict=True):
        check_tool_pairs(prompt, "trim")
        assert prompt[-2:] == messages[end - 2 : end]


# -- summaries through the auxiliary model ----------------------------------------------------
def test_summaries_are_the_runners_aux_calls_with_inspects_prompt() -> None:
    from inspect_ai.model import CompactionSummary

    tokens = ApproxCounter()
    aux = ScriptedAux(tokens, reply="<analysis>x</analysis>\n<summary>Dog walks, daily.</summary>")
    messages = chat(12)
    prompt, ctx = run(load_strategy("inspect_compaction_summary_exact"), messages, 4000, tokens,
                      aux=aux, options={"inspect_threshold": 0.3})
    assert aux.purposes() and set(aux.purposes()) == {"inspect/summary"}
    assert ctx.info["framework"]["summaries"] == len(aux.calls)
    first = aux.calls[0].prompt
    assert first[:2] == messages[:2]
    assert text_of(first[-1]).strip() == CompactionSummary.DEFAULT_SUMMARY_PROMPT.format(
        addendums="").strip()
    summaries = [m for m in prompt if m not in messages]
    assert len(summaries) == 1 and summaries[0]["role"] == "user"
    assert "Dog walks, daily." in text_of(summaries[0]) and "<analysis>" not in text_of(
        summaries[0])
    assert tokens.count_messages(prompt) <= 4000


def test_the_turn_a_summary_took_in_follows_it() -> None:
    """inspect's summary replaces the whole conversation, the turn the model answers now
    included; the prompt still ends with that turn, after the summary."""
    tokens = ApproxCounter()
    messages = chat(12)
    budget = int((tokens.count_messages(messages) - 2) / 0.9)  # only the last call crosses
    assert tokens.count_messages(messages[:-2]) <= int(0.9 * budget)
    aux = Short()
    prompt, ctx = run(load_strategy("inspect_compaction_summary_exact"), messages, budget,
                      tokens, aux=aux)
    assert len(aux.calls) == 1 and messages[-1] in aux.calls[0]  # summarised too
    assert prompt[:2] == messages[:2] and prompt[-1] == messages[-1] and len(prompt) == 4
    assert text_of(prompt[2]).startswith(SUMMARY_HEADER)
    assert "The user walks a dog." in text_of(prompt[2])
    assert ctx.info["framework"]["reattached"] == 1
    assert ctx.estimated_tokens == tokens.count_messages(prompt)


def test_a_summary_call_over_the_budget_is_a_budget_violation() -> None:
    tokens = ApproxCounter()
    messages = chat(12)
    with pytest.raises(BudgetExceeded, match="inspect/summary"):
        run(load_strategy("inspect_compaction_summary"), messages, 1024, tokens,
            aux=EchoAuxModel(tokens, 1024))


def test_an_endpoint_error_of_a_summary_call_reaches_the_runner_unwrapped() -> None:
    from pytest_budgetbench.errors import EndpointUnavailable

    class Down:
        def complete(self, *args: Any, **kwargs: Any) -> str:
            raise EndpointUnavailable("aux endpoint down")

    with pytest.raises(EndpointUnavailable, match="aux endpoint down"):
        run(load_strategy("inspect_compaction_summary_exact"), chat(12), 4000, ApproxCounter(),
            aux=Down(), options={"inspect_threshold": 0.3})


def test_a_sweep_records_the_estimate_and_a_raising_framework_fails_its_cell_only(
        pytester: pytest.Pytester, fake: FakeOpenAI, tmp_path: Path) -> None:
    """inspect formats its summary prompt with str.format: a prompt naming a field it does
    not fill raises inside inspect, and that cell alone is a strategy error."""
    result = pytester.runpytest(*sweep_args(
        fake, tmp_path, "--budgets=512", "--budgetbench-items=1",
        "--budgetbench-strategies=inspect_compaction_summary_exact,inspect_compaction_trim_exact",
        "--budgetbench-strategy-options=inspect_prompt=Summarise {addendums} {missing}",
        "--budgetbench-task-options=history_tokens=1200"))
    result.assert_outcomes(passed=1, errors=1)
    rows = {row["strategy"]: row for row in rows_of(tmp_path)}
    failed = rows["inspect_compaction_summary_exact"]
    assert failed["status"] == "error" and "KeyError" in failed["error"]
    trimmed = rows["inspect_compaction_trim_exact"]
    assert trimmed["status"] == "ok" and trimmed["counted_tokens"] <= 512
    assert trimmed["estimated_tokens"] == trimmed["counted_tokens"]
    assert trimmed["strategy_info"]["framework"]["policy"] == "CompactionTrim"


def test_a_sweep_records_inspects_summary_calls_as_the_cells_aux_calls(
        pytester: pytest.Pytester, fake: FakeOpenAI, tmp_path: Path) -> None:
    result = pytester.runpytest(*sweep_args(
        fake, tmp_path, "--budgets=4096", "--budgetbench-items=2",
        "--budgetbench-strategies=inspect_compaction_summary",
        "--budgetbench-strategy-options=inspect_threshold=0.3,inspect_max_tokens=64",
        "--budgetbench-task-options=history_tokens=3000"))
    result.assert_outcomes(passed=2)
    for row in rows_of(tmp_path):
        calls = row["aux_calls"]
        assert calls and {call["purpose"] for call in calls} == {"inspect/summary"}
        assert all(call["input_tokens"] <= 4096 for call in calls)
        assert row["strategy_info"]["framework"]["summaries"] == len(calls)
        assert row["estimated_tokens"] is not None and row["counted_tokens"] <= 4096
