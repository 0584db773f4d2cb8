"""The ``hf:<dir or tokenizer.json>`` counter: a transformers tokenizer with its chat template."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_budgetbench.errors import TokenizerError
from pytest_budgetbench.messages import (
    Message,
    Tool,
    as_sent,
    text_of,
)
from pytest_budgetbench.tokens.base import TokenCounter
from pytest_budgetbench.tokens.content import framed_estimate, image_cost


class HFCounter(TokenCounter):
    """A transformers tokenizer loaded from a local directory or a tokenizer.json file."""

    exact = True

    def __init__(self, source: str, chat_template: str | None = None) -> None:
        """``chat_template`` renders instead of the tokenizer's own (a tokenizer.json
        alone has none)."""
        super().__init__()
        from pytest_budgetbench.errors import require

        require("transformers", "hf", "--budgetbench-tokenizer=hf:")
        import transformers

        path = Path(source)
        try:
            self._tok: Any
            if path.is_file():
                self._tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path))
            else:
                self._tok = transformers.AutoTokenizer.from_pretrained(
                    source, local_files_only=True
                )
        except Exception as exc:  # transformers raises many types for a bad path
            raise TokenizerError(
                f"cannot load tokenizer 'hf:{source}': {exc}. "
                "Pass a local directory with tokenizer files, or a tokenizer.json path."
            ) from exc
        self.name = f"hf:{path.name or source}"
        if chat_template:
            self._tok.chat_template = chat_template
        # Without a chat template we can only count content: say so in every row.
        self.exact = bool(getattr(self._tok, "chat_template", None))

    def _count_prompt(self, messages: Sequence[Message],
                      tools: Sequence[Tool] | None = None) -> int:
        if not self.exact:
            return framed_estimate(messages, self._count_text, tools)
        # Content as text; every other key (tool_calls, tool_call_id, name) as sent.
        ids: Any = self._tok.apply_chat_template(
            [{**m, "content": text_of(m)} if "content" in m else m for m in as_sent(messages)],
            tools=list(tools) if tools else None,
            tokenize=True,
            add_generation_prompt=True,
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return len(ids) + image_cost(messages)

    def _count_text(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False))
