"""Checkpoint catalog: find and validate checkpoints of several formats; interval advice."""
