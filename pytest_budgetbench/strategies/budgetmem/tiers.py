"""Tiers, axes and modules of the BudgetMem pipeline, and how options select them.

A tier is LOW, MID or HIGH. What a tier *means* depends on the axis
(``options["budgetmem_axis"]``):

- ``implementation`` (default): LOW is a heuristic (keyword overlap, regular expressions,
  plain concatenation), MID uses the embedder (similarity with thresholds, template
  summaries), HIGH asks the auxiliary model;
- ``reasoning``: every tier asks the same auxiliary model, LOW with a direct prompt, MID
  with chain-of-thought, HIGH with plan-act-reflect (a draft, then a revision call);
- ``capacity``: every tier asks with the direct prompt, LOW the auxiliary model named
  ``small``, MID ``medium``, HIGH ``large`` (``--budgetbench-aux-models``); a name that is
  not configured falls back to the run's auxiliary model, so on the embedded default all
  three are the same model.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.options import Option, choice, positive_int


class Tier(enum.IntEnum):
    LOW = 0
    MID = 1
    HIGH = 2


AXES: tuple[str, ...] = ("implementation", "reasoning", "capacity")
MODULES: tuple[str, ...] = ("filter", "entity", "temporal", "topic", "summary")
"""Pipeline order: the filter, the three relation modules over what it kept, the summary."""
CAPACITY_MODELS: dict[Tier, str] = {Tier.LOW: "small", Tier.MID: "medium", Tier.HIGH: "large"}

AXIS_OPTION = "budgetmem_axis"
TOP_K_OPTION = "budgetmem_top_k"
DEFAULT_TOP_K = 8

AXIS = Option(AXIS_OPTION, "BudgetMem's tier axis", choice(*AXES), "implementation",
              metavar="|".join(AXES))
TOP_K = Option(TOP_K_OPTION, "256-token chunks the BudgetMem pipeline retrieves",
               positive_int, DEFAULT_TOP_K)


def axis_option(options: Mapping[str, Any]) -> str:
    """The tier axis ``options`` select; a bad value is a ConfigError naming the choices."""
    axis = str(options.get(AXIS_OPTION) or "implementation").strip().lower()
    if axis not in AXES:
        raise ConfigError(
            f"{AXIS_OPTION} must be one of {', '.join(AXES)} (got {axis!r}): pass "
            f"--budgetbench-strategy-options={AXIS_OPTION}=implementation"
        )
    return axis


def top_k_option(options: Mapping[str, Any]) -> int:
    """How many 256-token chunks the pipeline retrieves (``budgetmem_top_k``, default 8)."""
    raw = options.get(TOP_K_OPTION, DEFAULT_TOP_K)
    try:
        value = int(str(raw))
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{TOP_K_OPTION} must be a positive integer (got {raw!r})")
    return value
