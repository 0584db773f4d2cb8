"""Training a BudgetMem router with PPO, and the ``budgetbench train-router`` command.

An episode is one training query: the pipeline runs with each module's tier *sampled*
from the policy (five decisions), the answer model replies to the resulting prompt, and
the task grades it. The episode's reward, given to each of its decisions, is

    reward = task score + lambda x cost efficiency,
    cost efficiency = 1 - min(1, cost / scale),

where ``cost`` is the episode's processing cost in the chosen signal (``tokens``: the
modules' auxiliary input plus output tokens, the default, deterministic under the
response cache; ``seconds``: measured module compute seconds, non-LLM tiers included,
with an auxiliary reply's recorded latency; ``usd``: tokens at --price-in/--price-out per
million) and ``scale`` is the 90th percentile of the last ``window`` episodes' costs, but
at least a floor of one token, a millisecond or a nano-dollar: unlike a min-max
normalisation it never divides by zero (a window of all-zero costs gives efficiency 1)
and one outlier cannot squash every other episode.

PPO (Schulman et al., 2017): after every ``batch`` episodes, ``epochs`` passes of Adam on
the clipped surrogate (clip 0.2) plus 0.5 x value loss minus 0.01 x entropy; advantages
are the reward less the value head's estimate, normalised over the batch.

Seeded and resumable: the episode order (a seeded shuffle per pass over the queries) and
each episode's sampling generator derive from the seed and the episode number, and the
optimiser, cost window and counters are saved with the checkpoint after every batch, so
an interrupted run continues where it stopped and ends where an uninterrupted one would.
torch is imported only when training starts.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_budgetbench.cli import non_negative, positive_int
from pytest_budgetbench.errors import BudgetBenchError, ConfigError
from pytest_budgetbench.messages import Message
from pytest_budgetbench.strategies.base import StrategyContext
from pytest_budgetbench.strategies.budgetmem.pipeline import Services, State
from pytest_budgetbench.strategies.budgetmem.router import (
    DEFAULT_ROUTER_DIR,
    Features,
    checkpoint_path,
    features,
    lambda_label,
    policy_class,
)
from pytest_budgetbench.strategies.budgetmem.strategy import BudgetMem
from pytest_budgetbench.strategies.budgetmem.tiers import (
    AXES,
    AXIS_OPTION,
    DEFAULT_TOP_K,
    MODULES,
    TOP_K_OPTION,
    Tier,
)

if TYPE_CHECKING:
    from pytest_budgetbench.budget import TokenCounter
    from pytest_budgetbench.strategies.budgetmem.policy import Policy
    from pytest_budgetbench.tasks import Item, Task

COST_SIGNALS: tuple[str, ...] = ("tokens", "seconds", "usd")
COST_FLOORS: dict[str, float] = {"tokens": 1.0, "seconds": 1e-3, "usd": 1e-9}
SCALE_QUANTILE = 0.9
Sampler = Callable[[Features], Tier]


# -- cost normalisation ----------------------------------------------------------------------
class CostNormaliser:
    """Cost efficiency in [0, 1] against the recent episodes' costs (see module docstring)."""

    def __init__(self, signal: str, window: int = 64, history: Sequence[float] = ()) -> None:
        self.floor = COST_FLOORS[signal]
        self.costs: deque[float] = deque(history, maxlen=window)

    def scale(self) -> float:
        ordered = sorted(self.costs)
        if not ordered:
            return self.floor
        position = SCALE_QUANTILE * (len(ordered) - 1)
        low = ordered[math.floor(position)]
        high = ordered[math.ceil(position)]
        quantile = low + (high - low) * (position - math.floor(position))
        return max(quantile, self.floor)

    def efficiency(self, cost: float) -> float:
        """Record ``cost`` and return ``1 - min(1, cost / scale)``."""
        cost = max(0.0, float(cost)) if math.isfinite(cost) else 0.0
        self.costs.append(cost)
        return 1.0 - min(1.0, cost / self.scale())


# -- episodes --------------------------------------------------------------------------------
@dataclass
class EpisodeResult:
    score: float
    cost: float
    tiers: dict[str, str] = field(default_factory=dict)


class Environment(Protocol):
    """What training runs episodes on: ``size`` training queries of ``dim``-dimensional
    embeddings; ``run`` plays query ``index`` with tiers from ``sample``."""

    meta: dict[str, Any]

    @property
    def size(self) -> int: ...

    @property
    def dim(self) -> int: ...

    def run(self, index: int, sample: Sampler) -> EpisodeResult: ...


@dataclass(frozen=True)
class TrainConfig:
    lam: float
    episodes: int = 64
    batch: int = 8
    epochs: int = 4
    lr: float = 3e-3
    clip: float = 0.2
    value_coef: float = 0.5
    entropy: float = 0.01
    seed: int = 0
    cost: str = "tokens"
    window: int = 64

    @property
    def label(self) -> str:
        return lambda_label(self.lam)


@dataclass
class Step:
    row: Features
    action: int
    logp: float
    value: float


@dataclass
class TrainResult:
    checkpoint: Path
    episodes: int
    train_s: float
    mean_reward: float
    tier_counts: dict[str, dict[str, int]]


def episode_order(size: int, seed: int, episode: int) -> int:
    """The query of ``episode``: a seeded shuffle of all queries per pass."""
    order = list(range(size))
    random.Random(f"budgetmem-train/{seed}/{episode // size}").shuffle(order)
    return order[episode % size]


def state_path(checkpoint: Path) -> Path:
    return checkpoint.with_suffix(".state.pt")


def log_path(checkpoint: Path) -> Path:
    return checkpoint.with_suffix(".log.jsonl")


# -- the training loop -------------------------------------------------------------------------
class Trainer:
    """PPO over an :class:`Environment`; see the module docstring."""

    def __init__(self, env: Environment, config: TrainConfig, out_dir: Path, *,
                 fresh: bool = False, progress: Callable[[str], None] = print) -> None:
        policy_type = policy_class()  # imports torch, or says which extra installs it
        import torch

        if config.cost not in COST_SIGNALS:
            raise ConfigError(f"cost must be one of {', '.join(COST_SIGNALS)} "
                              f"(got {config.cost!r})")
        self.env, self.config, self.progress = env, config, progress
        self.checkpoint = checkpoint_path(out_dir, config.label)
        out_dir.mkdir(parents=True, exist_ok=True)
        meta = {**env.meta, "lambda": config.label, "cost": config.cost, "seed": config.seed}
        self.policy: Policy = policy_type.new(env.dim, config.seed, meta)
        self.optimizer = torch.optim.Adam(self.policy.net.parameters(), lr=config.lr)
        self.normaliser = CostNormaliser(config.cost, config.window)
        self.done = 0
        self.train_s = 0.0
        self.tier_counts = {m: {t.name: 0 for t in Tier} for m in MODULES}
        self.rewards: list[float] = []
        if not fresh and state_path(self.checkpoint).is_file():
            self._resume()

    # -- persistence ---------------------------------------------------------------------
    def _resume(self) -> None:
        import torch

        from pytest_budgetbench.strategies.budgetmem.policy import Policy

        saved = torch.load(state_path(self.checkpoint), map_location="cpu", weights_only=True)
        if saved.get("lambda") != self.config.label or saved.get("dim") != self.env.dim:
            raise ConfigError(
                f"{state_path(self.checkpoint)} was trained with lambda {saved.get('lambda')} "
                f"on {saved.get('dim')}-dimensional embeddings: pass --fresh to start over"
            )
        self.policy = Policy.load(self.checkpoint)
        self.policy.net.train()
        self.optimizer = torch.optim.Adam(self.policy.net.parameters(), lr=self.config.lr)
        self.optimizer.load_state_dict(saved["optimizer"])
        self.normaliser = CostNormaliser(self.config.cost, self.config.window, saved["costs"])
        self.done = int(saved["episodes"])
        self.train_s = float(saved["train_s"])
        self.tier_counts = saved["tier_counts"]
        self.rewards = list(saved["rewards"])
        self.progress(f"resuming {self.checkpoint} at episode {self.done}")

    def _save(self) -> None:
        import torch

        self.policy.meta.update(episodes=self.done, train_s=round(self.train_s, 3))
        self.policy.save(self.checkpoint)
        state = {"lambda": self.config.label, "dim": self.env.dim, "episodes": self.done,
                 "optimizer": self.optimizer.state_dict(), "costs": list(self.normaliser.costs),
                 "train_s": self.train_s, "tier_counts": self.tier_counts,
                 "rewards": self.rewards}
        final = state_path(self.checkpoint)
        partial = final.with_name(final.name + ".partial")
        torch.save(state, partial)
        partial.replace(final)

    # -- episodes and updates ----------------------------------------------------------------
    def run(self) -> TrainResult:
        import torch

        # The net is tiny: one thread is fastest, and cannot thrash on a busy machine.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._run()
        finally:
            torch.set_num_threads(threads)

    def _run(self) -> TrainResult:
        config = self.config
        if self.done == 0:
            log_path(self.checkpoint).unlink(missing_ok=True)
        while self.done < config.episodes:
            started = time.perf_counter()
            batch = [self._episode() for _ in range(min(config.batch, config.episodes - self.done))]
            self._update(batch)
            self.train_s += time.perf_counter() - started
            self._save()
            self._report(batch)
        return TrainResult(self.checkpoint, self.done, self.train_s,
                           sum(self.rewards) / len(self.rewards) if self.rewards else 0.0,
                           self.tier_counts)

    def _episode(self) -> tuple[list[Step], float]:
        import torch

        from pytest_budgetbench.strategies.budgetmem.policy import batch as as_batch

        episode = self.done
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + episode)
        steps: list[Step] = []

        def sample(row: Features) -> Tier:
            with torch.no_grad():
                logits, value = self.policy.net(*as_batch([row]))
            dist = torch.distributions.Categorical(logits=logits[0])
            action = int(torch.multinomial(dist.probs, 1, generator=generator).item())
            steps.append(Step(row, action, float(dist.log_prob(torch.tensor(action))),
                              float(value[0])))
            return Tier(action)

        index = episode_order(self.env.size, self.config.seed, episode)
        result = self.env.run(index, sample)
        efficiency = self.normaliser.efficiency(result.cost)
        reward = result.score + self.config.lam * efficiency
        self.done += 1
        self.rewards.append(reward)
        for module, tier in result.tiers.items():
            self.tier_counts[module][tier] += 1
        self._log({"episode": episode, "query": index, "score": result.score,
                   "cost": result.cost, "efficiency": efficiency, "reward": reward,
                   "tiers": result.tiers})
        tiers = " ".join(f"{m}={t}" for m, t in result.tiers.items())
        self.progress(f"episode {self.done}/{self.config.episodes}: query {index}, score "
                      f"{result.score:.2f}, cost {result.cost:.4g} {self.config.cost}, reward "
                      f"{reward:.3f} ({tiers})")
        return steps, reward

    def _update(self, batch: list[tuple[list[Step], float]]) -> None:
        import torch

        from pytest_budgetbench.strategies.budgetmem.policy import batch as as_batch

        steps = [s for episode, _r in batch for s in episode]
        if not steps:
            return
        returns = torch.tensor([r for episode, r in batch for _s in episode])
        old_logp = torch.tensor([s.logp for s in steps])
        actions = torch.tensor([s.action for s in steps])
        advantages = returns - torch.tensor([s.value for s in steps])
        if len(steps) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        inputs = as_batch([s.row for s in steps])
        config = self.config
        self.policy.net.train()
        for _epoch in range(config.epochs):
            logits, values = self.policy.net(*inputs)
            dist = torch.distributions.Categorical(logits=logits)
            ratio = torch.exp(dist.log_prob(actions) - old_logp)
            clipped = torch.clamp(ratio, 1 - config.clip, 1 + config.clip)
            policy_loss = -torch.min(ratio * advantages, clipped * advantages).mean()
            value_loss = ((values - returns) ** 2).mean()
            loss = policy_loss + config.value_coef * value_loss - (
                config.entropy * dist.entropy().mean())
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.policy.net.parameters(), 0.5)
            self.optimizer.step()
        self.policy.net.eval()

    def _log(self, record: dict[str, Any]) -> None:
        with log_path(self.checkpoint).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def _report(self, batch: list[tuple[list[Step], float]]) -> None:
        mean = sum(r for _s, r in batch) / len(batch)
        high = sum(c["HIGH"] for c in self.tier_counts.values())
        total = sum(sum(c.values()) for c in self.tier_counts.values()) or 1
        self.progress(f"update after episode {self.done}/{self.config.episodes}: batch reward "
                      f"{mean:.3f}, HIGH {high / total:.0%} of decisions so far, "
                      f"{self.train_s:.1f} s; checkpoint saved")


def train(env: Environment, config: TrainConfig, out_dir: Path, *, fresh: bool = False,
          progress: Callable[[str], None] = print) -> TrainResult:
    """Train (or resume training) the router for ``config.lam``; returns where it is."""
    return Trainer(env, config, out_dir, fresh=fresh, progress=progress).run()


# -- the pipeline as an environment ------------------------------------------------------------
class _Sampled(BudgetMem):
    name = "budgetmem_training"

    def __init__(self, sample: Sampler) -> None:
        self.sample = sample

    def choose(self, module: str, state: State, services: Services) -> Tier:
        return self.sample(features(module, state, services))


class Answerer(Protocol):
    def complete(self, messages: Sequence[Message], *, max_tokens: int) -> Any: ...


@dataclass
class PipelineEnvironment:
    """Episodes of the real pipeline on a task's items, answered and graded."""

    task: Task
    items: list[Item]
    tokens: TokenCounter
    chat: Answerer
    embedder_factory: Callable[[], Any]
    budget: int
    options: dict[str, Any] = field(default_factory=dict)
    max_tokens: int = 32
    cost: str = "tokens"
    prices: tuple[float, float] = (0.0, 0.0)
    seed: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    _embedder: Any = None

    @property
    def size(self) -> int:
        return len(self.items)

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            self._embedder = self.embedder_factory()
        return self._embedder

    @property
    def dim(self) -> int:
        return len(self.embedder.embed(["dimension probe"])[0])

    def run(self, index: int, sample: Sampler) -> EpisodeResult:
        from pytest_budgetbench.runner import RecordedAuxModel

        item = self.items[index]
        cell = f"train-router-{self.task.name}-{item.item_id}-{self.budget}"
        aux = RecordedAuxModel(self.chat, self.tokens, self.budget, cell)  # type: ignore[arg-type]
        context = StrategyContext(tokens=self.tokens, item_id=f"{self.task.name}/{item.item_id}",
                                  seed=self.seed, aux=aux, embedder_factory=lambda: self.embedder,
                                  options=dict(self.options))
        strategy = _Sampled(sample)
        strategy.reset(context)
        prompt = strategy.apply(copy.deepcopy(list(item.messages)), self.budget)
        outcome = strategy.outcome
        tiers = {m: t.name for m, t in outcome.tiers.items()} if outcome else {}
        if self.tokens.count_messages(prompt) > self.budget:
            return EpisodeResult(0.0, 0.0, tiers)  # system plus query alone overflow
        reply = self.chat.complete(prompt, max_tokens=self.max_tokens)
        score = self.task.grade(item, reply.text).quality
        return EpisodeResult(score, self._cost(aux.calls, outcome), tiers)

    def _cost(self, calls: Sequence[Any], outcome: Any) -> float:
        if outcome is None:
            return 0.0
        if self.cost == "seconds":
            return float(outcome.cost_seconds())
        if self.cost == "usd":
            price_in, price_out = self.prices
            return sum(c.input_tokens * price_in + (c.output_tokens or 0) * price_out
                       for c in calls) / 1e6
        return float(outcome.cost_tokens())


# -- the console command -----------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument("--items", type=positive_int, default=24, metavar="N",
                        help="training queries (default 24)")
    parser.add_argument("--episodes", type=positive_int, default=48, metavar="N",
                        help="total episodes, one query each (default 48)")
    parser.add_argument("--batch", type=positive_int, default=8, metavar="N",
                        help="episodes per PPO update (default 8)")
    parser.add_argument("--epochs", type=positive_int, default=4, metavar="N",
                        help="PPO passes per update (default 4)")
    parser.add_argument("--lr", type=non_negative, default=3e-3, help="Adam learning rate (3e-3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=positive_int, default=2048, metavar="TOKENS",
                        help="cell budget during training (default 2048)")
    parser.add_argument("--cost", choices=COST_SIGNALS, default="tokens",
                        help="cost signal (default tokens: auxiliary input + output tokens)")
    parser.add_argument("--price-in", type=non_negative, default=0.0, metavar="USD",
                        help="USD per million input tokens, for --cost usd")
    parser.add_argument("--price-out", type=non_negative, default=0.0, metavar="USD",
                        help="USD per million output tokens, for --cost usd")
    parser.add_argument("--axis", choices=AXES, default="implementation",
                        help="tier axis (default implementation)")
    parser.add_argument("--top-k", type=positive_int, default=DEFAULT_TOP_K, metavar="K",
                        help=f"retrieved 256-token chunks (default {DEFAULT_TOP_K})")
    parser.add_argument("--endpoint", metavar="URL",
                        help="OpenAI-compatible endpoint (default: the embedded model)")
    parser.add_argument("--model", metavar="ID", help="model id at --endpoint")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR")
    parser.add_argument("--tokenizer", default="auto",
                        help="token counting, as --budgetbench-tokenizer (default auto)")
    parser.add_argument("--max-tokens", type=positive_int, default=32, help="answer length (32)")
    parser.add_argument("--threads", type=positive_int, metavar="N",
                        help="CPU threads of the embedded server (default all cores)")
    parser.add_argument("--embedding-model", default="all-MiniLM-L6-v2", metavar="NAME")
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


def build_environment(args: argparse.Namespace) -> tuple[PipelineEnvironment, Callable[[], None]]:
    """The real pipeline on ``args``' task and model; the callable stops what it started."""
    from pytest_budgetbench.runner import Endpoint
    from pytest_budgetbench.session import make_counter

    api_key = os.environ.get(args.api_key_env)
    server: Any = None
    if args.endpoint:
        if not args.model:
            raise ConfigError("--endpoint needs --model")
        endpoint = Endpoint(base_url=args.endpoint, model=args.model)
    else:
        from pytest_budgetbench.model import EMBEDDED_MODEL_ALIAS, EmbeddedServer

        server = EmbeddedServer(n_ctx=max(8192, args.budget + args.max_tokens + 64),
                                threads=args.threads, log_path=args.out / "train-server.log")
        args.out.mkdir(parents=True, exist_ok=True)
        server.start()
        endpoint = Endpoint(base_url=server.base_url, model=EMBEDDED_MODEL_ALIAS,
                            embedded=True, gguf_path=str(server.model_path),
                            server_flags=dict(server.flags))

    def close() -> None:
        if server is not None:
            server.stop()

    try:
        tokens = make_counter(args.tokenizer, endpoint, api_key)
        chat = _chat(args, endpoint, api_key)
        task, items = load_training_items(args.task, args.data, args.split, args.items, args.seed)
    except BaseException:
        close()
        raise
    env = PipelineEnvironment(
        task=task, items=items, tokens=tokens, chat=chat,
        embedder_factory=_embedder_factory(args.embedding_model), budget=args.budget,
        options={AXIS_OPTION: args.axis, TOP_K_OPTION: str(args.top_k),
                 "embedding_model": args.embedding_model},
        max_tokens=args.max_tokens, cost=args.cost, prices=(args.price_in, args.price_out),
        seed=args.seed,
        meta={"task": args.task, "split": args.split, "items": len(items), "axis": args.axis,
              "embedder": args.embedding_model, "budget": args.budget, "top_k": args.top_k,
              "model": endpoint.model},
    )
    return env, close


def _chat(args: argparse.Namespace, endpoint: Any, api_key: str | None) -> Any:
    from pytest_budgetbench.model import ChatModel

    chat: Any = ChatModel(endpoint.base_url, endpoint.model, api_key=api_key,
                          temperature=0.0, seed=args.seed)
    if args.cache == "off":
        return chat
    from pytest_budgetbench.cache import CACHE_FILE, CachingChatModel, ResponseStore

    path = Path(args.cache) if args.cache else args.out / CACHE_FILE
    store = ResponseStore(path, run_id=f"train-router-{int(time.time())}")
    return CachingChatModel(chat, store)


def _embedder_factory(name: str) -> Callable[[], Any]:
    def factory() -> Any:
        from pytest_budgetbench.embeddings import make_embedder

        return make_embedder(name)

    return factory


def load_training_items(task_name: str, data: Path | None, split: str, count: int,
                        seed: int) -> tuple[Task, list[Item]]:
    """The task and its first ``count`` items of the training split."""
    from pytest_budgetbench.tasks import REGISTRY as TASKS
    from pytest_budgetbench.tasks import TaskOptions

    cls = TASKS.resolve(task_name)
    extra: dict[str, Any] = {"locomo_samples": split} if cls.name == "locomo" else {}
    task = cls(TaskOptions(seed=seed, data_path=data, extra=extra))
    items = task.load()[:count]
    if not items:
        raise ConfigError(f"task '{task_name}' has no training items (split {split!r})")
    return task, items


