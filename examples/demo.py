"""Placeholder demo (replaced by the checkpoint and recovery demos)."""
