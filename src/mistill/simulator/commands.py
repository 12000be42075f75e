"""`mistill simulator train | predict` (App. K, LAS): the commands live in `mistill.evaluate.simulator_commands`."""

from mistill.evaluate.simulator_commands import register

__all__ = ["register"]
