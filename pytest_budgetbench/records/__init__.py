"""Every on-disk format of a run, each with the one module that writes and reads it.

``pytest_budgetbench.records.CellRow`` is the typed row of ``cells.jsonl`` (public: a
``budget_cell`` test reads it)."""

from __future__ import annotations

from pytest_budgetbench.records.store import CellRow, Status

__all__ = ["CellRow", "Status"]
