"""The engine: the session, the cells, the runner and the episode loop over the
budgeted call."""
