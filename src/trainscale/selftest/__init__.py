"""`trainscale selftest`: two launches made as training is launched (run.py), what each rank runs (rank.py),
and the checks read from them (checks.py)."""
