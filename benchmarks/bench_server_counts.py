"""The runner's counts through a real llama-server, against the server's own usage.prompt_tokens.

    .venv/bin/python benchmarks/bench_server_counts.py [--llama-server BIN] [--out DIR]
        [--model smollm2] [--memory-items 10] [--memory-budgets 1024,2048,4096,8192]
        [--bfcl-items 4] [--tokenizer auto]

Starts llama.cpp's ``llama-server`` (the one .ci/install builds beside the venv's python, or
``--llama-server``) serving an embedded GGUF (the default, or ``--model``) with ``--jinja``,
through the plugin's
own :class:`EmbeddedServer` (its pinned flags), and points two sweeps at it as a team's
endpoint with ``--budgetbench-tokenizer=auto``, so the counter is the one ``auto`` finds
for a llama-server (its chat template applied by ``/apply-template``, then ``/tokenize``):

1. the default sweep's prompts: ``memory`` with ``full_context``, ``truncation`` and ``rag``
   at 1024, 2048, 4096 and 8192 tokens (``--memory-budgets``);
2. BFCL multi-turn prompts with tools: ``bfcl_multi_turn_base``, teacher-forced, with
   ``full_context`` at 8192 and ``truncation`` at 4096 (every step's prompt carries the
   tool schemas and the earlier steps' tool calls and results).

For every call sent (single-call cells from cells.jsonl, each call of an episode from
episodes.jsonl) it compares the runner's count with the server's ``usage.prompt_tokens``,
and prints per sweep the prompts compared, those with tools, the differences and the
counter the runs recorded (each row's ``tokenizer``, ``tokenizer_exact``, and run.json's
server record). Counts do not depend on the machine's load; the wall time does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_budgetbench.embedded_server.process import (
    LLAMA_SERVER_ENV,
    EmbeddedServer,
)

SWEEPS: dict[str, list[str]] = {
    "default sweep (memory)": [
        "--budgetbench-tasks=memory", "--budgetbench-strategies=full_context,truncation,rag"],
    "BFCL with tools (teacher-forced)": [
        "--budgetbench-tasks=bfcl_multi_turn_base", "--budgets=4096,8192",
        "--budgetbench-strategies=full_context,truncation",
        "--budgetbench-episodes=teacher-forced"],
}


def compared_calls(run_dir: Path) -> Iterator[tuple[int, int | None, bool]]:
    """``(our count, the server's, whether the prompt had tools)`` of every call sent."""
    episodes = run_dir / "episodes.jsonl"
    if episodes.exists():
        for line in episodes.read_text().splitlines():
            record = json.loads(line)
            for call in record["calls"]:
                if call.get("server_prompt_tokens") is not None:
                    yield (call["counted_tokens"], call["server_prompt_tokens"],
                           bool(record.get("tools")))
        return
    for line in (run_dir / "cells.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("server_prompt_tokens") is not None:
            yield row["counted_tokens"], row["server_prompt_tokens"], False


def run_sweep(name: str, options: list[str], server: EmbeddedServer, out: Path,
              items: int, tokenizer: str) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--budgetbench-only", "-q", "-p", "no:cacheprovider",
         *options, f"--budgetbench-items={items}", f"--budgetbench-out={out}",
         f"--budgetbench-endpoint={server.base_url}", f"--budgetbench-model={server.model.alias}",
         f"--budgetbench-tokenizer={tokenizer}", "--budgetbench-report=off"],
        capture_output=True, text=True, check=False, cwd=out)
    (run_dir,) = [path for path in out.iterdir() if (path / "cells.jsonl").exists()]
    calls = list(compared_calls(run_dir))
    rows = [json.loads(line) for line in (run_dir / "cells.jsonl").read_text().splitlines()]
    run = json.loads((run_dir / "run.json").read_text())
    return {
        "sweep": name, "exit": done.returncode, "wall_s": round(time.perf_counter() - started),
        "prompts": len(calls), "with_tools": sum(tools for *_, tools in calls),
        "differences": [(ours, theirs) for ours, theirs, _ in calls if ours != theirs],
        "tokenizers": sorted({f"{r.get('tokenizer')} exact={r.get('tokenizer_exact')}"
                              for r in rows}),
        "server": run.get("server"),
        "errors": sorted({str(r.get("error"))[:160] for r in rows if r["status"] == "error"}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", help="the binary (default: beside this python)")
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a scratch dir)")
    parser.add_argument("--model", help="an embedded model's name (default: the default)")
    parser.add_argument("--memory-items", type=int, default=10)
    parser.add_argument("--memory-budgets", default="1024,2048,4096,8192")
    parser.add_argument("--bfcl-items", type=int, default=4)
    parser.add_argument("--tokenizer", default="auto")
    args = parser.parse_args()
    if args.llama_server:
        os.environ[LLAMA_SERVER_ENV] = args.llama_server
    load1, load5, _ = os.getloadavg()
    print(f"load average at start {load1:.2f} (1 min), {load5:.2f} (5 min)")
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch)
        # The largest budget, an agent call's answer and headroom (as embedded_context does).
        server = EmbeddedServer(n_ctx=8192 + 512, threads=None, model_name=args.model,
                                log_path=out / "llama-server.log")
        if server.program is None:
            raise SystemExit("no llama-server: bash .ci/install builds it, or pass "
                             "--llama-server BIN")
        server.start()
        try:
            extra: tuple[list[str], ...] = ([f"--budgets={args.memory_budgets}"], [])
            for (name, options), items, more in zip(SWEEPS.items(),
                                                    (args.memory_items, args.bfcl_items), extra,
                                                    strict=True):
                if not items:  # --memory-items 0 or --bfcl-items 0: that sweep is left out
                    continue
                result = run_sweep(name, [*options, *more], server, out / name.split()[0],
                                   items, args.tokenizer)
                print(json.dumps(result), flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
