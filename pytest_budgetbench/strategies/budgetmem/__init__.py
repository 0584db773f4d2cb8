"""BudgetMem: a modular memory pipeline with LOW/MID/HIGH tiers per module, a learned
query-aware router that picks them, and the fixed-tier controls the paper lacks.

- :mod:`.tiers`: tiers, axes (implementation, reasoning, capacity), modules, options;
- :mod:`.pipeline`: retrieval, services, budgeted auxiliary calls, cost ledger;
- :mod:`.modules`: filter, entity/temporal/topic relations, summary, each at three tiers,
  and the module loop (``run_pipeline``);
- :mod:`.strategy`: the strategy, and ``budgetmem_low``, ``_mid``, ``_high``, ``_random``;
- :mod:`.router`: ``budgetmem@<lambda>`` and its checkpoints;
- :mod:`.policy`: the torch policy network (imported only by routers and training);
- :mod:`.ppo`: the PPO learner, on any environment; the pipeline's episodes, as the
  runner's cells, are in :mod:`pytest_budgetbench.commands.train_environment`, and
  ``budgetbench train-router`` in :mod:`pytest_budgetbench.commands.train_router`.
- :mod:`.report`: the report extension (tier-selection table, processing-cost plot).

Nothing here imports torch, numpy or an embedding model at import time.
"""

from __future__ import annotations
