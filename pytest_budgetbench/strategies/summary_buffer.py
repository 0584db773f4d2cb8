"""``summary_buffer``: the newest history verbatim, and a model-written summary of the rest.

As LangChain's ``ConversationSummaryBufferMemory``: when the prompt does not fit, a share
of the room left after the system messages and the query (``SUMMARY_SHARE``, at most
``SUMMARY_MAX_TOKENS``) is reserved for a summary; the newest whole messages that fit the
rest are kept, and the older, evicted messages are summarised by the auxiliary model
(``context.aux``, purpose ``"summary"``). The summary goes in one system message right
after the leading system messages.

Every summary call's own prompt fits the cell budget: evicted text longer than one call
can read is cut at line and sentence ends into pieces, each summarised (map, purpose
``"summary"``), and the partial summaries are merged (reduce, purpose
``"summary-reduce"``), level after level until one remains. Each call may write at most a
third of what it reads, so every level shrinks the text.

Once the summary is written, the history is packed newest first into whatever the real
summary left free (a short summary gives recent history more room), so the prompt ends
close to the budget; the oldest kept message may be cut, marked with ``[…]``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_budgetbench.messages import Message, text_of
from pytest_budgetbench.strategies._chunking import chunk_history, fit_prefix, newest_first
from pytest_budgetbench.strategies._packing import HistoryStrategy, Packer
from pytest_budgetbench.strategies.base import AuxiliaryModel, Regime

SUMMARY_SHARE = 0.25
SUMMARY_MAX_TOKENS = 512
SUMMARY_MIN_TOKENS = 16  # below this a summary cannot say anything useful: skip it
MAX_LEVELS = 8  # reduce levels; each shrinks the text at least threefold
SUMMARY_HEADER = "Summary of the earlier conversation:\n"
MAP_INSTRUCTION = (
    "Summarise this excerpt of a conversation between a user and an assistant. Keep every "
    "fact the user states about themselves (names, places, dates, preferences, changes), "
    "with its date if one is given. Be brief. No preamble."
)
REDUCE_INSTRUCTION = (
    "Merge these partial summaries of one conversation, oldest first, into one brief "
    "summary. Keep every fact about the user; when facts conflict, keep the later one. "
    "No preamble."
)


def summary_message(summary: str) -> Message:
    return {"role": "system", "content": SUMMARY_HEADER + summary}


class SummaryBuffer(HistoryStrategy):
    """Recent history verbatim plus an auxiliary-model summary of the evicted history."""

    name = "summary_buffer"
    regimes = frozenset({Regime.AUXILIARY_MODEL, Regime.RESET_PER_ITEM})

    def fit(self, head: list[Message], history: list[Message], query: list[Message],
            room: int, budget: int) -> list[Message]:
        tokens = self.context.tokens
        recent = newest_first(tokens, history)
        fixed: list[Message] = []
        summary_tokens = min(SUMMARY_MAX_TOKENS, int(room * SUMMARY_SHARE))
        if summary_tokens >= SUMMARY_MIN_TOKENS:
            reserve = summary_tokens + tokens.count_message(summary_message(""))
            evicted = history[: self._first_kept(history, room - reserve)]
            summary = self.summarise(evicted, summary_tokens, budget) if evicted else ""
            fixed = [summary_message(summary)] if summary else []
        return Packer(tokens, history).pack(head, query, recent, budget, fixed)

    def _first_kept(self, history: Sequence[Message], available: int) -> int:
        """Index of the oldest message of the newest run of whole messages that fits."""
        start = len(history)
        while start > 0:
            cost = self.context.tokens.count_message(history[start - 1])
            if cost > available:
                break
            available -= cost
            start -= 1
        return start

    # -- summarising ---------------------------------------------------------------------
    def summarise(self, evicted: Sequence[Message], target: int, budget: int) -> str:
        """A summary of ``evicted`` of at most ``target`` tokens, each call within budget."""
        text = "\n".join(
            f"{m.get('role')}: {text_of(m)}" for m in evicted if text_of(m).strip()
        )
        instruction, purpose = MAP_INSTRUCTION, "summary"
        for _level in range(MAX_LEVELS):
            if not text.strip():
                return ""
            limit = self._input_limit(instruction, budget)
            reply_tokens = min(target, limit // 3)
            if reply_tokens < SUMMARY_MIN_TOKENS // 2:
                return ""  # the budget cannot hold a summary call worth making
            parts = self._parts(text, limit)
            partials = [self._call(instruction, part, reply_tokens, purpose, budget)
                        for part in parts]
            text = "\n".join(p for p in partials if p)
            if len(parts) == 1:
                break
            instruction, purpose = REDUCE_INSTRUCTION, "summary-reduce"
        return self._clip(text, target)

    def _input_limit(self, instruction: str, budget: int) -> int:
        """Tokens of text one call may read: the budget less the call's own framing."""
        empty = [{"role": "system", "content": instruction}, {"role": "user", "content": ""}]
        return budget - self.context.tokens.count_messages(empty)

    def _parts(self, text: str, limit: int) -> list[str]:
        chunks = chunk_history(self.context.tokens, [{"role": "user", "content": text}], limit)
        return [text[c.start : c.end] for c in chunks]

    def _call(self, instruction: str, text: str, reply_tokens: int, purpose: str,
              budget: int) -> str:
        aux = self._aux()
        tokens = self.context.tokens
        prompt = [{"role": "system", "content": instruction}, {"role": "user", "content": text}]
        counted = tokens.count_messages(prompt)
        while counted > budget and text:
            # Piece counts are of plain text; joining can cost a token or two more.
            limit = tokens.count_text(text) - (counted - budget)
            stop = fit_prefix(tokens, text, 0, len(text), limit)
            text = text[:stop]
            prompt[1] = {"role": "user", "content": text}
            counted = tokens.count_messages(prompt)
        if not text:
            return ""
        reply = aux.complete(prompt, max_tokens=reply_tokens, purpose=purpose)
        return self._clip(reply.strip(), reply_tokens)

    def _clip(self, text: str, limit: int) -> str:
        """``text`` cut after a word to ``limit`` tokens (a reply may overrun max_tokens
        when the counter is not the model's tokenizer)."""
        stop = fit_prefix(self.context.tokens, text, 0, len(text), limit)
        return text[:stop].strip()

    def _aux(self) -> AuxiliaryModel:
        if self.context.aux is None:
            raise RuntimeError("summary_buffer needs the runner's auxiliary model (context.aux)")
        return self.context.aux
