"""Settings: the options' values (command line > ini > environment > default), the grammar
of task definitions, and where budgetbench keeps what outlives a run."""
