"""What ``llmlingua2`` costs per cell on this machine, without trained weights.

    .venv/bin/python benchmarks/bench_llmlingua2.py [--shape large|base|tiny] [--threads 2]
    .venv/bin/python benchmarks/bench_llmlingua2.py --model DIR   # trained weights

Goal (issue 17): the lead's plan for a sweep with llmlingua2 needs its cost: the model's
load (once per process) and the compression seconds per cell. There are no trained weights
here, so by default the classifier is random, at the layer shape of a trained release
(``large``: microsoft/llmlingua-2-xlm-roberta-large-meetingbank, 24 layers of 1024;
``base``: the bert-base-multilingual-cased release, 12 layers of 768) with a small
vocabulary, the tests' plus every word of the histories (so it cuts about as many tokens
as a release's tokenizer would, a little fewer): the compute per token is the release's,
the embedding lookup (all a larger vocabulary adds) is no part of it, and what it keeps is
noise, so only the seconds and the passes mean anything. Histories: the synthetic memory
task at ``--history-tokens`` (a memory item is ~4K tokens; 20K is a LoCoMo conversation's
size), one item, each budget in ``--budgets``, counted chars/4. torch runs on
``--threads`` threads (the sweep machine has 2 cores). The load average is printed first:
compare runs at load < 1 only.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from pathlib import Path

from pytest_budgetbench.messages import text_of
from pytest_budgetbench.strategies.base import StrategyContext
from pytest_budgetbench.strategies.llmlingua2 import LLMLingua2, model_directory
from pytest_budgetbench.tokens.approximate import ApproxCounter
from tests.strategies.test_llmlingua2 import build_tiny_model, build_tiny_xlm_roberta
from tests.strategy_helpers import memory_items

SHAPES = {  # builder, hidden, layers, heads
    "large": (build_tiny_xlm_roberta, 1024, 24, 16),
    "base": (build_tiny_model, 768, 12, 12),
    "tiny": (build_tiny_model, 32, 2, 2),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="large")
    parser.add_argument("--model", help="a directory of trained weights instead")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--history-tokens", default="4000,20000")
    parser.add_argument("--budgets", default="1024,2048")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    import torch

    torch.set_num_threads(args.threads)
    histories = {n: list(memory_items(1, n)[0].messages)
                 for n in map(int, args.history_tokens.split(","))}
    words = {w for messages in histories.values() for m in messages
             for w in re.findall(r"\w+", text_of(m))}
    with tempfile.TemporaryDirectory() as scratch:
        if args.model:
            directory, label = args.model, args.model
        else:
            build, hidden, layers, heads = SHAPES[args.shape]
            started = time.perf_counter()
            directory = str(build(Path(scratch), hidden=hidden, layers=layers, heads=heads,
                                  words=sorted(words)))
            label = f"random {args.shape} ({layers}x{hidden})"
            print(f"built {label} in {time.perf_counter() - started:.1f} s")
        directory = model_directory(directory)
        tokens = ApproxCounter()
        print(f"{'model':<28} {'history':>8} {'budget':>7} {'before':>7} {'after':>6} "
              f"{'passes':>6} {'compress s':>10} {'load s':>7} trimmed")
        for history_tokens, messages in histories.items():
            for budget in map(int, args.budgets.split(",")):
                context = StrategyContext(tokens=tokens,
                                          options={"llmlingua2_model": directory})
                strategy = LLMLingua2()
                strategy.reset(context)
                strategy.apply(messages, budget)
                info = context.info["llmlingua2"]
                print(f"{label:<28} {history_tokens:>8} {budget:>7} {info['tokens_before']:>7} "
                      f"{info['tokens_after']:>6} {info['passes']:>6} {info['seconds']:>10.2f} "
                      f"{info['load_seconds']:>7.2f} {info['trimmed']}")


if __name__ == "__main__":
    main()
