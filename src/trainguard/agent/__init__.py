"""The node agent behind ``trainguard agent``: inventory, kernel log, GPU metrics, findings.

A signals-level client of the control plane: it imports only ``model``,
``diagnose`` and ``signals`` (never the controller or the store), buffers what it
finds on local disk, and delivers it to ``trainguard serve`` exactly once.
"""

from __future__ import annotations

from trainguard.agent.agent import Agent, AgentOptions, AgentStats, host_simulated

__all__ = ["Agent", "AgentOptions", "AgentStats", "host_simulated"]
