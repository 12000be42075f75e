"""mistill: reproduce "Characterize Then Distill" result by result."""

__version__ = "0.1.0"
