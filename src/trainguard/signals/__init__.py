"""Signals in: process exits, progress reports, job logs, kernel log, GPU metrics, scheduler state.

Code here touches the outside world to *observe* it and turns what it sees into
plain records for :mod:`trainguard.diagnose`.
"""
