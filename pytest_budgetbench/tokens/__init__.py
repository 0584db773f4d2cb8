"""Token counters, one module per counter (approximate, gguf, huggingface, server) over the
contract in :mod:`.base`: a prompt counted as the model will see it."""
