"""Store: SQLite (default) with an append-only audit log."""
