"""llama.cpp's vocabulary-only load of a GGUF file: its tokenizer, chat template and
metadata without its weights, for the ``gguf:`` token counter
(:class:`~pytest_budgetbench.tokens.gguf.GGUFCounter`) and the check of an embedded
model's metadata (:mod:`~pytest_budgetbench.embedded_server.models`)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any


def vocab_only_llama(path: Path) -> Any:
    """llama.cpp's vocabulary-only load of a GGUF (a ``llama_cpp.Llama``), its log kept out
    of the user's output.

    llama-cpp-python prints llama.cpp's log to ``sys.stderr`` from a callback, and even with
    ``verbose=False`` a vocabulary-only load warns that it has no training context; a failed
    load raises ``ValueError`` with what llama.cpp said added."""
    from llama_cpp import Llama

    log = io.StringIO()
    try:
        with contextlib.redirect_stderr(log):
            return Llama(model_path=str(path), vocab_only=True, verbose=False)
    except ValueError as exc:
        said = log.getvalue().strip().splitlines()
        raise ValueError(f"{exc}: {said[-1]}" if said else str(exc)) from None
