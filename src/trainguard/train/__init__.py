"""In-training library: checkpoint save/restore and progress reports.

Imports only :mod:`trainguard.model`, the standard library and torch.
"""
