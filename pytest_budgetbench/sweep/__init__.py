"""The sweep: what a cell is (item x strategy x budget) and its id, the order cells run in,
which shard of them this process runs, and which of xdist's workers it is."""
