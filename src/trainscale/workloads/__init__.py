"""Built-in workloads from the seeds, built on trainscale's public API like any user script."""
