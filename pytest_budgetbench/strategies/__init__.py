"""Strategy registry: built-in names, the ``budgetbench.strategies`` entry points, and
``module:attr`` references to a user's own class."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.registry import Registry
from pytest_budgetbench.strategies.base import (
    AuxiliaryModel,
    Embedder,
    Regime,
    Strategy,
    StrategyContext,
)
from pytest_budgetbench.strategies.plain import plain_strategy_class
from pytest_budgetbench.sweep.cells import clean_part

__all__ = [
    "REGISTRY",
    "AuxiliaryModel",
    "Embedder",
    "Regime",
    "Strategy",
    "StrategyContext",
    "load_strategy",
    "strategy_classes",
    "tool_refusal",
    "tool_strategies",
]

_FRAMEWORKS = "pytest_budgetbench.strategies.frameworks"

# Built-ins resolve without entry-point metadata, so a source checkout works too.
REGISTRY: Registry[Strategy] = Registry(
    kind="strategy",
    option="--budgetbench-strategies",
    group="budgetbench.strategies",
    base=Strategy,
    builtin={
        "full_context": "pytest_budgetbench.strategies.full_context:FullContext",
        "truncation": "pytest_budgetbench.strategies.truncation:Truncation",
        "pair_truncation": "pytest_budgetbench.strategies.pair_truncation:PairTruncation",
        "observation_masking":
            "pytest_budgetbench.strategies.observation_masking:ObservationMasking",
        "tool_result_clearing":
            "pytest_budgetbench.strategies.tool_result_clearing:ToolResultClearing",
        "condenser": "pytest_budgetbench.strategies.condenser:Condenser",
        "rag": "pytest_budgetbench.strategies.rag:Rag",
        "lean_retrieval": "pytest_budgetbench.strategies.lean_retrieval:LeanRetrieval",
        "summary_buffer": "pytest_budgetbench.strategies.summary_buffer:SummaryBuffer",
        "checkpoint_context": "pytest_budgetbench.strategies.checkpoint_context:CheckpointContext",
        "compression": "pytest_budgetbench.strategies.compression:Compression",
        "memgpt": "pytest_budgetbench.strategies.memgpt:MemGPT",
        "mem0": "pytest_budgetbench.strategies.mem0:Mem0",
        "amem": "pytest_budgetbench.strategies.amem:AMem",
        "llmlingua2": "pytest_budgetbench.strategies.llmlingua2:LLMLingua2",
        "budgetmem_low": "pytest_budgetbench.strategies.budgetmem.strategy:BudgetMemLow",
        "budgetmem_mid": "pytest_budgetbench.strategies.budgetmem.strategy:BudgetMemMid",
        "budgetmem_high": "pytest_budgetbench.strategies.budgetmem.strategy:BudgetMemHigh",
        "budgetmem_random": "pytest_budgetbench.strategies.budgetmem.strategy:BudgetMemRandom",
        # The frameworks' own memory policies, each as shipped and _exact (frameworks/).
        "langchain_trim_messages": f"{_FRAMEWORKS}.langchain:TrimMessages",
        "langchain_trim_messages_exact": f"{_FRAMEWORKS}.langchain:TrimMessagesExact",
        "langchain_summarization": f"{_FRAMEWORKS}.langchain:Summarization",
        "langchain_summarization_exact": f"{_FRAMEWORKS}.langchain:SummarizationExact",
        "langchain_clear_tool_uses": f"{_FRAMEWORKS}.langchain:ClearToolUses",
        "langchain_clear_tool_uses_exact": f"{_FRAMEWORKS}.langchain:ClearToolUsesExact",
        "inspect_compaction_trim": f"{_FRAMEWORKS}.inspect_ai:InspectCompactionTrim",
        "inspect_compaction_trim_exact": f"{_FRAMEWORKS}.inspect_ai:InspectCompactionTrimExact",
        "inspect_compaction_edit": f"{_FRAMEWORKS}.inspect_ai:InspectCompactionEdit",
        "inspect_compaction_edit_exact": f"{_FRAMEWORKS}.inspect_ai:InspectCompactionEditExact",
        "inspect_compaction_summary": f"{_FRAMEWORKS}.inspect_ai:InspectCompactionSummary",
        "inspect_compaction_summary_exact":
            f"{_FRAMEWORKS}.inspect_ai:InspectCompactionSummaryExact",
        "llamaindex_memory": f"{_FRAMEWORKS}.llamaindex:LlamaIndexMemory",
        "llamaindex_memory_exact": f"{_FRAMEWORKS}.llamaindex:LlamaIndexMemoryExact",
        "llamaindex_chat_memory_buffer": f"{_FRAMEWORKS}.llamaindex:LlamaIndexChatMemoryBuffer",
        "llamaindex_chat_memory_buffer_exact":
            f"{_FRAMEWORKS}.llamaindex:LlamaIndexChatMemoryBufferExact",
        "llamaindex_chat_summary_memory": f"{_FRAMEWORKS}.llamaindex:LlamaIndexChatSummaryMemory",
        "llamaindex_chat_summary_memory_exact":
            f"{_FRAMEWORKS}.llamaindex:LlamaIndexChatSummaryMemoryExact",
        "openhands_llm_summarizing": f"{_FRAMEWORKS}.openhands:OpenHandsLLMSummarizing",
        "openhands_llm_summarizing_exact":
            f"{_FRAMEWORKS}.openhands:OpenHandsLLMSummarizingExact",
        "openhands_no_op": f"{_FRAMEWORKS}.openhands:OpenHandsNoOp",
    },
    # budgetmem@0.1: the router trained with lambda 0.1 (one class per lambda).
    patterns={"budgetmem@": "pytest_budgetbench.strategies.budgetmem.router:router_strategy"},
    # A function (messages, budget) -> messages, or an object with __call__, is one too.
    adapt=plain_strategy_class,
    accepts="a callable (messages, budget) -> messages",
)


def strategy_classes(specs: Iterable[str]) -> dict[str, type[Strategy]]:
    """Each strategy spec's class, in order; its ``name`` is what its cells and rows carry.
    Two specs that resolve to one name, or to names that read as one in cell ids
    (``keep-ends`` and ``keep_ends``), or a class without a name, are a ConfigError."""
    classes: dict[str, type[Strategy]] = {}
    spec_of: dict[str, str] = {}
    name_of: dict[str, str] = {}  # each name's readable id part -> the name
    for spec in specs:
        cls = REGISTRY.resolve(spec)
        name = getattr(cls, "name", "")
        if not isinstance(name, str) or not name:
            raise ConfigError(
                f"strategy '{spec}' has no name: set its class attribute 'name' to the name "
                "its cells and rows should carry"
            )
        if name in spec_of:
            raise ConfigError(
                f"--budgetbench-strategies: '{spec_of[name]}' and '{spec}' are both named "
                f"'{name}', so their cells and rows would mix; give one another name"
            )
        other = name_of.setdefault(clean_part(name), name)
        if other != name:
            raise ConfigError(
                f"--budgetbench-strategies: '{spec_of[other]}' and '{spec}' are named "
                f"'{other}' and '{name}', which read as one ('{clean_part(name)}') in cell "
                "ids; give one another name"
            )
        classes[spec], spec_of[name] = cls, spec
    return classes


def reference_flags(classes: Mapping[str, type[Strategy]]) -> dict[str, bool]:
    """Each strategy's name and whether it is a reference, in order: what decides which
    gates judge it (:func:`~pytest_budgetbench.reports.gates.verdicts.gate_specs`)."""
    return {cls.name: bool(cls.reference) for cls in classes.values()}


def load_strategy(spec: str) -> Strategy:
    strategy = REGISTRY.resolve(spec)()
    if not strategy.name:
        raise ConfigError(f"strategy '{spec}' has no name: set the class attribute 'name'")
    return strategy


def tool_strategies() -> list[str]:
    """The built-in strategies that handle tool calls (``Strategy.handles_tools``), sorted;
    one that cannot be imported here is left out."""
    names = []
    for name in REGISTRY.builtin:
        try:
            if REGISTRY.resolve(name).handles_tools:
                names.append(name)
        except ConfigError:
            continue
    return sorted(names)


def tool_refusal(strategy: type[Strategy] | Strategy) -> str | None:
    """Why ``strategy`` cannot run a task whose items carry tools, in one line, or None
    when it handles tool calls."""
    if strategy.handles_tools:
        return None
    return (
        f"strategy '{strategy.name}' does not handle tool calls (it may send a call "
        "without its result; one that never does declares handles_tools = True); "
        f"use one of: {', '.join(tool_strategies())}"
    )
