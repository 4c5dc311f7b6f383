"""One module per checkpoint format, each implementing ``checkpoints.base.Format``."""
