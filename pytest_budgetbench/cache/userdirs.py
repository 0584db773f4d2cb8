"""Where budgetbench keeps what outlives a run on this machine."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache(*parts: str) -> Path:
    """``$XDG_CACHE_HOME/pytest-budgetbench/<parts>`` (``~/.cache`` when unset): fetched
    models, ONNX exports, the BFCL package's scratch directory."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base, "pytest-budgetbench", *parts)
