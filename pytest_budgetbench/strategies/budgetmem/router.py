"""The learned router: ``budgetmem@<lambda>`` strategies and their checkpoints.

A router picks each module's tier by argmax of a small policy network
(:mod:`~pytest_budgetbench.strategies.budgetmem.policy`) over three inputs: the query's
embedding, the embedding of the state the module is about to read (the mean vector of
the retrieved passages for the filter, of the kept passages for the relation modules, and
of those and the relation notes for the summary), and the module's learned identity
embedding. ``budgetbench train-router --lambda L`` trains it (PPO, see
:mod:`~pytest_budgetbench.strategies.budgetmem.ppo`) and writes
``<dir>/budgetmem-lambda<L>.pt``; the strategy ``budgetmem@L`` reads it from
``options["budgetmem_router_dir"]`` (default ``budgetmem-routers``, relative to the
working directory). torch is imported only when a router decides.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pytest_budgetbench.errors import ConfigError, MissingDependency, Requirement
from pytest_budgetbench.options import Option, text
from pytest_budgetbench.strategies.budgetmem.modules import notes_text
from pytest_budgetbench.strategies.budgetmem.pipeline import (
    Services,
    State,
    mean_vector,
)
from pytest_budgetbench.strategies.budgetmem.strategy import BudgetMem
from pytest_budgetbench.strategies.budgetmem.tiers import MODULES, Tier

if TYPE_CHECKING:
    from pytest_budgetbench.strategies.budgetmem.policy import Policy

ROUTER_DIR_OPTION = "budgetmem_router_dir"
DEFAULT_ROUTER_DIR = "budgetmem-routers"
ROUTER_DIR = Option(ROUTER_DIR_OPTION, "directory of budgetmem@<lambda>'s trained "
                    "checkpoints (relative to the working directory)", text,
                    DEFAULT_ROUTER_DIR, metavar="DIR")
PREFIX = "budgetmem@"

Features = tuple[tuple[float, ...], tuple[float, ...], int]
"""(query embedding, module state embedding, module index)."""
Sampler = Callable[[Features], Tier]
"""A tier for a module's features: a trained policy's argmax, or training's draw."""


def lambda_label(text: str | float) -> str:
    """The canonical spelling of a trade-off weight (``0.10`` -> ``0.1``); names files."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0.0):
        raise ConfigError(
            f"a BudgetMem router's lambda must be a non-negative number (got {text!r}), "
            "as in budgetmem@0.1"
        )
    return f"{value:g}"


def checkpoint_path(directory: str | Path, label: str) -> Path:
    return Path(directory) / f"budgetmem-lambda{lambda_label(label)}.pt"


def features(module: str, state: State, services: Services) -> Features:
    """The router's inputs for ``module`` about to run on ``state``."""
    dim = len(state.query_vector)
    if module == "filter":
        vectors = [p.vector for p in state.passages]
    else:
        vectors = [p.vector for p in state.kept]
        notes = notes_text(state) if module == "summary" else ""
        if notes:
            vectors = [*vectors, *services.embed([notes])]
    return state.query_vector, mean_vector(vectors, dim), MODULES.index(module)


_POLICIES: dict[tuple[str, float], Policy] = {}
_POLICIES_LOCK = threading.Lock()


def load_policy(path: Path, strategy: str) -> Policy:
    """The checkpoint at ``path`` (loaded once per file version per process)."""
    if not path.is_file():
        raise ConfigError(
            f"strategy '{strategy}' has no router checkpoint at {path}: train one with "
            f"`budgetbench train-router --lambda {strategy.removeprefix(PREFIX)} "
            f"--out {path.parent}` (or set --budgetbench-strategy-options="
            f"{ROUTER_DIR_OPTION}=DIR)"
        )
    key = (str(path.resolve()), path.stat().st_mtime)
    with _POLICIES_LOCK:
        policy = _POLICIES.get(key)
        if policy is None:
            policy = _POLICIES[key] = policy_class().load(path)
        return policy


def policy_class() -> type[Policy]:
    """The policy class, importing torch; a clear error names the extra without it."""
    try:
        from pytest_budgetbench.strategies.budgetmem.policy import Policy
    except ImportError as exc:
        raise MissingDependency("torch", "budgetmem", "the BudgetMem router") from exc
    return Policy


class BudgetMemRouter(BudgetMem):
    """Tiers by argmax of a trained policy; one subclass per lambda (``budgetmem@0.1``)."""

    lam: ClassVar[str] = ""
    declared_options = (*BudgetMem.declared_options, ROUTER_DIR)
    requires = (Requirement("torch", "budgetmem"),)

    def choose(self, module: str, state: State, services: Services) -> Tier:
        directory = self.context.options.get(ROUTER_DIR_OPTION) or DEFAULT_ROUTER_DIR
        policy = load_policy(checkpoint_path(directory, self.lam), self.name)
        return policy.decide(features(module, state, services))


class SampledBudgetMem(BudgetMem):
    """Tiers drawn by ``sample`` from the router's features: the policy being trained."""

    name = "budgetmem_training"

    def __init__(self, sample: Sampler) -> None:
        self.sample = sample

    def choose(self, module: str, state: State, services: Services) -> Tier:
        return self.sample(features(module, state, services))


@dataclass
class EpisodeResult:
    """What one training episode of a :class:`SampledBudgetMem` yields: the task's score of
    its answer, its processing cost and the tier it drew for each module, by name."""

    score: float
    cost: float
    tiers: dict[str, str] = field(default_factory=dict)


_ROUTERS: dict[str, type[BudgetMemRouter]] = {}


def router_strategy(suffix: str) -> type[BudgetMemRouter]:
    """The router class for ``budgetmem@<suffix>`` (one class per lambda, reused)."""
    label = lambda_label(suffix)
    cls = _ROUTERS.get(label)
    if cls is None:
        attributes: dict[str, Any] = {"name": PREFIX + label, "lam": label,
                                      "__module__": __name__}
        cls = type(f"BudgetMemRouter_{label.replace('.', '_')}", (BudgetMemRouter,), attributes)
        _ROUTERS[label] = cls
    return cls
