"""Settings: the options' values, the task grammar, shards and the registries."""
