"""Every on-disk format of a run, each with the one module that writes and reads it::

    rows        cells.jsonl's row: CellRow, Status, the schema version and field lists
    episodes    episodes.jsonl's record: EpisodeRecord, CallRecord, Ended
    prompts     prompts.jsonl's record: PromptRecord
    definition  run.json's definition block, and how two runs' definitions compare
    store       the run directory: RunStore, every file and folder name of a run, run.json,
                and the JSON-lines writer and readers

``pytest_budgetbench.records.CellRow`` is the typed row of ``cells.jsonl`` (public: a
``budget_cell`` test reads it)."""

from __future__ import annotations

from pytest_budgetbench.records.rows import CellRow, Status

__all__ = ["CellRow", "Status"]
