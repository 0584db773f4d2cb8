"""What a strategy is: ``(messages, budget) -> messages``, plus what it declares.

A strategy never counts for enforcement and never calls a model on its own: the runner
hands it a :class:`StrategyContext` at :meth:`Strategy.reset`, whose token counter,
auxiliary model and embedder are the runner's, so that every auxiliary call is budgeted,
cached and recorded.

A minimal strategy::

    class KeepLastTwo(Strategy):
        name = "keep_last_two"
        regimes = frozenset({Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM})

        def apply(self, messages, budget):
            head, history, query = split_ends(messages)
            return head + history[-2:] + query
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pytest_budgetbench.errors import Requirement
from pytest_budgetbench.messages import Message, Schema, Tool
from pytest_budgetbench.options import Option

if TYPE_CHECKING:
    from pytest_budgetbench.tokens.base import TokenCounter


class Regime(enum.StrEnum):
    """Where and how a strategy can be deployed; a row records every regime declared."""

    LOCAL_ONLY = "local-only"
    AUXILIARY_MODEL = "auxiliary-model-assisted"
    HOSTED = "hosted"
    PERSISTENT_STATEFUL = "persistent-stateful"
    RESET_PER_ITEM = "reset-per-item"


class AuxiliaryModel(Protocol):
    """A chat model a strategy may call (e.g. to summarise). The runner budgets and records it."""

    def complete(self, messages: Sequence[Message], *, max_tokens: int, purpose: str,
                 schema: Schema | None = None) -> str:
        """Return the reply text. Raises BudgetExceeded when the prompt exceeds the cell budget.

        ``schema``: the JSON schema the reply should follow, sent to an endpoint that can
        constrain its reply to it (:mod:`~pytest_budgetbench.model.structured`); the reply may
        still not follow it (no such endpoint, or cut at ``max_tokens``), so the caller
        parses it as leniently as without."""
        ...


class Embedder(Protocol):
    """Text embeddings, batched and cached by content hash across the whole run."""

    name: str

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


@dataclass
class StrategyContext:
    """The runner's services for one item."""

    tokens: TokenCounter
    item_id: str = ""
    seed: int = 0
    aux: AuxiliaryModel | None = None
    aux_models: dict[str, AuxiliaryModel] = field(default_factory=dict)
    """Further auxiliary models by name (``--budgetbench-aux-models``, e.g. small, medium,
    large); each is budgeted and recorded like ``aux``."""
    embedder_factory: Callable[[], Embedder] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    """The values of the options the strategy declares (``Strategy.declared_options``), parsed, at
    their defaults where not given, plus ``embedding_model`` (the run's embedder)."""
    info: dict[str, Any] = field(default_factory=dict)
    """What the strategy wants on the cell's row (JSON-serialisable), as ``strategy_info``:
    e.g. the tiers it chose and its modules' compute seconds."""
    work_dir: Path | None = None
    """Where the strategy may write files in a run (``<run>/strategy-files``, created by
    the strategy when it needs it); None outside a run. Nothing else may be written."""
    tools: list[Tool] = field(default_factory=list)
    """The tools sent with the model call this prompt is for (an agentic task's), which
    the counter already includes in its whole-prompt counts; empty for a single-call task."""
    estimated_tokens: int | None = None
    """The strategy's own count of the prompt its last ``apply`` returned, where it trims
    by a counter of its own (a framework's policy): the runner clears it before each
    ``apply`` and records it on the row as ``estimated_tokens``, beside its exact count."""
    aux_failures: int = 0
    """Auxiliary replies the strategy could not use (not JSON, wrong keys), counted by the
    strategy as it goes on without them; the row records it as ``aux_failures``."""
    _embedder: Embedder | None = field(default=None, repr=False)

    @property
    def embedder(self) -> Embedder:
        """The run's embedder, created on first use."""
        if self._embedder is None:
            if not callable(self.embedder_factory):
                raise RuntimeError("this run has no embedder configured")
            self._embedder = self.embedder_factory()
        assert self._embedder is not None
        return self._embedder


class Strategy(ABC):
    """Turns a task's chat history into a prompt that should fit ``budget`` tokens."""

    name: ClassVar[str] = ""
    regimes: ClassVar[frozenset[Regime]] = frozenset({Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM})
    reference: ClassVar[bool] = False
    """A reference strategy (like full_context) is exempt from the budget: its cells over
    budget are xfailed, and its violations are still recorded."""
    fits_budget: ClassVar[bool] = True
    """Whether it means to fit the budget by the run's counter. False for a policy that
    trims by a counter of its own (a framework's, as shipped), whose overflow is what a
    sweep measures: the conformance kit does not hold it to fitting, and its violations
    are recorded like any other's."""
    declared_options: ClassVar[tuple[Option, ...]] = ()
    """What the strategy reads from ``context.options``, given as
    ``--budgetbench-strategy-options=KEY=VALUE`` (or an option's own flag); a key no
    strategy of the sweep declares, or a bad value, is a usage error before collection."""
    requires: ClassVar[tuple[Requirement, ...]] = ()
    """Optional packages the strategy imports (e.g. ``Requirement("chromadb",
    "retrieval")``): one that is missing stops a sweep that selects the strategy before
    any cell, naming the extra."""
    uses_embedder: ClassVar[bool] = False
    """Whether the strategy calls ``context.embedder``: the run's embedding model and
    backend then add their packages to :attr:`requires`."""
    handles_tools: ClassVar[bool] = False
    """Whether the strategy takes a history with tool calls (an agent's trajectory) and
    never breaks a call from its results (``messages.check_tool_pairs``). A sweep refuses a
    task with tools x a strategy without it before any cell
    (:func:`~pytest_budgetbench.strategies.tool_refusal`)."""

    context: StrategyContext

    def reset(self, context: StrategyContext) -> None:
        """Forget per-item state and take the runner's services for the next item."""
        self.context = context

    @abstractmethod
    def apply(self, messages: Sequence[Message], budget: int) -> list[Message]:
        """Return the prompt to send. Must not mutate ``messages``."""

    @classmethod
    def regime_label(cls) -> str:
        return ",".join(sorted(r.value for r in cls.regimes))
