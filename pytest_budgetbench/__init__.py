"""pytest-budgetbench: memory strategies for LLM agents, measured under a hard token budget.

Run ``pytest --budgets=2048,8192``; see the README, and the manual in docs/ for options,
strategies and tasks.
"""

from __future__ import annotations

__version__ = "0.1.0"
