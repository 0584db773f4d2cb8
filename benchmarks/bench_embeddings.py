"""MiniLM's speed per embedding backend against the machine's matmul limit, and whether the
fast backends rank retrieval candidates as torch does.

    .venv/bin/python benchmarks/bench_embeddings.py [--runs 5] [--longbench-docs 6]

Goal (issue 15): the default backend is the fastest whose cosine rankings match torch's.
Speed: the 64-token chunks ``rag`` embeds (LongBench v2 documents cut by the project's own
chunker, chars/4 token estimate), encoded whole by each backend and thread count; the
median of ``--runs`` passes after a warm-up, in MiniLM word-pieces per second (special
tokens included, cut at 256 as the model does). The limit: float32 GEMM throughput of this
machine (torch, shapes of MiniLM's feed-forward layers) divided by MiniLM's
~21 MFLOP a token; int8 (VNNI) can go past it.

Agreement, against torch's vectors: each question of LongBench v2 against its own
document's chunks, each LoCoMo question against its conversation's turns, and each memory
task question against its history's chunks. top-1: the same best candidate; top-5: the
overlap of the five best, averaged; cosine lost: torch's score of its own best candidate
minus torch's score of the backend's best (0 when they agree). Nothing is cached between
backends: each computes every vector itself. The load average is printed at start:
compare runs at load < 1 only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pytest_budgetbench.embeddings import BACKENDS, DEFAULT_MODEL, load_encoder, resolve_model_path
from pytest_budgetbench.messages import text_of
from pytest_budgetbench.strategies._chunking import ADAPTIVE_BASE, chunk_history
from pytest_budgetbench.tasks.base import TaskOptions
from pytest_budgetbench.tasks.memory import MemoryTask
from pytest_budgetbench.tokens.approximate import ApproxCounter

DATA = Path("/work/shared/data")
LONGBENCH = DATA / "longbench_v2" / "longbench_v2_dev12.json"
LOCOMO = DATA / "locomo" / "locomo_conv26_conv30.json"
CONFIGS = [(backend, threads) for backend in ("torch", "onnx", "onnx-int8")
           for threads in (1, 2)]
# MiniLM-L6: 6 layers of 4 x 384^2 attention and 2 x 384 x 1536 feed-forward weights, 2 FLOP
# a weight and token, plus attention scores at a typical chunk length (~100 word-pieces).
FLOP_PER_TOKEN = 6 * 2 * (4 * 384 * 384 + 2 * 384 * 1536) + 6 * 4 * 100 * 384


@dataclass
class Ranking:
    """Queries and the candidates each one ranks (indices into ``texts``)."""

    label: str
    texts: list[str]
    queries: list[tuple[int, list[int]]]  # (query text index, candidate text indices)


def chunks(text: str) -> list[str]:
    pieces = chunk_history(ApproxCounter(), [{"role": "user", "content": text}], ADAPTIVE_BASE)
    return [text[p.start : p.end] for p in pieces]


def longbench(docs: int) -> Ranking:
    texts: list[str] = []
    queries: list[tuple[int, list[int]]] = []
    for record in json.loads(LONGBENCH.read_text(encoding="utf-8"))[:docs]:
        start = len(texts)
        texts.extend(chunks(record["context"]))
        candidates = list(range(start, len(texts)))
        texts.append(record["question"])
        queries.append((len(texts) - 1, candidates))
    return Ranking(f"LongBench v2 ({docs} docs)", texts, queries)


def locomo() -> Ranking:
    texts: list[str] = []
    queries: list[tuple[int, list[int]]] = []
    for sample in json.loads(LOCOMO.read_text(encoding="utf-8")):
        start = len(texts)
        conversation = sample["conversation"]
        for key, turns in conversation.items():
            if key.startswith("session_") and isinstance(turns, list):
                texts.extend(f"{t['speaker']}: {t['text']}" for t in turns)
        candidates = list(range(start, len(texts)))
        for qa in sample["qa"]:
            texts.append(qa["question"])
            queries.append((len(texts) - 1, candidates))
    return Ranking("LoCoMo (turns)", texts, queries)


def memory(items: int) -> Ranking:
    texts: list[str] = []
    queries: list[tuple[int, list[int]]] = []
    task = MemoryTask(TaskOptions(items=items, extra={"history_tokens": 4000}))
    for item in task.load():
        history, question = list(item.messages[:-1]), text_of(item.messages[-1])
        start = len(texts)
        for message in history:
            texts.extend(chunks(text_of(message)))
        candidates = list(range(start, len(texts)))
        texts.append(question)
        queries.append((len(texts) - 1, candidates))
    return Ranking(f"memory ({items} items)", texts, queries)


def word_pieces(texts: Sequence[str]) -> int:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(resolve_model_path(DEFAULT_MODEL)) /
                                        "tokenizer.json"))
    tokenizer.enable_truncation(256)
    tokenizer.no_padding()
    return sum(len(e.ids) for e in tokenizer.encode_batch(list(texts)))


def gemm_gflops(threads: int) -> float:
    """float32 GEMM at MiniLM's feed-forward shape (a 4096-token batch), best of 5."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(4096, 384), torch.randn(384, 1536)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(10):
            torch.mm(a, b)
        best = min(best, (time.perf_counter() - started) / 10)
    return 2 * 4096 * 384 * 1536 / best / 1e9


def speed(texts: list[str], runs: int) -> dict[tuple[str, int], float]:
    tokens = word_pieces(texts)
    print(f"\nSpeed: {len(texts)} chunks, {tokens} word-pieces, median of {runs} runs\n")
    roof = {threads: gemm_gflops(threads) for threads in (1, 2)}
    print("| backend | threads | word-pieces/s | ms per chunk | vs fp32 GEMM limit | load |")
    print("|---|---:|---:|---:|---:|---:|")
    rates: dict[tuple[str, int], float] = {}
    for backend, threads in CONFIGS:
        encoder = load_encoder(DEFAULT_MODEL, backend, threads)
        encoder.encode(texts[:32])  # warm-up: kernels, allocations
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            encoder.encode(texts)
            times.append(time.perf_counter() - started)
        seconds = statistics.median(times)
        rates[(backend, threads)] = rate = tokens / seconds
        limit = roof[threads] * 1e9 / FLOP_PER_TOKEN
        print(f"| {backend} | {threads} | {rate:,.0f} | {1000 * seconds / len(texts):.2f} | "
              f"{rate / limit:.0%} of {limit:,.0f} | {os.getloadavg()[0]:.2f} |", flush=True)
    print(f"\nfp32 GEMM: {roof[1]:.0f} GFLOP/s on 1 thread, {roof[2]:.0f} on 2; MiniLM "
          f"~{FLOP_PER_TOKEN / 1e6:.1f} MFLOP per word-piece")
    return rates


def top(vectors: Any, query: int, candidates: list[int], k: int) -> list[int]:
    scores = vectors[candidates] @ vectors[query]
    order = np.argsort(-scores, kind="stable")[:k]
    return [candidates[i] for i in order]


def agreement(rankings: list[Ranking], threads: int) -> None:
    print("\nRanking agreement with torch (cosine over each query's candidates)\n")
    print("| data | queries | candidates/query | backend | top-1 same | top-5 overlap | "
          "min cosine to torch | torch cosine lost at top-1 |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    encoders = {backend: load_encoder(DEFAULT_MODEL, backend, threads) for backend in BACKENDS}
    for ranking in rankings:
        vectors = {backend: np.asarray(encoder.encode(ranking.texts))
                   for backend, encoder in encoders.items()}
        reference = vectors["torch"]
        sizes = statistics.mean(len(c) for _q, c in ranking.queries)
        for backend in (b for b in BACKENDS if b != "torch"):
            same1, overlap5, lost = [], [], []
            for query, candidates in ranking.queries:
                want = top(reference, query, candidates, 5)
                got = top(vectors[backend], query, candidates, 5)
                same1.append(want[0] == got[0])
                overlap5.append(len(set(want) & set(got)) / len(want))
                # How much worse, by torch's own cosine, the backend's best candidate is.
                lost.append(float(reference[want[0]] @ reference[query]
                                  - reference[got[0]] @ reference[query]))
            cosine = float(np.min(np.sum(reference * vectors[backend], axis=1)))
            print(f"| {ranking.label} | {len(ranking.queries)} | {sizes:.0f} | {backend} | "
                  f"{statistics.mean(same1):.1%} | {statistics.mean(overlap5):.1%} | "
                  f"{cosine:.4f} | {statistics.mean(lost):.4f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed passes per backend")
    parser.add_argument("--speed-docs", type=int, default=2,
                        help="LongBench v2 documents whose chunks are timed")
    parser.add_argument("--longbench-docs", type=int, default=12,
                        help="LongBench v2 documents for the agreement table")
    parser.add_argument("--memory-items", type=int, default=10)
    parser.add_argument("--skip-agreement", action="store_true")
    parser.add_argument("--skip-speed", action="store_true")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"({len(os.sched_getaffinity(0))} cores)")
    if not args.skip_speed:
        timed = longbench(args.speed_docs)
        speed([timed.texts[i] for c in timed.queries for i in c[1]], args.runs)
    if not args.skip_agreement:
        agreement([longbench(args.longbench_docs), locomo(), memory(args.memory_items)],
                  threads=len(os.sched_getaffinity(0)))


if __name__ == "__main__":
    main()
