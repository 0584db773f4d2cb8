"""The caches that outlive a run, one SQLite file each: model replies (responses), token
counts (counts) and embedding vectors (vectors), on one checked, mergeable database."""
