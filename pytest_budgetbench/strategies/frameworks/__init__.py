"""The memory policies that agent frameworks ship, run as shipped: one module per framework.

Each policy is the framework's own code, imported from its package (one extra per
framework, pinned), never written again here. A module converts the cell's OpenAI-format
history to the framework's message types and back (:mod:`._policy` names what cannot
cross), hands the framework the cell's budget under its own parameter, and routes the
framework's model calls (its summaries) through the runner's auxiliary model.

Where a policy trims by a count of its own, it comes in two variants: as shipped (the
framework's default counter) and ``_exact`` (the run's counter handed to it). Both record
the framework's own count of the prompt it built (``estimated_tokens`` on the row), so a
report shows what the framework's counter gets wrong under the budget.
"""
