"""ONE budgeted model call: count, check, send, record.

Every prompt the harness sends goes through :func:`budgeted_call`: a single-call cell's
one call, each call of an agent episode, and each auxiliary call a strategy makes. The
prompt is counted (or its count, made by the runner where a counter's failure is the
strategy's, is passed in), checked against the budget, and sent only if it fits; the
:class:`CallOutcome` is what each caller records (a row, an episode's call, a row's
auxiliary call). This module owns the budget check and the violation message, so the
three kinds of call cannot drift apart; :func:`fill_outcome` puts what a cell's calls
cost, and its status, on the cell's row. :func:`cut_by_server` reads a reply's own count
of the prompt: one far below the sweep's means the server cut the prompt, and the runner
makes that call an error rather than a reply to grade.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pytest_budgetbench.messages import Message, Tool
from pytest_budgetbench.model.chat import Completion
from pytest_budgetbench.records.rows import CellRow, Status
from pytest_budgetbench.tokens.base import TokenCounter


@dataclass(frozen=True)
class BudgetCheck:
    counted: int
    budget: int

    @property
    def fits(self) -> bool:
        return self.counted <= self.budget

    @property
    def excess(self) -> int:
        return max(0, self.counted - self.budget)


@dataclass(frozen=True)
class CallSite:
    """Who makes a call and where, as its violation message names them."""

    cell_id: str
    strategy: str
    """The strategy whose prompt it is (an auxiliary call's too: the strategy made it)."""
    call: int | None = None
    """The call's number in an agent episode (1-based); None for a cell's one call."""
    purpose: str | None = None
    """An auxiliary call's purpose; None for a call of the cell itself."""

    def where(self) -> str:
        if self.purpose is not None:
            return f"{self.cell_id} (auxiliary call '{self.purpose}')"
        if self.call is not None:
            return f"{self.cell_id} (call {self.call})"
        return self.cell_id


def violation_message(site: CallSite, check: BudgetCheck, counter: TokenCounter) -> str:
    """What went over budget, by how much, and as which tokenizer counted it."""
    kind = "exact" if counter.exact else "approx"
    return (
        f"cell {site.where()} would send {check.counted} prompt tokens "
        f"(budget {check.budget}, tokenizer {counter.name} {kind}); "
        f"strategy '{site.strategy}' exceeded by {check.excess}"
    )


@dataclass(frozen=True)
class CallOutcome:
    """A budgeted call's result: the count it was held to, and the reply or the violation.
    Its properties are named as an episode's ``CallRecord`` names them (:class:`SentCall`)."""

    counted_tokens: int
    completion: Completion | None = None
    """None when nothing was sent: the prompt was over budget, or the sweep is model-free."""
    violation: str = ""

    @property
    def server_prompt_tokens(self) -> int | None:
        return None if self.completion is None else self.completion.prompt_tokens

    @property
    def model_s(self) -> float:
        return 0.0 if self.completion is None else round(self.completion.latency_s, 4)

    @property
    def cached(self) -> bool | None:
        """None for a call not sent (as in an episode's ``CallRecord``)."""
        return None if self.completion is None else self.completion.cached

    @property
    def output_tokens(self) -> int | None:
        return None if self.completion is None else self.completion.completion_tokens


def cut_by_server(prompt: Sequence[Message], counted: int, completion: Completion,
                  tokens: TokenCounter, cause: str) -> str | None:
    """Why ``completion`` answers less than ``prompt`` (which ``tokens`` counted as
    ``counted``), or None: the server's ``usage.prompt_tokens`` below ``counted`` by more
    than the counter's slack (:meth:`~pytest_budgetbench.tokens.base.TokenCounter.
    cut_slack`: none for an exact counter) means the server evaluated a cut prompt.
    ``cause`` is the likely cause, as a clause (the server's context size)."""
    server = completion.prompt_tokens
    if server is None:
        return None
    slack = tokens.cut_slack(prompt, counted)
    if counted - server <= slack:
        return None
    kind = "exact" if tokens.exact else f"approx, slack {slack}"
    return (f"the server counted {server} prompt tokens where the sweep sent {counted} "
            f"(tokenizer {tokens.name} {kind}): it cut the prompt, so its reply answers a "
            f"prompt no strategy built and is neither graded nor cached; likely cause: {cause}")


def budgeted_call(
    site: CallSite,
    prompt: Sequence[Message],
    *,
    budget: int,
    tokens: TokenCounter,
    send: Callable[[], Completion] | None,
    tools: Sequence[Tool] | None = None,
    counted: int | None = None,
) -> CallOutcome:
    """Count ``prompt`` with ``tools`` (unless ``counted`` is given), check it against
    ``budget`` and, only if it fits, ``send()`` it; with no ``send`` (a model-free sweep)
    the outcome is the count alone. A prompt over budget is no error here: a cell or an
    episode records the violation, an auxiliary call raises it."""
    if counted is None:
        counted = tokens.count_messages(prompt, tools)
    check = BudgetCheck(counted, budget)
    if not check.fits:
        return CallOutcome(counted, violation=violation_message(site, check, tokens))
    return CallOutcome(counted, send() if send is not None else None)


class SentCall(Protocol):
    """What a row needs from each call of its cell (:class:`CallOutcome`, an episode's
    ``CallRecord``); ``cached`` is None for a call that was not sent."""

    @property
    def counted_tokens(self) -> int: ...

    @property
    def server_prompt_tokens(self) -> int | None: ...

    @property
    def model_s(self) -> float: ...

    @property
    def cached(self) -> bool | None: ...


def fill_outcome(row: CellRow, calls: Sequence[SentCall], violation: str = "") -> None:
    """The cell's status (a violation, else ok: grading follows) and what its calls cost:
    the model's seconds, whether every reply came from the cache, the server's prompt
    count and whether it matched ours. ``calls`` are every call the cell made, the one over
    budget included; none for a single-call cell whose prompt was over budget, whose row
    keeps those fields empty (an episode's row says 0 seconds, not cached)."""
    if violation:
        row.status, row.error = Status.VIOLATION, violation
    else:
        row.status = Status.OK
    if not calls:
        return
    sent = [call for call in calls if call.cached is not None]
    row.model_s = round(sum(call.model_s for call in sent), 4)
    row.cached = bool(sent) and all(call.cached for call in sent)
    server = [call.server_prompt_tokens for call in sent]
    row.server_prompt_tokens = max((n for n in server if n is not None), default=None)
    row.token_count_match = (
        None if not sent or any(n is None for n in server)
        else all(call.server_prompt_tokens == call.counted_tokens for call in sent))
