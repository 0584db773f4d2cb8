"""LlamaIndex's memories as strategies: the message bridge, the budget mapping, the
counters (LlamaIndex's own tiktoken, offline; the run's), the summariser's calls through
the runner's auxiliary model, and what a sweep makes of a LlamaIndex failure."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("llama_index.core")

import llama_index.core
import tiktoken
import tiktoken.load
import tiktoken.registry
from llama_index.core.base.llms.types import ChatMessage, ToolCallBlock
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.memory.chat_summary_memory_buffer import SUMMARIZE_PROMPT

from pytest_budgetbench.engine.aux_calls import RecordedAuxModel
from pytest_budgetbench.errors import (
    BudgetExceeded,
    Requirement,
    StrategyError,
    first_missing,
)
from pytest_budgetbench.messages import Message, check_tool_pairs, text_of
from pytest_budgetbench.model.chat import Completion
from pytest_budgetbench.strategies import REGISTRY, StrategyContext
from pytest_budgetbench.strategies.frameworks import (
    _llamaindex_bridge as bridge,
)
from pytest_budgetbench.strategies.frameworks.llamaindex import (
    LlamaIndexChatMemoryBuffer,
    LlamaIndexChatMemoryBufferExact,
    LlamaIndexChatSummaryMemory,
    LlamaIndexChatSummaryMemoryExact,
    LlamaIndexMemory,
    LlamaIndexMemoryExact,
    LlamaIndexPolicy,
)
from pytest_budgetbench.testing import (
    TOOLS,
    HashingEmbedder,
    agent_trajectories,
    check_strategy,
    histories,
    tool_counter,
)
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.base import TokenCounter
from pytest_budgetbench.tokens.gguf import GGUFCounter
from tests.fake_openai import FakeOpenAI
from tests.strategies.frameworks.offline import run_offline
from tests.strategy_helpers import ScriptedAux, run_strategy
from tests.sweeps import rows_of, sweep_args

POLICIES: list[type[LlamaIndexPolicy]] = [
    LlamaIndexMemory, LlamaIndexMemoryExact, LlamaIndexChatMemoryBuffer,
    LlamaIndexChatMemoryBufferExact, LlamaIndexChatSummaryMemory,
    LlamaIndexChatSummaryMemoryExact]


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Refuse (and record) any connection off this machine and any tiktoken download."""
    attempts: list[str] = []
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> Any:
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            attempts.append(f"connect {address}")
            raise OSError(f"test: no network ({address})")
        return real_connect(self, address)

    def download(blobpath: str) -> bytes:
        attempts.append(f"download {blobpath}")
        raise OSError(f"test: no download ({blobpath})")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(tiktoken.load, "read_file", download)
    yield attempts
    assert attempts == []


def chat(turns: int, words: int = 30) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": "Answer briefly."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"On day {i} I walked the dog. " +
                         "It was sunny and the park was full. " * (words // 8)})
        messages.append({"role": "assistant", "content": f"Noted, a walk on day {i}."})
    messages.append({"role": "user", "content": "When did I last walk the dog?"})
    return messages


def episode() -> list[Message]:
    """Two user turns, the second still running: two steps of tool calls and results."""
    def step(n: int, size: int) -> list[Message]:
        call = {"id": f"call_{n}", "type": "function",
                "function": {"name": "search_files", "arguments": json.dumps({"query": n})}}
        return [{"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"call_{n}", "content": "found " * size}]
    return [{"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Find the report."}, *step(0, 300), *step(1, 300),
            {"role": "assistant", "content": "It is in reports/q3.txt."},
            {"role": "user", "content": "Now find the invoice."}, *step(2, 40), *step(3, 40)]


# -- the message bridge ------------------------------------------------------------------
@settings(max_examples=80, deadline=None, derandomize=True)
@given(messages=st.one_of(agent_trajectories(), histories()))
def test_messages_cross_to_llamaindex_and_back_without_loss(messages: list[Message]) -> None:
    for message in messages:
        converted = bridge.to_llama(message)
        assert bridge.from_llama(converted) == message
        # Memory keeps its messages as JSON in SQLite and reads them back.
        stored = ChatMessage.model_validate(converted.model_dump(mode="json"))
        assert bridge.from_llama(stored) == message


def test_tool_calls_cross_as_llamaindex_0_14_carries_them() -> None:
    call = {"id": "call_7", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'}}
    asked = bridge.to_llama({"role": "assistant", "content": None, "tool_calls": [call]})
    (block,) = asked.blocks
    assert isinstance(block, ToolCallBlock)
    assert (block.tool_call_id, block.tool_name, block.tool_kwargs) == (
        "call_7", "get_weather", '{"city": "Lisbon"}')
    assert asked.content is None and asked.additional_kwargs["tool_calls"] == [call]
    answered = bridge.to_llama({"role": "tool", "tool_call_id": "call_7", "content": "sun"})
    assert answered.additional_kwargs == {"tool_call_id": "call_7"}  # as FunctionAgent's


def test_content_lists_of_text_come_back_as_they_were() -> None:
    two = {"role": "user", "content": [{"type": "text", "text": "a"},
                                       {"type": "text", "text": "b"}]}
    one = {"role": "user", "content": [{"type": "text", "text": "a"}]}
    assert bridge.from_llama(bridge.to_llama(two)) == two
    assert bridge.from_llama(bridge.to_llama(one)) == {"role": "user", "content": "a"}
    assert bridge.restore([bridge.to_llama(one)], [one]) == [one]


def test_an_image_part_is_refused_by_name() -> None:
    image = {"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
    with pytest.raises(StrategyError, match="llama_index cannot carry a 'image_url'"):
        run_strategy(LlamaIndexMemory(), [image], 512, ApproxCounter())


# -- the conformance kit -------------------------------------------------------------------
def scripted_context(tokens: TokenCounter, budget: int) -> StrategyContext:
    """The kit's context with an aux model that answers any prompt: ChatSummaryMemoryBuffer
    sends its whole eviction in one call, which the kit's budgeted aux refuses (that
    refusal is tested below)."""
    return StrategyContext(tokens=tokens, item_id="conformance", embedder_factory=HashingEmbedder,
                           aux=ScriptedAux(tokens, reply="the user walks the dog"))


@pytest.mark.parametrize("policy", POLICIES, ids=lambda cls: cls.name)
def test_conforms(policy: type[LlamaIndexPolicy]) -> None:
    assert not policy.fits_budget  # neither variant bounds the system messages, tools...
    check_strategy(policy, context_factory=scripted_context, max_examples=20)


def test_registered_under_names_that_say_framework_and_policy() -> None:
    for policy in POLICIES:
        assert REGISTRY.resolve(policy.name) is policy
        assert policy.exact == policy.name.endswith("_exact")


# -- budget and counters -----------------------------------------------------------------
@pytest.mark.parametrize("policy", POLICIES, ids=lambda cls: cls.name)
def test_a_history_that_fits_is_sent_unchanged(policy: type[LlamaIndexPolicy]) -> None:
    messages = chat(3)
    aux = ScriptedAux(ApproxCounter())
    assert run_strategy(policy(), messages, 4096, ApproxCounter(), aux=aux) == messages
    assert aux.calls == []


def test_as_shipped_counts_with_llamaindex_tiktoken_read_offline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_network: list[str]
) -> None:
    """The first tokenizer of the process is loaded from llama-index-core's own cache even
    where TIKTOKEN_CACHE_DIR names an empty directory (tiktoken would download there)."""
    monkeypatch.setattr(llama_index.core, "global_tokenizer", None)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    context = StrategyContext(tokens=ApproxCounter())
    strategy = LlamaIndexChatMemoryBuffer()
    strategy.reset(context)
    strategy.apply(chat(30), 300)
    assert context.info["framework"]["tokenizer"] == "tiktoken cl100k_base"
    assert context.info["framework"]["counter"] == "tiktoken cl100k_base"
    assert no_network == [] and list(tmp_path.iterdir()) == []
    assert bridge.shipped_tokenizer()("hello world") == [15339, 1917]  # cl100k_base's ids


def test_the_estimate_is_llamaindex_count_and_differs_from_the_exact_count(
    gguf: GGUFCounter,
) -> None:
    """On a prompt that fits, whose exact count is known: as shipped, LlamaIndex's count is
    tiktoken's over the system text plus the joined contents; _exact, the run's count of
    the system messages plus its count of the same joined text. Neither sees the chat
    template's tokens around each message."""
    messages = chat(4)
    exact = gguf.count_messages(messages)
    tokenizer = bridge.shipped_tokenizer()
    rest = " ".join(text_of(m) for m in messages[1:])
    for policy, expected in [
        (LlamaIndexChatMemoryBuffer, len(tokenizer("Answer briefly.")) + len(tokenizer(rest))),
        (LlamaIndexChatMemoryBufferExact,
         gguf.count_messages(messages[:1]) + gguf.count_text(rest)),
    ]:
        context = StrategyContext(tokens=gguf)
        strategy = policy()
        strategy.reset(context)
        assert strategy.apply(messages, exact + 100) == messages
        assert context.estimated_tokens == expected != exact
        assert context.info["framework"]["policy"] == "ChatMemoryBuffer"


def test_token_limit_is_the_budget_less_the_system_messages(gguf: GGUFCounter) -> None:
    messages = chat(40)
    for policy, front in [
        (LlamaIndexMemory, len(bridge.shipped_tokenizer()("Answer briefly."))),
        (LlamaIndexMemoryExact, gguf.with_tools(TOOLS).count_messages(messages[:1])),
    ]:
        context = StrategyContext(tokens=gguf.with_tools(TOOLS))
        strategy = policy()
        strategy.reset(context)
        prompt = strategy.apply(messages, 1024)
        assert context.info["framework"]["token_limit"] == 1024 - front
        assert prompt[:1] == messages[:1] and prompt[-1] == messages[-1]
        assert prompt[1]["role"] == "user" and len(prompt) < len(messages)


def test_without_system_messages_the_front_is_the_tools_and_the_template() -> None:
    """Qwen2.5's template (the default model's) cannot render an empty prompt: the front of
    an episode without a system message is the counter's overhead (the tools, the
    template's fixed tokens)."""
    pytest.importorskip("llama_cpp")
    from pytest_budgetbench.embedded_server.models import embedded_gguf_path
    from tests.tokens.chat_templates import QWEN25

    qwen = GGUFCounter(embedded_gguf_path("smollm2"), chat_template=QWEN25)
    tokens = qwen.with_tools(TOOLS)
    context = StrategyContext(tokens=tokens, tools=TOOLS)
    strategy = LlamaIndexMemoryExact()
    strategy.reset(context)
    strategy.apply(episode()[1:], 1024)
    assert context.info["framework"]["token_limit"] == 1024 - tokens.overhead()


def test_memory_takes_its_options() -> None:
    messages = chat(40)

    def kept(**options: Any) -> int:
        return len(run_strategy(LlamaIndexMemory(), messages, 2000, ApproxCounter(),
                                options=options))

    fine = kept(llamaindex_token_flush_size=50)
    assert fine > kept()  # finer flushes than from_defaults' keep more
    assert kept(llamaindex_token_flush_size=50, llamaindex_chat_history_token_ratio=0.3) < fine


# -- the summariser ----------------------------------------------------------------------
class EchoChat:
    """A chat backend replying with the first words of the prompt's last message."""

    def complete(self, messages: Sequence[Message], *, max_tokens: int,
                 tools: Sequence[Any] | None = None, response_format: object = None
                 ) -> Completion:
        return Completion(" ".join(text_of(messages[-1]).split()[:20]), None, 20, 0.01)


@pytest.mark.parametrize("policy", [LlamaIndexChatSummaryMemory,
                                    LlamaIndexChatSummaryMemoryExact])
def test_the_summary_is_written_through_the_recorded_auxiliary_model(
    policy: type[LlamaIndexPolicy],
) -> None:
    tokens = ApproxCounter()
    messages = chat(12)
    budget = tokens.count_messages(messages) * 2 // 3
    aux = RecordedAuxModel(EchoChat(), tokens, budget, "memory-0000-x-512",
                           strategy=policy.name)
    prompt = run_strategy(policy(), messages, budget, tokens, aux=aux)
    assert [call.purpose for call in aux.calls] == ["llamaindex/summary"]
    assert aux.calls[0].input_tokens <= budget
    assert prompt[0] == messages[0] and prompt[-1] == messages[-1]
    assert prompt[1]["role"] == "system"  # the summary: the echo of the transcript's start
    assert prompt[1]["content"].startswith('"Transcript so far: user: On day 0 I walked')
    assert prompt[2]["role"] == "user" and len(prompt) < len(messages)


def test_the_summary_prompt_is_llamaindex_own() -> None:
    tokens = ApproxCounter()
    aux = ScriptedAux(tokens, reply="walks")
    run_strategy(LlamaIndexChatSummaryMemory(), chat(12), 300, tokens, aux=aux)
    ((_purpose, _counted, prompt),) = aux.calls
    assert prompt[0] == {"role": "system", "content": SUMMARIZE_PROMPT}
    assert text_of(prompt[1]).startswith('"Transcript so far: user: On day 0 I walked')
    aux = ScriptedAux(tokens, reply="walks")
    run_strategy(LlamaIndexChatSummaryMemory(), chat(12), 300, tokens, aux=aux,
                 options={"llamaindex_summarize_prompt": "Summarise.", "llamaindex_max_tokens": 7})
    assert aux.calls[0].prompt[0]["content"] == "Summarise."


def test_an_over_budget_summary_call_is_a_budget_violation() -> None:
    """LlamaIndex summarises everything evicted in one call: at a small budget that call is
    over it, and the runner's aux model refuses it before anything is sent."""
    tokens = ApproxCounter()
    aux = RecordedAuxModel(EchoChat(), tokens, 200, "memory-0000-x-200",
                           strategy=LlamaIndexChatSummaryMemory.name)
    with pytest.raises(BudgetExceeded, match="auxiliary call 'llamaindex/summary'"):
        run_strategy(LlamaIndexChatSummaryMemory(), chat(30), 200, tokens, aux=aux)
    assert aux.calls == []


def test_the_summary_buffer_needs_the_auxiliary_model() -> None:
    with pytest.raises(RuntimeError, match="auxiliary model"):
        run_strategy(LlamaIndexChatSummaryMemory(), chat(30), 300, ApproxCounter())


# -- agent episodes ----------------------------------------------------------------------
@pytest.mark.parametrize("policy", POLICIES, ids=lambda cls: cls.name)
def test_an_agent_run_keeps_its_pairs_and_its_current_steps(
    policy: type[LlamaIndexPolicy],
) -> None:
    """What follows the last user message (the agent's scratchpad) is kept untrimmed; the
    memory's window starts at a user message, so no call loses its result."""
    messages = episode()
    tokens = tool_counter(TOOLS)
    prompt = run_strategy(policy(), messages, 400, tokens, tools=TOOLS,
                          aux=ScriptedAux(tokens, reply="a search"))
    check_tool_pairs(prompt, policy.name)
    assert prompt[0] == messages[0] and prompt[-5:] == messages[-5:]
    assert prompt[-5]["content"] == "Now find the invoice."
    assert tokens.count_messages(prompt) < tokens.count_messages(messages)


# -- packaging and sweeps ------------------------------------------------------------------
def test_importing_the_strategies_imports_no_llama_index() -> None:
    code = ("import sys, pytest_budgetbench.strategies.frameworks.llamaindex\n"
            "assert not [m for m in sys.modules if m.startswith('llama_index')]")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_importing_llamaindex_and_its_tokenizer_reaches_no_network(tmp_path: Path) -> None:
    """In a fresh process, with every connection refused from the start: importing the
    bridge (llama_index.core, its memories) and loading its tokenizer connects nowhere and
    downloads nothing (no tiktoken encoding, no nltk data)."""
    run_offline(
        "from pytest_budgetbench.strategies.frameworks import _llamaindex_bridge as b\n"
        "assert b.shipped_tokenizer()('hello world') == [15339, 1917]\n"
        "assert not [m for m in sys.modules if m.startswith('nltk')]\n", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_dotted_requirement_whose_parent_is_missing_is_missing() -> None:
    missing = Requirement("no_such_parent_pkg.core", "llamaindex", "llama-index-core")
    assert first_missing([*LlamaIndexMemory.requires, missing]) is missing


def test_a_missing_llamaindex_is_one_line_before_any_cell(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "llama_index.core", None)
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=512", "--budgetbench-items=1",
        "--budgetbench-strategies=llamaindex_memory"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: strategy 'llamaindex_memory' needs the 'llama-index-core' package: "
        "pip install 'pytest-budgetbench[[]llamaindex]'"])
    assert fake_endpoint.requests == []


def test_a_llamaindex_failure_is_that_cells_strategy_error(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: ChatMemoryBuffer, *args: Any, **kwargs: Any) -> list[ChatMessage]:
        raise ValueError("Initial token count exceeds token limit")

    monkeypatch.setattr(ChatMemoryBuffer, "get", broken)
    result = pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=512", "--budgetbench-items=2",
        "--budgetbench-strategies=llamaindex_chat_memory_buffer,truncation"))
    result.assert_outcomes(passed=2, errors=2)
    rows = rows_of(tmp_path)
    failed = [r for r in rows if r["strategy"] == "llamaindex_chat_memory_buffer"]
    assert [r["status"] for r in failed] == ["error", "error"]
    assert "Initial token count exceeds token limit" in failed[0]["error"]
    assert {r["status"] for r in rows if r["strategy"] == "truncation"} == {"ok"}


def test_a_sweep_records_the_estimate_and_the_summary_calls(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
) -> None:
    """The summary buffer as shipped thinks its prompt fits (tiktoken's count of the text,
    the summary included) where the run's count, chat template and all, says it does not:
    its rows are violations, with both counts and the summary call on them."""
    pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=1024", "--budgetbench-items=2",
        "--budgetbench-task-options=history_tokens=1200",
        "--budgetbench-strategies=llamaindex_chat_summary_memory,llamaindex_memory_exact"))
    rows = rows_of(tmp_path)
    assert len(rows) == 4
    for row in rows:
        assert row["strategy_info"]["framework"]["framework"] == "llama_index"
        assert 0 < row["estimated_tokens"] < row["counted_tokens"]
    summarised = [r for r in rows if r["strategy"] == "llamaindex_chat_summary_memory"]
    for row in summarised:
        assert row["status"] == "violation" and row["estimated_tokens"] <= 1024
        (call,) = row["aux_calls"]
        assert call["purpose"] == "llamaindex/summary" and call["input_tokens"] <= 1024
    assert {r["status"] for r in rows if r["strategy"] == "llamaindex_memory_exact"} == {"ok"}


def test_an_over_budget_summary_in_a_sweep_is_a_budgeted_aux_violation(
    pytester: pytest.Pytester, fake_endpoint: FakeOpenAI, tmp_path: Path,
) -> None:
    """At 1024 the memory task's history leaves more than the budget to summarise, which
    LlamaIndex sends in one call: each cell is its strategy's aux violation, nothing sent."""
    pytester.runpytest(*sweep_args(
        fake_endpoint, tmp_path, "--budgets=1024", "--budgetbench-items=2",
        "--budgetbench-strategies=llamaindex_chat_summary_memory,truncation"))
    rows = rows_of(tmp_path)
    failed = [r for r in rows if r["strategy"] == "llamaindex_chat_summary_memory"]
    assert [r["status"] for r in failed] == ["error", "error"]
    assert all("made an auxiliary call over budget" in r["error"]
               and "(auxiliary call 'llamaindex/summary')" in r["error"] for r in failed)
    assert {r["status"] for r in rows if r["strategy"] == "truncation"} == {"ok"}
    assert len(fake_endpoint.requests) == 2  # the truncation cells' calls only
