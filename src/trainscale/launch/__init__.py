"""Launching: local workers through torch's elastic agent, and SLURM batch jobs."""
