"""PPO training of a BudgetMem router on an :class:`Environment`.

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

import json
import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.strategies.budgetmem.router import (
    EpisodeResult,
    Features,
    Sampler,
    checkpoint_path,
    lambda_label,
    policy_class,
)
from pytest_budgetbench.strategies.budgetmem.tiers import MODULES, Tier

if TYPE_CHECKING:
    from pytest_budgetbench.strategies.budgetmem.policy import Policy

COST_SIGNALS: tuple[str, ...] = ("tokens", "seconds", "usd")
COST_FLOORS: dict[str, float] = {"tokens": 1.0, "seconds": 1e-3, "usd": 1e-9}
SCALE_QUANTILE = 0.9


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
