"""Token counters: a prompt counted as the model will see it."""
