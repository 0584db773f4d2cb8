"""Synthetic run records, for tests, the benchmark and trying reports without a model.

Rows are CellRow records; qualities are 0/1 draws whose rate rises with the budget, and
reference strategies violate whenever their (long) prompt exceeds the budget.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_budgetbench.records import cells, prompts
from pytest_budgetbench.records.prompts import PromptRecord
from pytest_budgetbench.records.rows import CellRow, Status
from pytest_budgetbench.records.store import RunStore


def make_row(
    task: str = "memory",
    item_id: str = "i0",
    strategy: str = "truncation",
    budget: int = 1000,
    *,
    status: Status = Status.OK,
    quality: float | None = 1.0,
    repeat: int = 0,
    reference: bool = False,
    category: str | None = None,
    counted_tokens: int | None = None,
    run_id: str = "run",
    **extra: Any,
) -> dict[str, Any]:
    """One cells.jsonl row, as written; quality is dropped unless the cell was admitted.

    ``extra`` sets any other CellRow field; a name that is not one is a TypeError."""
    tokens = budget // 2 if counted_tokens is None else counted_tokens
    fields: dict[str, Any] = dict(
        run_id=run_id,
        cell_id=f"{task}-{item_id}-{strategy}-{budget}" + (f"-r{repeat}" if repeat else ""),
        task=task,
        item_id=item_id,
        category=category,
        strategy=strategy,
        reference=reference,
        budget=budget,
        repeat=repeat,
        status=status,
        counted_tokens=tokens if status != Status.ERROR else None,
        utilisation=round(tokens / budget, 4) if status != Status.ERROR else None,
        quality=quality if status == Status.OK else None,
        prediction="answer" if status == Status.OK else None,
        strategy_s=0.01 if status != Status.ERROR else None,
        model_s=0.5 if status == Status.OK else None,
        output_tokens=8 if status == Status.OK else None,
        aux_calls=[],
        aux_input_tokens=0,
        aux_output_tokens=0,
        aux_s=0.0,
        model="synthetic",
        error="" if status != Status.ERROR else "synthetic error",
        seed=0,
    )
    return CellRow(**(fields | extra)).record()


def synthetic_rows(**options: Any) -> list[dict[str, Any]]:
    """The rows of :func:`iter_synthetic_rows` as a list."""
    return list(iter_synthetic_rows(**options))


def iter_synthetic_rows(
    *,
    tasks: Sequence[str] = ("memory",),
    strategies: Sequence[str] = ("full_context", "truncation", "recency", "summary", "rag"),
    budgets: Sequence[int] = (256, 512, 1024, 2048, 4096),
    items: int = 100,
    repeats: int = 1,
    categories: Sequence[str] = ("single-hop", "multi-hop", "temporal"),
    reference: str = "full_context",
    seed: int = 0,
    run_id: str = "synthetic",
) -> Iterator[dict[str, Any]]:
    """Rows for every task x item x budget x strategy x repeat, one at a time (a million
    rows can be written without holding them)."""
    rng = random.Random(seed)
    top = max(budgets)
    for task in tasks:
        for index in range(items):
            item_id = f"item{index:05d}"
            category = categories[index % len(categories)] if categories else None
            length = rng.randint(top // 4, top)  # the item's full prompt length
            for budget in budgets:
                for s_index, strategy in enumerate(strategies):
                    is_ref = strategy == reference
                    for repeat in range(repeats):
                        tokens = length if is_ref else min(length, int(budget * 0.97))
                        fits = tokens <= budget and (is_ref or rng.random() > 0.02)
                        rate = 0.35 + 0.5 * min(tokens, top) / top - 0.03 * s_index
                        yield make_row(
                            task, item_id, strategy, budget,
                            status=Status.OK if fits else Status.VIOLATION,
                            quality=float(rng.random() < rate), repeat=repeat,
                            reference=is_ref, category=category,
                            counted_tokens=tokens if fits else budget + 1 + tokens % 50,
                            run_id=run_id, model_s=round(0.2 + tokens / 4000, 4),
                            strategy_s=round(0.001 + 0.01 * s_index * rng.random(), 5),
                        )


def write_run(run_dir: Path, rows: Iterable[Mapping[str, Any]], *, torn_tail: str = "") -> Path:
    """Write rows as a run directory's cells.jsonl (optionally ending in a torn line)."""
    cells.write_rows(run_dir, rows, torn_tail=torn_tail)
    return run_dir


def synthetic_history(item_id: str, turns: int = 8) -> list[dict[str, str]]:
    """An item's chat history: a system message, ``turns`` user/assistant turns, the question."""
    messages = [{"role": "system", "content": "You answer questions about the conversation."}]
    for turn in range(turns):
        role = "user" if turn % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"{item_id} turn {turn}: note {turn * 7}"})
    messages.append({"role": "user", "content": f"What was the note of {item_id} turn 3?"})
    return messages


def write_prompts(run_dir: Path, rows: Iterable[Mapping[str, Any]], *, turns: int = 8) -> Path:
    """A prompts.jsonl for the rows (as ``--budgetbench-audit=full`` writes it): a reference
    row's prompt is the whole history, another keeps the system message, the last turns
    (more at larger budgets) and the question."""
    path = RunStore(run_dir).prompts_path
    prompts.write_prompts(path, (_prompt(row, turns) for row in rows))
    return path


def _prompt(row: Mapping[str, Any], turns: int) -> PromptRecord:
    """A row's synthetic prompt (see :func:`write_prompts`)."""
    history = synthetic_history(str(row["item_id"]), turns)
    if not row.get("reference"):
        keep = max(1, min(turns, int(row["budget"]) // 512))
        history = [history[0], *history[-1 - keep:]]
    return PromptRecord(str(row["cell_id"]), row.get("prompt_sha256") or "", history)
