"""Controls of the characterization: the instruction control (App. B, R-C14)."""
