"""inspect_ai's compaction policies (``inspect-ai`` 0.3.285), run as shipped.

``inspect_compaction_trim``, ``inspect_compaction_edit`` and ``inspect_compaction_summary`` run
inspect's ``CompactionTrim``, ``CompactionEdit`` and ``CompactionSummary`` through inspect's
own handler, ``inspect_ai.model._compaction.compaction(strategy, prefix, tools, model)``,
whose ``compact_input(messages)`` its ``react`` agent calls before every model call: it
counts the conversation (its tools' tokens plus its messages'), and above the threshold runs
the strategy, up to four passes, until the count is under it; it keeps the compacted view
from call to call. Here one handler serves one item: the history is fed to it call by call
(after each user turn or step's tool results that the model answered), as it would have been
had inspect's agent lived through it, and the prompt is the handler's answer at the last call.
In an agent episode each of the runner's calls is the next call. ``prefix`` is what ``react``
passes: the system messages and inspect's "input" (the messages up to the first user turn),
which every policy keeps.

The budget. The cell's budget is the context window of the model inspect compacts for
(inspect reads it from ``set_model_info``; here ``budgetbench/window-<budget>``);
``inspect_threshold`` is inspect's ``threshold`` at its default, 0.9: compaction starts once
the conversation counts more than 90 % of the budget and aims under it. A threshold above 1
is an absolute token count, as in inspect. The other parameters, at inspect's defaults:

- every policy: ``inspect_memory`` (``memory``, true; acts only when a tool is named
  ``memory``);
- trim: ``inspect_preserve`` (``preserve``, 0.8: the share of the conversation each pass
  keeps; the system messages and the input are always kept, tool pairs are never split, and
  a trailing assistant message is dropped);
- edit: ``inspect_keep_thinking_turns`` (1), ``inspect_keep_tool_uses`` (3),
  ``inspect_keep_tool_inputs`` (true), ``inspect_exclude_tools`` (none, a comma list): older
  tool results become "(Tool result removed)"; nothing else is dropped;
- summary: ``inspect_instructions`` (none), ``inspect_prompt`` (inspect's own prompt, which
  needs an ``{addendums}`` field), and ``inspect_max_tokens``: the reply cap of the summary
  call. inspect sets none (the provider's default applies); the auxiliary model needs one,
  1024 by default. The summary replaces the whole conversation with one user message after
  the system messages and the input, as inspect does. Its call, the conversation plus
  inspect's ~1,260-token prompt, goes to the runner's auxiliary model (purpose
  ``inspect/summary``), held to the budget like every auxiliary call, so at a threshold of
  0.9 it fits only budgets of roughly 13,000 tokens or more: lower ``inspect_threshold`` to
  leave it room.

The one change to what inspect sends: the prompt always ends with the turn the model answers
now (the last user turn, or the last call with its results), as every strategy's does. Trim
and edit always keep it there; a summary made at the last call takes it in (inspect's agent
then continues from the summary alone), and here it follows the summary verbatim, its tokens
on top of inspect's count (``strategy_info.framework.reattached``: how many messages).

Counting. As shipped, inspect counts an OpenAI-compatible (open) model's prompts with its
``ModelAPI`` default: tiktoken's ``o200k_base`` on the messages' text joined by newlines,
plus 10 %, and the tools as their JSON; it has no other fallback (with no network and no
cached encoding it raises). The encoding ships, byte-identical (tiktoken's pinned sha256
checks it), in ``quicktok-v1``, which the ``inspect-ai`` extra installs; tiktoken itself
loads it. The ``_exact`` variants hand inspect the run's counter instead (a model whose
``count_tokens`` is the run's: a list of messages counted as a whole prompt with the cell's
tools). inspect also recalibrates its count with the input tokens the provider reports
after each generate; a strategy never sees those, so every count here is inspect's own, as
before an agent's first generate.

``strategy_info.framework`` records the threshold, the calls, compactions and summaries, and
``insufficient``: inspect's message when its strategy could not get under the threshold at
the last call (inspect raises there; the prompt is then its last pass, and the runner
records what it costs), with ``insufficient_calls`` counting such calls in the
conversation. That is why no variant is held to fitting by the conformance kit
(``fits_budget`` False): ``CompactionEdit`` never drops a message, trim and summary always
keep the input, trim drops no message of a conversation shorter than five, and inspect
stops after four passes.

What cannot cross: any content part other than text (refused, never dropped). Messages inspect
keeps are sent as given; those it rewrites come back through inspect's converter.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

from pytest_budgetbench.errors import Requirement, check_installed
from pytest_budgetbench.messages import Message
from pytest_budgetbench.options import Option, name_list, positive_int, rate, text
from pytest_budgetbench.strategies.base import Regime, StrategyContext
from pytest_budgetbench.strategies.frameworks._policy import FrameworkPolicy, refuse_parts

if TYPE_CHECKING:
    from inspect_ai.model import CompactionStrategy

    from pytest_budgetbench.strategies.frameworks._inspect_bridge import Conversation

BRIDGE = "pytest_budgetbench.strategies.frameworks._inspect_bridge"
INSPECT = Requirement("inspect_ai", "inspect-ai", "inspect-ai")
O200K = Requirement("quicktok", "inspect-ai", "quicktok-v1")
"""Ships tiktoken's o200k_base, which inspect counts with as shipped (tiktoken downloads it)."""


def threshold(raw: str) -> int | float:
    """inspect's ``threshold``: a share of the context window in (0, 1], or a token count."""
    if raw.isascii() and raw.isdigit() and int(raw) > 1:
        return int(raw)
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1:
        raise ValueError("must be a share of the window in (0, 1], e.g. 0.9, or a token count")
    return value


def boolean(raw: str) -> bool:
    if raw.lower() not in ("true", "false"):
        raise ValueError("must be true or false")
    return raw.lower() == "true"


def count(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()):
        raise ValueError("must be an integer >= 0")
    return int(raw)


def turns(raw: str) -> int | str:
    return "all" if raw.lower() == "all" else count(raw)


THRESHOLD = Option("inspect_threshold", "inspect's compaction threshold: a share of the "
                   "window (the cell's budget), or a token count", threshold, 0.9)
MEMORY = Option("inspect_memory", "inspect's memory: warn before compaction and clear saved "
                "content when a tool named 'memory' is present", boolean, True,
                metavar="true|false")
PRESERVE = Option("inspect_preserve", "CompactionTrim's preserve: the share of the "
                  "conversation each pass keeps", rate, 0.8)
KEEP_THINKING = Option("inspect_keep_thinking_turns", "CompactionEdit's keep_thinking_turns: "
                       "recent assistant turns that keep their reasoning (or all)", turns, 1)
KEEP_TOOL_USES = Option("inspect_keep_tool_uses", "CompactionEdit's keep_tool_uses: the most "
                        "recent tool results kept", count, 3)
KEEP_TOOL_INPUTS = Option("inspect_keep_tool_inputs", "CompactionEdit's keep_tool_inputs: keep "
                          "a cleared call's arguments", boolean, True, metavar="true|false")
EXCLUDE_TOOLS = Option("inspect_exclude_tools", "CompactionEdit's exclude_tools: tools whose "
                       "results are never cleared (comma list)", name_list, None)
INSTRUCTIONS = Option("inspect_instructions", "CompactionSummary's instructions, added to its "
                      "prompt", text, None)
PROMPT = Option("inspect_prompt", "CompactionSummary's prompt (replaces inspect's; "
                "'{addendums}' takes the instructions)", text, None)
MAX_TOKENS = Option("inspect_max_tokens", "the summary call's reply cap (inspect leaves it to "
                    "the provider)", positive_int, 1024)


class InspectCompaction(FrameworkPolicy):
    """One of inspect's compaction strategies behind the strategy interface."""

    framework = "inspect_ai"
    shipped_counter = "inspect-o200k_base+10%"
    regimes = frozenset({Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM})
    requires: ClassVar[tuple[Requirement, ...]] = (INSPECT, O200K)
    declared_options: ClassVar[tuple[Option, ...]] = (THRESHOLD, MEMORY)
    # Not even with the exact counter can inspect always reach its threshold (see the
    # module docstring): what it sends over the budget is what a sweep measures.
    sizes_prompt = False
    _conversation: Conversation | None = None

    def compaction_strategy(self) -> CompactionStrategy:
        """inspect's strategy object, with the cell's options."""
        raise NotImplementedError

    def reset(self, context: StrategyContext) -> None:
        super().reset(context)
        self._conversation = None

    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        refuse_parts(messages, self.framework)
        bridge = self._bridge()
        if not self.exact:
            bridge.ensure_o200k(self.context.work_dir)
        conversation = self._conversation
        if conversation is None or not conversation.extends(messages, budget):
            conversation = bridge.Conversation(self, self.compaction_strategy(), budget)
            self._conversation = conversation
        prompt, estimate = conversation.advance(messages)
        self.record_estimate(estimate, **conversation.notes())
        return prompt

    def _bridge(self) -> ModuleType:
        check_installed(self.requires, f"the {self.name} strategy")
        return importlib.import_module(BRIDGE)

    def _option(self, option: Option) -> Any:
        return self.context.options.get(option.key, option.default)

    def reply_tokens(self) -> int | None:
        """The reply cap of inspect's model calls (a summary's); None where it makes none."""
        return None


class InspectCompactionTrim(InspectCompaction):
    """inspect's ``CompactionTrim``: drops the oldest share of the conversation."""

    name = "inspect_compaction_trim"
    policy = "CompactionTrim"
    declared_options = (THRESHOLD, MEMORY, PRESERVE)

    def compaction_strategy(self) -> CompactionStrategy:
        from inspect_ai.model import CompactionTrim

        return CompactionTrim(threshold=self._option(THRESHOLD), memory=self._option(MEMORY),
                              preserve=self._option(PRESERVE))


class InspectCompactionTrimExact(InspectCompactionTrim):
    name = "inspect_compaction_trim_exact"
    exact = True
    requires = (INSPECT,)


class InspectCompactionEdit(InspectCompaction):
    """inspect's ``CompactionEdit``: clears older tool results and reasoning."""

    name = "inspect_compaction_edit"
    policy = "CompactionEdit"
    declared_options = (THRESHOLD, MEMORY, KEEP_THINKING, KEEP_TOOL_USES, KEEP_TOOL_INPUTS,
                        EXCLUDE_TOOLS)

    def compaction_strategy(self) -> CompactionStrategy:
        from inspect_ai.model import CompactionEdit

        excluded = self._option(EXCLUDE_TOOLS)
        return CompactionEdit(threshold=self._option(THRESHOLD), memory=self._option(MEMORY),
                              keep_thinking_turns=self._option(KEEP_THINKING),
                              keep_tool_uses=self._option(KEEP_TOOL_USES),
                              keep_tool_inputs=self._option(KEEP_TOOL_INPUTS),
                              exclude_tools=list(excluded) if excluded else None)


class InspectCompactionEditExact(InspectCompactionEdit):
    name = "inspect_compaction_edit_exact"
    exact = True
    requires = (INSPECT,)


class InspectCompactionSummary(InspectCompaction):
    """inspect's ``CompactionSummary``: the conversation replaced by a model's summary,
    written by the runner's auxiliary model."""

    name = "inspect_compaction_summary"
    policy = "CompactionSummary"
    regimes = frozenset({Regime.AUXILIARY_MODEL, Regime.RESET_PER_ITEM})
    declared_options = (THRESHOLD, MEMORY, INSTRUCTIONS, PROMPT, MAX_TOKENS)

    def compaction_strategy(self) -> CompactionStrategy:
        from inspect_ai.model import CompactionSummary

        return CompactionSummary(threshold=self._option(THRESHOLD), memory=self._option(MEMORY),
                                 instructions=self._option(INSTRUCTIONS),
                                 prompt=self._option(PROMPT))

    def reply_tokens(self) -> int | None:
        return int(self._option(MAX_TOKENS))


class InspectCompactionSummaryExact(InspectCompactionSummary):
    name = "inspect_compaction_summary_exact"
    exact = True
    requires = (INSPECT,)
