"""Every on-disk format of a run, each with the one module that names, writes and reads it
(every other module goes through it; ``tests/test_records.py`` greps for strays)::

    cells       cells.jsonl: appending, streaming and writing rows
    rows        cells.jsonl's row: CellRow, Status, the schema version and field lists
    prompts     prompts.jsonl and its record: PromptRecord
    run_json    run.json and its record: RunInfo
    replicas    replicas.jsonl and its record: ReplicaEvent
    episodes    episodes.jsonl and its record: EpisodeRecord, CallRecord, Ended
    safe_budgets  safe_budgets.jsonl (a budget search's answers): SafeBudgetRecord
    definition  run.json's definition block, and how two runs' definitions compare
    store       the run directory: RunStore, its paths, the other names of a run
    jsonl       the locked JSON-lines writer and the one line parser the owners share

``pytest_budgetbench.records.CellRow`` is the typed row of ``cells.jsonl`` (public: a
``budget_cell`` test reads it)."""

from __future__ import annotations

from pytest_budgetbench.records.rows import CellRow, Status

__all__ = ["CellRow", "Status"]
