"""Schedulers: the only code that changes a cluster (local process supervisor, Slurm)."""
