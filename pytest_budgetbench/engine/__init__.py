"""The engine: the session, preflight and wiring, the runner of one cell, the one budgeted
call (count, check, send, record) and the episode loop over it."""
