"""The auxiliary model as a strategy sees it: every call budgeted and recorded on the cell's
row. (Not ``aux.py``: AUX is a reserved file name on Windows.)

A call that expects JSON passes its :class:`~pytest_budgetbench.model.structured.Schema`: the
endpoint gets it as a ``response_format`` in the form it takes (found once per endpoint),
or not at all where it takes none or ``--budgetbench-structured-output=off``; the row's
call says which form went (``response_format``). The budget counts the messages only: a
``response_format`` is no prompt token (llama.cpp makes it a grammar over the sampling)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_budgetbench.engine.calls import CallSite, budgeted_call
from pytest_budgetbench.errors import BudgetExceeded
from pytest_budgetbench.messages import Message
from pytest_budgetbench.model.chat import ChatBackend, Completion
from pytest_budgetbench.model.structured import Schema, StructuredOutput
from pytest_budgetbench.tokens.base import TokenCounter


@dataclass
class AuxCall:
    purpose: str
    input_tokens: int
    output_tokens: int | None
    latency_s: float
    model: str = "aux"
    cached: bool = False
    response_format: str | None = None
    """The form the call's schema was sent in (``json_schema``, ``json_object``), ``none``
    when the endpoint takes none or it is off; None for a call without a schema."""

    def row(self) -> dict[str, Any]:
        """The call as the row lists it (a call without a schema as it always was)."""
        fields = dict(vars(self))
        if self.response_format is None:
            del fields["response_format"]
        return fields


class RecordedAuxModel:
    """The model as a strategy sees it: each call's prompt is held to the cell's budget,
    and each call is recorded on the cell's row.

    Several named models (``--budgetbench-aux-models``) of one cell share one ``calls``
    list, so the row lists every auxiliary call in order. ``structured`` says how this
    model's endpoint takes a schema (None: it is never sent one). ``strategy`` is the
    strategy that makes the calls: a violation names it beside the call's purpose.
    """

    def __init__(
        self,
        chat: ChatBackend,
        tokens: TokenCounter,
        budget: int,
        cell_id: str,
        *,
        strategy: str,
        label: str = "aux",
        calls: list[AuxCall] | None = None,
        structured: StructuredOutput | None = None,
    ) -> None:
        self._chat = chat
        self._tokens = tokens
        self._budget = budget
        self._cell_id = cell_id
        self._strategy = strategy
        self.label = label
        self.calls: list[AuxCall] = [] if calls is None else calls
        self.structured = structured

    def complete(self, messages: Sequence[Message], *, max_tokens: int, purpose: str,
                 schema: Schema | None = None) -> str:
        form: str | None = None
        if schema is not None:
            form = self.structured.form if self.structured else "none"

        def send() -> Completion:
            sent = (self.structured.response_format(schema)
                    if schema is not None and self.structured else None)
            if sent is None:  # a backend that knows no response_format is called as before
                return self._chat.complete(messages, max_tokens=max_tokens)
            return self._chat.complete(messages, max_tokens=max_tokens, response_format=sent)

        site = CallSite(self._cell_id, self._strategy, purpose=purpose)
        outcome = budgeted_call(site, messages, budget=self._budget, tokens=self._tokens,
                                send=send)
        if outcome.completion is None:  # a strategy's call over budget is its own failure
            raise BudgetExceeded(outcome.violation)
        completion = outcome.completion
        self.calls.append(AuxCall(purpose, outcome.counted_tokens, completion.completion_tokens,
                                  completion.latency_s, self.label, completion.cached, form))
        return completion.text

    def sibling(self, chat: ChatBackend, label: str,
                structured: StructuredOutput | None = None) -> RecordedAuxModel:
        """Another model for the same cell, recorded in the same list."""
        return RecordedAuxModel(chat, self._tokens, self._budget, self._cell_id,
                                strategy=self._strategy, label=label, calls=self.calls,
                                structured=structured)
