"""How well a run uses its hardware: per-rank records, device sampling, stragglers, FLOPs, the network used."""
