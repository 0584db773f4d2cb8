"""The auxiliary model as a strategy sees it: every call budgeted and recorded on the cell's
row. (Not ``aux.py``: AUX is a reserved file name on Windows.)"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_budgetbench.budget import BudgetCheck, TokenCounter, enforce
from pytest_budgetbench.messages import Message
from pytest_budgetbench.model import ChatBackend


@dataclass
class AuxCall:
    purpose: str
    input_tokens: int
    output_tokens: int | None
    latency_s: float
    model: str = "aux"
    cached: bool = False


class RecordedAuxModel:
    """The model as a strategy sees it: each call's prompt is held to the cell's budget,
    and each call is recorded on the cell's row.

    Several named models (``--budgetbench-aux-models``) of one cell share one ``calls``
    list, so the row lists every auxiliary call in order.
    """

    def __init__(
        self,
        chat: ChatBackend,
        tokens: TokenCounter,
        budget: int,
        cell_id: str,
        *,
        label: str = "aux",
        calls: list[AuxCall] | None = None,
    ) -> None:
        self._chat = chat
        self._tokens = tokens
        self._budget = budget
        self._cell_id = cell_id
        self.label = label
        self.calls: list[AuxCall] = [] if calls is None else calls

    def complete(self, messages: Sequence[Message], *, max_tokens: int, purpose: str) -> str:
        counted = self._tokens.count_messages(messages)
        check = BudgetCheck(counted, self._budget)
        enforce(f"{self._cell_id} (auxiliary call '{purpose}')", purpose, check, self._tokens)
        completion = self._chat.complete(messages, max_tokens=max_tokens)
        self.calls.append(AuxCall(purpose, counted, completion.completion_tokens,
                                  completion.latency_s, self.label, completion.cached))
        return completion.text

    def sibling(self, chat: ChatBackend, label: str) -> RecordedAuxModel:
        """Another model for the same cell, recorded in the same list."""
        return RecordedAuxModel(chat, self._tokens, self._budget, self._cell_id,
                                label=label, calls=self.calls)
