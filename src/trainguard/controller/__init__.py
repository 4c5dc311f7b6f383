"""Controller: persist the Plan (durable intent), apply it, verify, close the incident."""
