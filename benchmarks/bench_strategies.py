"""Time the memory strategies per cell, count the embeddings they compute, and measure how
much of the budget their prompts use, with the embedded model's exact token counter.

    .venv/bin/python benchmarks/bench_strategies.py [--items 3] [--longbench PATH]

Data: the synthetic memory task (4,000-token histories) and one LongBench v2 document of
about 50K characters, cut into ~512-token user messages followed by its question. Each
strategy first runs alone, on an embedding cache emptied before each item (its own cost
per item, all budgets together), then all run together on one cache shared by strategies
and items (what a sweep computes). summary_buffer uses an instant fake auxiliary model
(the first words of its prompt), so its times exclude the model's summarisation time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_budgetbench.budget import GGUFCounter, TokenCounter
from pytest_budgetbench.embeddings import SentenceTransformerEmbedder, make_embedder
from pytest_budgetbench.messages import Message, text_of
from pytest_budgetbench.model import embedded_gguf_path
from pytest_budgetbench.strategies import load_strategy
from pytest_budgetbench.strategies._chunking import chunk_history
from pytest_budgetbench.strategies.base import StrategyContext
from pytest_budgetbench.tasks.base import TaskOptions
from pytest_budgetbench.tasks.memory import MemoryTask

STRATEGIES = ("truncation", "rag", "lean_retrieval", "checkpoint_context", "compression",
              "summary_buffer")
BUDGETS = (512, 2048, 8192)
LONGBENCH = Path("/work/shared/data/longbench_v2/longbench_v2_dev12.json")
LONG_DOC_INDEX = 10  # Single-Document QA (literary), 51,623 characters
DOC_MESSAGE_TOKENS = 512


class InstantAux:
    """A fake auxiliary model: replies at once with the first ``max_tokens`` words."""

    def complete(self, messages: Sequence[Message], *, max_tokens: int, purpose: str) -> str:
        return " ".join(text_of(messages[-1]).split()[:max_tokens])


@dataclass
class Tally:
    times: dict[int, list[float]] = field(default_factory=lambda: {b: [] for b in BUDGETS})
    utilisation: list[float] = field(default_factory=list)
    embeddings: list[int] = field(default_factory=list)


def memory_items(count: int) -> list[tuple[str, list[Message]]]:
    items = MemoryTask(TaskOptions(items=count, extra={"history_tokens": 4000})).load()
    return [(f"memory/{item.item_id}", list(item.messages)) for item in items]


def long_document(path: Path, tokens: TokenCounter) -> list[tuple[str, list[Message]]]:
    record = json.loads(path.read_text(encoding="utf-8"))[LONG_DOC_INDEX]
    context = record["context"]
    pieces = chunk_history(tokens, [{"role": "user", "content": context}], DOC_MESSAGE_TOKENS)
    choices = "\n".join(f"({c}) {record['choice_' + c]}" for c in "ABCD")
    messages: list[Message] = [
        {"role": "system", "content": "Read the document, then answer the question with "
                                      "the letter of the correct choice."},
        *({"role": "user", "content": context[p.start : p.end]} for p in pieces),
        {"role": "user", "content": f"{record['question']}\n{choices}\nAnswer: A, B, C or D?"},
    ]
    return [(f"longbench/{record['_id']}", messages)]


def run_cells(
    name: str,
    items: Sequence[tuple[str, list[Message]]],
    tokens: TokenCounter,
    embedder: SentenceTransformerEmbedder,
    tally: Tally,
    cold: bool = True,
) -> None:
    """Every budget of every item; ``cold`` empties the embedding cache before each item."""
    strategy = load_strategy(name)
    for item_id, messages in items:
        if cold:
            embedder.clear_cache()
        before = embedder.computed
        full = tokens.count_messages(messages)
        for budget in BUDGETS:
            context = StrategyContext(
                tokens=tokens, item_id=item_id, aux=InstantAux(),
                embedder_factory=lambda: embedder, options={"rag_chunk": "adaptive"},
            )
            started = time.perf_counter()
            strategy.reset(context)
            prompt = strategy.apply(messages, budget)
            tally.times[budget].append(time.perf_counter() - started)
            counted = tokens.count_messages(prompt)
            assert counted <= budget, f"{name} {item_id} {budget}: {counted}"
            if full > budget:
                tally.utilisation.append(counted / budget)
        tally.embeddings.append(embedder.computed - before)


def warm_up(embedder: SentenceTransformerEmbedder) -> None:
    """Load torch kernels and chromadb before anything is timed."""
    from pytest_budgetbench.strategies.rag import STORE

    embedder.embed(["warm-up sentence"])
    STORE.client()
    embedder.clear_cache()


def report(datasets: dict[str, list[tuple[str, list[Message]]]], gguf: Path) -> None:
    embedder = make_embedder("all-MiniLM-L6-v2")
    warm_up(embedder)
    print("| strategy | data | ms/cell @512 | @2048 | @8192 | embeddings/item | utilisation |")
    print("|---|---|---:|---:|---:|---:|---:|")
    overall: dict[str, list[float]] = {}
    for name in STRATEGIES:
        for label, items in datasets.items():
            tally = Tally()
            run_cells(name, items, GGUFCounter(gguf), embedder, tally)  # cold token caches
            times = [1000 * statistics.mean(tally.times[b]) for b in BUDGETS]
            util = statistics.mean(tally.utilisation) if tally.utilisation else float("nan")
            overall.setdefault(name, []).extend(tally.utilisation)
            shown = f"{name}*" if name == "summary_buffer" else name
            print(f"| {shown} | {label} | {times[0]:.0f} | {times[1]:.0f} | {times[2]:.0f} | "
                  f"{statistics.mean(tally.embeddings):.0f} | {util:.3f} |")
    print("\n* fake instant auxiliary model: summarisation time excluded.")
    print("\nMean utilisation (cells whose full prompt exceeds the budget):")
    for name, values in overall.items():
        print(f"  {name:<20} {statistics.mean(values):.3f} over {len(values)} cells")
    shared(datasets, gguf, embedder)


def shared(
    datasets: dict[str, list[tuple[str, list[Message]]]],
    gguf: Path,
    embedder: SentenceTransformerEmbedder,
) -> None:
    """All strategies over one cache, in the runner's order (item, budget, strategy)."""
    print("\nAll strategies on one shared cache (as in a sweep):")
    for label, items in datasets.items():
        embedder.clear_cache()
        tokens = GGUFCounter(gguf)
        started = time.perf_counter()
        for name in STRATEGIES:
            run_cells(name, items, tokens, embedder, Tally(), cold=False)
        seconds = time.perf_counter() - started
        print(f"  {label:<10} {embedder.computed / len(items):6.0f} embeddings computed/item, "
              f"{embedder.requested / len(items):6.0f} requested/item, "
              f"{seconds / (len(items) * len(BUDGETS) * len(STRATEGIES)) * 1000:6.0f} ms/cell")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=3, help="memory items")
    parser.add_argument("--longbench", type=Path, default=LONGBENCH)
    args = parser.parse_args()
    gguf = embedded_gguf_path()
    datasets = {"memory": memory_items(args.items),
                "longdoc": long_document(args.longbench, GGUFCounter(gguf))}
    for label, items in datasets.items():
        sizes = [GGUFCounter(gguf).count_messages(m) for _id, m in items]
        print(f"{label}: {len(items)} item(s), {statistics.mean(sizes):.0f} prompt tokens each")
    report(datasets, gguf)


if __name__ == "__main__":
    main()
