"""`trainscale plan`: the one predictive model (model.py), its calibration (calibrate.py), its words (text.py),
what each strategy communicates (comm.py), and `plan --tune` (tune.py, tuning.py)."""
