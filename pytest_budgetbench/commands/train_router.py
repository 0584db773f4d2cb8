"""``budgetbench train-router``: its options, and the run that wires the real pipeline
(through :mod:`pytest_budgetbench.engine.wiring`, as the plugin does) into BudgetMem's PPO
training (:mod:`~pytest_budgetbench.strategies.budgetmem.ppo`, on the episodes of
:mod:`~pytest_budgetbench.commands.train_environment`).

A console command, beside :mod:`pytest_budgetbench.commands.cli` at the top layer: it builds the
runner, so it may import the wiring; BudgetMem's own modules never do. Options the plugin
also has take their parser and default from ``config.OPTIONS``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_budgetbench import embedded_server
from pytest_budgetbench.commands.arguments import argument_type, from_option
from pytest_budgetbench.commands.train_environment import PipelineEnvironment, load_training_items
from pytest_budgetbench.engine import wiring
from pytest_budgetbench.engine.catalog import Catalog
from pytest_budgetbench.engine.preflight import check_extras
from pytest_budgetbench.errors import BudgetBenchError
from pytest_budgetbench.options import non_negative, positive_int
from pytest_budgetbench.records.store import RunStore
from pytest_budgetbench.settings.config import Settings, endpoint_fields
from pytest_budgetbench.strategies.budgetmem.ppo import COST_SIGNALS, TrainConfig, train
from pytest_budgetbench.strategies.budgetmem.router import (
    DEFAULT_ROUTER_DIR,
    lambda_label,
    router_strategy,
)
from pytest_budgetbench.strategies.budgetmem.tiers import (
    AXES,
    AXIS_OPTION,
    DEFAULT_TOP_K,
    TOP_K_OPTION,
)
from pytest_budgetbench.tasks import resolve_task

if TYPE_CHECKING:
    from pytest_budgetbench.cache.responses import ResponseStore

TRAIN_RUN_DIR = "train-run"
"""Under --out: the runner's records of the training episodes (cells.jsonl)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    count, number = argument_type(positive_int), argument_type(non_negative)
    parser.add_argument("--lambda", dest="lam", type=lambda_label, default="0.1", metavar="L",
                        help="cost weight in reward = score + L x cost efficiency (default 0.1); "
                        "the strategy budgetmem@L loads the result")
    parser.add_argument("--out", type=Path, default=Path(DEFAULT_ROUTER_DIR), metavar="DIR",
                        help=f"checkpoint directory (default {DEFAULT_ROUTER_DIR}); writes "
                        "budgetmem-lambda<L>.pt, .state.pt (to resume) and .log.jsonl")
    parser.add_argument("--task", default="locomo", help="training task (default locomo)")
    parser.add_argument("--data", type=Path, metavar="PATH", help="the task's data file")
    parser.add_argument("--split", default="first", metavar="SPLIT",
                        help="locomo conversations to train on: first (default), rest, all or "
                        "sample ids (conv-26,conv-30)")
    # The plugin's --budgetbench-items parser, with training's own default.
    parser.add_argument("--items", **from_option("items", default=24, metavar="N",
                                                 help="training queries (default 24)"))
    parser.add_argument("--episodes", type=count, default=48, metavar="N",
                        help="total episodes, one query each (default 48)")
    parser.add_argument("--batch", type=count, default=8, metavar="N",
                        help="episodes per PPO update (default 8)")
    parser.add_argument("--epochs", type=count, default=4, metavar="N",
                        help="PPO passes per update (default 4)")
    parser.add_argument("--lr", type=number, default=3e-3, help="Adam learning rate (3e-3)")
    parser.add_argument("--seed", **from_option("seed", help="training seed (default 0)"))
    parser.add_argument("--budget", type=count, default=2048, metavar="TOKENS",
                        help="cell budget during training (default 2048)")
    parser.add_argument("--cost", choices=COST_SIGNALS, default="tokens",
                        help="cost signal (default tokens: auxiliary input + output tokens)")
    parser.add_argument("--price-in", **from_option(
        "price_in", help="USD per million input tokens, for --cost usd (default 0)"))
    parser.add_argument("--price-out", **from_option(
        "price_out", help="USD per million output tokens, for --cost usd (default 0)"))
    parser.add_argument("--axis", choices=AXES, default="implementation",
                        help="tier axis (default implementation)")
    parser.add_argument("--top-k", type=count, default=DEFAULT_TOP_K, metavar="K",
                        help=f"retrieved 256-token chunks (default {DEFAULT_TOP_K})")
    parser.add_argument("--endpoint", **from_option(
        "endpoint", help="OpenAI-compatible endpoint (default: the embedded model)"))
    parser.add_argument("--model", **from_option(
        "model", metavar="ID", help="model id at --endpoint (default: the first it lists)"))
    parser.add_argument("--api-key-env", **from_option("api_key_env"))
    parser.add_argument("--tokenizer", **from_option(
        "tokenizer", help="token counting, as --budgetbench-tokenizer (default auto)"))
    parser.add_argument("--max-tokens", **from_option("max_tokens", help="answer length (32)"))
    parser.add_argument("--threads", **from_option(
        "threads", metavar="N",
        help="CPU threads of the embedded server (default: the cores it may use)"))
    parser.add_argument("--embedding-model", **from_option("embedding_model"))
    parser.add_argument("--embedding-backend", **from_option("embedding_backend"))
    parser.add_argument("--cache", default="", metavar="PATH",
                        help="response cache file (default DIR/responses.sqlite; 'off' for none)")
    parser.add_argument("--fresh", action="store_true",
                        help="start over instead of resuming from DIR's state file")


def run_train_router(args: argparse.Namespace) -> int:
    """The handler of ``budgetbench train-router``."""
    started = time.perf_counter()
    # A plain kill must still stop the embedded server (the finally below).
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    try:
        env, close = build_environment(args)
    except BudgetBenchError as exc:
        print(f"budgetbench: error: {exc}", file=sys.stderr)
        return 2
    try:
        config = TrainConfig(lam=float(args.lam), episodes=args.episodes, batch=args.batch,
                             epochs=args.epochs, lr=args.lr, seed=args.seed, cost=args.cost)
        result = train(env, config, args.out, fresh=args.fresh,
                       progress=lambda line: print(f"train-router: {line}", flush=True))
    except BudgetBenchError as exc:
        print(f"budgetbench: error: {exc}", file=sys.stderr)
        return 2
    finally:
        close()
    size = result.checkpoint.stat().st_size
    print(f"train-router: wrote {result.checkpoint} ({size / 1024:.1f} KiB) after "
          f"{result.episodes} episodes; training {result.train_s:.1f} s, wall "
          f"{time.perf_counter() - started:.1f} s; use --budgetbench-strategies="
          f"budgetmem@{config.label} --budgetbench-strategy-options=budgetmem_router_dir="
          f"{args.out}")
    return 0


def training_settings(args: argparse.Namespace) -> Settings:
    """The settings a sweep would run the training cells with."""
    return Settings(
        tasks=(args.task,), items=args.items, seed=args.seed, **endpoint_fields(args.endpoint),
        model=args.model, max_tokens=args.max_tokens, temperature=0.0,
        api_key_env=args.api_key_env, tokenizer=args.tokenizer, out=str(args.out),
        audit="off", threads=args.threads, embedding_model=args.embedding_model,
        embedding_backend=args.embedding_backend,
        strategy_options={AXIS_OPTION: args.axis, TOP_K_OPTION: str(args.top_k)},
    )


def build_environment(args: argparse.Namespace) -> tuple[PipelineEnvironment, Callable[[], None]]:
    """The real pipeline on ``args``' task and model; the callable stops what it started."""
    settings = training_settings(args)
    # torch, the embedder's and the task's packages, and llama.cpp without an endpoint.
    check_extras(settings, {f"budgetmem@{args.lam}": router_strategy(args.lam)},
                 {args.task: resolve_task(args.task)})
    args.out.mkdir(parents=True, exist_ok=True)
    launcher = None
    if settings.endpoint:
        endpoint = wiring.resolve_endpoint(settings, model_flag="--model")
    else:  # started on the first reply the response cache does not hold, as in a sweep
        launcher, endpoint = embedded_server.embedded_launcher(
            embedded_server.embedded_context(args.budget, settings.max_tokens), settings.threads,
            args.out / "train-server.log", settings.model,
            on_start=lambda: print("train-router: starting the embedded model", flush=True))
        endpoint = embedded_server.counting_endpoint(settings.tokenizer, endpoint, launcher)

    def close() -> None:
        if launcher is not None:
            launcher.stop()

    try:
        task, items = load_training_items(args.task, args.data, args.split, args.items, args.seed)
        catalog = Catalog(settings)
        catalog.provide(task, items)
        run_id = f"train-router-{int(time.time())}"
        runner = wiring.make_runner(settings, catalog, endpoint,
                                    RunStore(args.out / TRAIN_RUN_DIR), run_id,
                                    response_store=_response_store(args, run_id),
                                    launcher=launcher)
    except BaseException:
        close()
        raise
    env = PipelineEnvironment(
        runner=runner, task=task.name, items=items,
        embedder_factory=wiring.embedder_factory(settings, _embedding_store_path(args)),
        budget=args.budget, cost=args.cost,
        prices=(args.price_in or 0.0, args.price_out or 0.0),
        meta={"task": args.task, "split": args.split, "items": len(items), "axis": args.axis,
              "embedder": args.embedding_model, "budget": args.budget, "top_k": args.top_k,
              "model": endpoint.model},
    )
    return env, close


def _response_cache_path(args: argparse.Namespace) -> Path | None:
    """--cache: a file, 'off' (None), or (default) DIR/responses.sqlite."""
    if args.cache == "off":
        return None
    from pytest_budgetbench.cache.responses import CACHE_FILE

    return Path(args.cache) if args.cache else args.out / CACHE_FILE


def _response_store(args: argparse.Namespace, run_id: str) -> ResponseStore | None:
    path = _response_cache_path(args)
    return None if path is None else wiring.open_response_store(path, run_id)


def _embedding_store_path(args: argparse.Namespace) -> Path | None:
    """The embedding cache beside the response cache; none with --cache=off."""
    from pytest_budgetbench.embeddings import STORE_FILE

    path = _response_cache_path(args)
    return None if path is None else path.with_name(STORE_FILE)
