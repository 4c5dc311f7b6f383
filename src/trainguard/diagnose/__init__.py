"""Diagnosis: pure functions from signals to findings and attributions.

No I/O and no clock: text, records and times come in as arguments.
"""
