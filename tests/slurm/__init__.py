"""Shared parts of the Slurm tests: the local cluster fixture, job scripts, helpers."""
