"""What pytest sees: collection, cell and gate items, node ids, flags, progress and
the summary."""
