"""The router's policy network (torch, CPU). Imported only when a router is used.

Inputs: the query embedding and the module's state embedding (each projected to
``hidden`` units) and a learned ``module_dim`` identity embedding per module. One tanh
layer mixes them; a policy head gives LOW/MID/HIGH logits and a value head the expected
reward (PPO's baseline). With MiniLM (384 dimensions) and the defaults that is about 58k
parameters, a ~240 KB checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.strategies.budgetmem.tiers import MODULES, Tier

CHECKPOINT_FORMAT = "budgetmem-router/1"
HIDDEN = 64
MODULE_DIM = 16

Features = tuple[Sequence[float], Sequence[float], int]


class PolicyNet(nn.Module):
    def __init__(self, dim: int, hidden: int = HIDDEN, module_dim: int = MODULE_DIM) -> None:
        super().__init__()
        self.query = nn.Linear(dim, hidden)
        self.state = nn.Linear(dim, hidden)
        self.module = nn.Embedding(len(MODULES), module_dim)
        self.mix = nn.Linear(2 * hidden + module_dim, hidden)
        self.policy = nn.Linear(hidden, len(Tier))
        self.value = nn.Linear(hidden, 1)

    def forward(self, query: torch.Tensor, state: torch.Tensor,
                module: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        joined = torch.cat([self.query(query), self.state(state), self.module(module)], dim=-1)
        hidden = torch.tanh(self.mix(torch.tanh(joined)))
        return self.policy(hidden), self.value(hidden).squeeze(-1)


def batch(rows: Sequence[Features]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Feature rows as the network's three input tensors."""
    query = torch.tensor([list(r[0]) for r in rows], dtype=torch.float32)
    state = torch.tensor([list(r[1]) for r in rows], dtype=torch.float32)
    module = torch.tensor([r[2] for r in rows], dtype=torch.long)
    return query, state, module


class Policy:
    """A network with its checkpoint metadata."""

    def __init__(self, net: PolicyNet, meta: dict[str, Any]) -> None:
        self.net = net
        self.meta = meta

    @classmethod
    def new(cls, dim: int, seed: int, meta: dict[str, Any]) -> Policy:
        torch.manual_seed(seed)
        return cls(PolicyNet(dim), {**meta, "dim": dim, "hidden": HIDDEN,
                                    "module_dim": MODULE_DIM})

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    def decide(self, row: Features) -> Tier:
        """The argmax tier for one decision."""
        if len(row[0]) != self.dim:
            raise ConfigError(
                f"the router checkpoint expects {self.dim}-dimensional embeddings "
                f"({self.meta.get('embedder')}), this run's embedder gives {len(row[0])}: "
                "train the router with the same --budgetbench-embedding-model"
            )
        with torch.no_grad():
            logits, _value = self.net(*batch([row]))
        return Tier(int(torch.argmax(logits[0]).item()))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        torch.save({"format": CHECKPOINT_FORMAT, "meta": self.meta,
                    "state_dict": self.net.state_dict()}, partial)
        partial.replace(path)  # a reader never sees half a checkpoint

    @classmethod
    def load(cls, path: Path) -> Policy:
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises several types for a bad file
            raise ConfigError(f"cannot read router checkpoint {path}: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
            raise ConfigError(f"{path} is not a {CHECKPOINT_FORMAT} checkpoint")
        meta = dict(data["meta"])
        net = PolicyNet(int(meta["dim"]), int(meta["hidden"]), int(meta["module_dim"]))
        net.load_state_dict(data["state_dict"])
        net.eval()
        return cls(net, meta)
