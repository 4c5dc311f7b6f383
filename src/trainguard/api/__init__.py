"""HTTP API, dashboard and /metrics (see the control-plane issue)."""
