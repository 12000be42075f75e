"""Arm minus reference over seed pairs that cover different notes (App. L.4, Table 49 bottom; R-D29, R-D30).

On the teacher's traces every run reads the same test notes, and `mistill.evaluate.compare.clustered` keeps the
notes every seed of both arms carries.  On the students' own traces a note enters a run only if that run's
generation completed and carries events, so the seed pairs cover different notes.  The paper's reading:

* seed pair i (arm seed i against reference seed i; a one-seed side pairs with every seed, App. K) is read on the
  notes both of its runs carry: d_i(n) = arm_i(n) - reference_i(n);
* per note, the mean of the pair differences available for it, over the distinct notes with at least one pair:
  D(n) = mean_{i : n in pair i} d_i(n);
* the mean of D over notes with its percentile bootstrap interval (notes resampled), a two-sided sign test and a
  Wilcoxon signed-rank test over notes (`mistill.stats`).

With every pair covering every note this is `compare.clustered` exactly (tested).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from mistill.stats import StatsParams, bootstrap_mean, sign_test, wilcoxon_signed_rank
from mistill.stats.clustered import matched_seed_pairs


def available_pair_comparison(arm: Mapping[int, Mapping[str, float]], reference: Mapping[int, Mapping[str, float]],
                              stats: StatsParams) -> dict | None:
    """The comparison above, or None when no seed pair shares a note."""
    pairs = matched_seed_pairs(arm, reference)
    per_pair, by_note = [], {}
    for i, j in pairs:
        common = sorted(set(arm[i]) & set(reference[j]))
        d = {n: arm[i][n] - reference[j][n] for n in common}
        for n, x in d.items():
            by_note.setdefault(n, []).append(x)
        values = np.array(list(d.values()), dtype=float)
        per_pair.append({"arm_seed": i, "reference_seed": j, "n_notes": len(common),
                         "mean_difference": float(values.mean()) if common else None,
                         "higher": int((values > 0).sum()), "lower": int((values < 0).sum())})
    if not by_note:
        return None
    notes = sorted(by_note)
    per_note = np.array([np.mean(by_note[n]) for n in notes], dtype=float)
    iv = bootstrap_mean(per_note, n_resamples=stats.bootstrap_resamples, seed=stats.bootstrap_seed,
                        confidence=stats.confidence,
                        statistic=(f"mean over the {len(notes)} notes with at least one seed pair of the per-note mean "
                                   f"of the available pair differences ({len(pairs)} pair(s)), percentile bootstrap "
                                   f"over notes {stats.confidence:.0%} ({stats.bootstrap_resamples} resamples, "
                                   f"seed {stats.bootstrap_seed})"))
    sign, wilcoxon = sign_test(per_note), wilcoxon_signed_rank(per_note)
    return {"n_notes": len(notes), "notes": notes, "mean_difference": iv.estimate, "ci_low": iv.low,
            "ci_high": iv.high, "confidence": iv.confidence, "notes_higher": sign.n_positive,
            "notes_lower": sign.n_negative, "notes_equal": sign.n_zero, "sign_p": sign.p_value,
            "wilcoxon_p": wilcoxon.p_value, "seed_pairs": per_pair,
            "per_note_difference": dict(zip(notes, per_note.tolist())), "statistic": iv.statistic}
