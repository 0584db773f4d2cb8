"""An agent sweep's wall time against its physical limit on the embedded model.

    .venv/bin/python benchmarks/bench_agent_limit.py RUN_DIR --wall SECONDS [--model NAME]
    .venv/bin/python benchmarks/bench_agent_limit.py --runs 3 [--items 4] [--budgets 1024]

The first form judges a sweep already run (its wall time as pytest printed it). The
second runs a small teacher-forced agent_lookup sweep (three strategies, the response
cache off) that many times, each in a fresh project, and gives each run's ratio and their
median.

Measures, on this machine, the embedded server's prefill rate (prompt tokens a second, on
cold prompts of about 2,000 tokens that share nothing, ``max_tokens=1``) and its decode
rate (output tokens a second past the prefill, on a short prompt), three times each, and
takes the medians. Then, from the run's ``episodes.jsonl``, the sweep's physical limit:
over every call the run sent (the response cache answered none of them), the prompt
tokens it does not share with the previous call of its episode (``counted_tokens -
prefix_tokens``) at the prefill rate, plus its output tokens at the decode rate; and the
ratio of the sweep's wall time (``--wall``, as pytest printed it) to that limit.

Beside it, two measures that need no separate rate measurement (which moves with the
machine's state: 61 to 112 tokens/s of prefill on this machine within a day) and that
count what cold-prompt rates leave out (prefill and decode slow down as the context grows:
BFCL's 5k-token prompts decode at about 14 tokens/s, a short one at 20 to 29), both read
from the per-request timings llama.cpp logs in the run's ``server.log``:

- the same limit at the run's own rates, the prompt and output tokens a second the server
  logged over the run's requests;
- the server's own account, its prompt-eval and eval seconds summed, and the wall time
  over that (what the harness adds to the model's own time).

Goal (issue 33): at most 1.3. Measure on a quiet machine (load < 1): nothing else running.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pytest_budgetbench.embedded_server.models import DEFAULT_MODEL, embedded_model
from pytest_budgetbench.embedded_server.process import EmbeddedServer
from pytest_budgetbench.model.chat import ChatModel
from pytest_budgetbench.records.store import RunStore
from pytest_budgetbench.tasks.needle import filler_sentence

PREFILL_TOKENS = 2000
REPEATS = 3


def filler(seed: int, tokens: int) -> str:
    import random

    rng = random.Random(seed)
    sentences = [f"Prompt {seed}."]
    while sum(len(s) for s in sentences) < tokens * 4:
        sentences.append(filler_sentence(rng))
    return " ".join(sentences)


def rates(chat: ChatModel) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s), medians of REPEATS cold measurements."""
    prefill, decode = [], []
    for seed in range(REPEATS):
        prompt = [{"role": "user", "content": filler(seed, PREFILL_TOKENS)}]
        started = time.perf_counter()
        reply = chat.complete(prompt, max_tokens=1)
        prefill.append((reply.prompt_tokens or 0) / (time.perf_counter() - started))
        short = [{"role": "user", "content": f"Count from {seed} to 400, one number a line."}]
        started = time.perf_counter()
        reply = chat.complete(short, max_tokens=200)
        elapsed = time.perf_counter() - started - (reply.prompt_tokens or 0) / prefill[-1]
        decode.append((reply.completion_tokens or 0) / elapsed)
    return statistics.median(prefill), statistics.median(decode)


@dataclass
class SentTokens:
    """What the physical limit counts of a run's episodes: the calls it sent (the response
    cache answered none of them), the prompt tokens each did not share with its episode's
    previous call, and their output tokens."""

    calls: int
    unshared: int
    output: int

    def seconds(self, prefill_rate: float, decode_rate: float) -> float:
        """The physical limit at these rates (tokens a second)."""
        return self.unshared / prefill_rate + self.output / decode_rate


def sent_tokens(run_dir: Path) -> SentTokens:
    calls = unshared = output = 0
    for episode in RunStore(run_dir).episodes().values():
        for call in episode.calls:
            if call.cached is not False:  # not sent, or answered by the response cache
                continue
            calls += 1
            unshared += call.counted_tokens - (call.prefix_tokens or 0)
            output += call.output_tokens or 0
    return SentTokens(calls, unshared, output)


SWEEP = ("--budgetbench-tasks=agent_lookup", "--budgetbench-episodes=teacher-forced",
         "--budgetbench-strategies=full_context,observation_masking,pair_truncation",
         "--budgetbench-cache=off", "--budgetbench-report=off", "-p", "no:cacheprovider",
         "-q")


def run_sweep(project: Path, items: int, budgets: str) -> tuple[Path, float]:
    """Run the small sweep on the default model in a fresh project: (its run directory,
    its wall seconds)."""
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    command = [sys.executable, "-m", "pytest", f"--budgets={budgets}",
               f"--budgetbench-items={items}", *SWEEP]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=project, stdout=subprocess.DEVNULL)
    if done.returncode not in (0, 1):  # 1: a cell over budget failed, as a violation does
        raise SystemExit(f"the sweep in {project} exited {done.returncode}")
    wall = time.perf_counter() - started
    (cells,) = project.glob("reports/*/cells.jsonl")
    return cells.parent, wall


def measure_rates(model_name: str) -> tuple[float, float]:
    model = embedded_model(model_name)
    with tempfile.TemporaryDirectory() as scratch:
        server = EmbeddedServer(n_ctx=8192, threads=None, model_name=model.name,
                                log_path=Path(scratch) / "server.log")
        server.start()
        try:
            return rates(ChatModel(server.base_url, model.alias))
        finally:
            server.stop()


SERVER_TIMING = re.compile(r"llama_perf_context_print:\s+(prompt eval|eval) time =\s+([\d.]+) ms"
                           r" /\s+(\d+) (?:tokens|runs)")


@dataclass
class ServerAccount:
    """The embedded server's own account of a run, from the timings it logs per request."""

    prompt_s: float
    prompt_tokens: int
    """Prompt tokens it evaluated, i.e. did not reuse from its last prompt."""
    eval_s: float
    eval_tokens: int

    @property
    def seconds(self) -> float:
        return self.prompt_s + self.eval_s

    @property
    def rates(self) -> tuple[float, float]:
        """(prefill, decode) tokens a second over the run's own requests."""
        return self.prompt_tokens / self.prompt_s, self.eval_tokens / self.eval_s


def server_account(run_dir: Path) -> ServerAccount | None:
    """None: no server log (an endpoint of your own), or one without timings."""
    path = RunStore(run_dir).server_log_path
    if not path.is_file():
        return None
    seconds = {"prompt eval": 0.0, "eval": 0.0}
    tokens = {"prompt eval": 0, "eval": 0}
    for kind, ms, count in SERVER_TIMING.findall(path.read_text(errors="replace")):
        seconds[kind] += float(ms) / 1000
        tokens[kind] += int(count)
    if not seconds["prompt eval"] or not seconds["eval"]:
        return None
    return ServerAccount(seconds["prompt eval"], tokens["prompt eval"], seconds["eval"],
                         tokens["eval"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, nargs="?")
    parser.add_argument("--wall", type=float, help="the sweep's wall seconds")
    parser.add_argument("--runs", type=int, help="run the small sweep this many times")
    parser.add_argument("--items", type=int, default=4)
    parser.add_argument("--budgets", default="1024")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="RUN_DIR's model")
    args = parser.parse_args()
    if (args.run_dir is None) == (args.runs is None) or (args.run_dir and args.wall is None):
        parser.error("give RUN_DIR --wall SECONDS, or --runs N")
    if args.runs and args.model != DEFAULT_MODEL:
        parser.error("--runs sweeps the default model")
    load1, load5, _ = os.getloadavg()
    print(f"cores {os.cpu_count()}, load average at start {load1:.2f} (1 min), "
          f"{load5:.2f} (5 min)")
    with tempfile.TemporaryDirectory() as projects:
        runs = ([(args.run_dir, args.wall)] if args.run_dir else
                [run_sweep(Path(projects, str(i)), args.items, args.budgets)
                 for i in range(args.runs)])
        prefill_rate, decode_rate = measure_rates(args.model)
        print(f"prefill {prefill_rate:.0f} tokens/s, decode {decode_rate:.1f} tokens/s "
              f"(medians of {REPEATS})")
        ratios, over_own_rates, over_server = [], [], []
        for run_dir, wall in runs:
            sent = sent_tokens(run_dir)
            seconds = sent.seconds(prefill_rate, decode_rate)
            ratios.append(wall / seconds)
            print(f"{sent.calls} calls sent: {sent.unshared} prompt tokens not shared with the "
                  f"episode's previous call, {sent.output} output tokens; physical limit "
                  f"{seconds:.0f} s; wall {wall:.0f} s; wall / limit {ratios[-1]:.2f}")
            account = server_account(run_dir)
            if account is None:
                continue
            own_prefill, own_decode = account.rates
            own_seconds = sent.seconds(own_prefill, own_decode)
            over_own_rates.append(wall / own_seconds)
            over_server.append(wall / account.seconds)
            print(f"  at the run's own rates (its server log: prefill {own_prefill:.0f}, "
                  f"decode {own_decode:.1f} tokens/s): physical limit "
                  f"{own_seconds:.0f} s; wall / limit {over_own_rates[-1]:.2f}")
            print(f"  the server's own timings: {account.seconds:.0f} s of prompt eval and "
                  f"eval ({account.prompt_tokens} prompt tokens evaluated); "
                  f"wall / server {over_server[-1]:.2f}")
    print(f"load average at end {os.getloadavg()[0]:.2f}; medians of {len(ratios)} (goal <= 1.3):")
    print(f"  wall / limit at the measured rates: {statistics.median(ratios):.2f}")
    if over_server:
        print(f"  wall / limit at the run's own rates: {statistics.median(over_own_rates):.2f}")
        print(f"  wall / the server's own timings: {statistics.median(over_server):.2f}")


if __name__ == "__main__":
    main()
