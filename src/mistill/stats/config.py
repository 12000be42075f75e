"""The `stats` section of params.yaml as a typed record, so readers pass explicit seeds and sizes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from mistill.errors import UserError


@dataclass(frozen=True)
class StatsParams:
    bootstrap_resamples: int = 1000  # App. C, App. K: percentile bootstrap over notes
    corpus_bootstrap_resamples: int = 10_000  # App. K, Table 43: corpus-level micro-F1
    bootstrap_seed: int = 0
    corpus_bootstrap_seed: int = 0
    confidence: float = 0.95
    fdr: float = 0.05  # App. C: Benjamini-Hochberg over heads
    bonferroni_alpha: float = 0.05  # App. D: recurrence
    split_half_splits: int = 200  # App. D, Table 15
    split_half_seed: int = 0
    split_half_ks: tuple[int, ...] = (8, 40)
    pooled_weights_tau_ddof: int = 0

    @classmethod
    def from_params(cls, params: Mapping) -> StatsParams:
        """From the active profile's section (`mistill.params.load_params()`); unknown keys are errors."""
        section = params.get("stats")
        if not isinstance(section, Mapping):
            raise UserError("params.yaml: the active profile has no 'stats' section")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise UserError(f"params.yaml stats: unknown key(s) {', '.join(unknown)}")
        values = dict(section)
        if "split_half_ks" in values:
            values["split_half_ks"] = tuple(int(k) for k in values["split_half_ks"])
        return cls(**values)
