"""What outlives a run on this machine: the folder it is kept in (userdirs), and the caches,
one SQLite file each: model replies (responses), token counts (counts) and embedding
vectors (vectors), each on one checked, mergeable database (database)."""
