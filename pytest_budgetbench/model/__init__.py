"""The model endpoint: the chat client, replicas, structured output, the tool-call parser
and request deadlines (the response cache is :mod:`pytest_budgetbench.cache.responses`)."""
