"""Settings: the options' values (command line > ini > environment > default) and the
grammar of task definitions."""
