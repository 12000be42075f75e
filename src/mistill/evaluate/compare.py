"""Own-heads readouts of two arms compared, seed-matched and note-clustered (App. K "Statistics", L).

Per arm and seed, the per-note values of a readout (M4: a note's mean gated knock-in recovery
of the own top-k at one phase; M2: a note's region lift of the own top-k) come from the
`M6/<arm>-s<seed>/` artifacts of the own-heads chain.  Then

* per-seed medians over notes (Table 3's cells; their mean over seeds is "the mean of seed
  medians");
* Mistill against Vanilla CoT-KD: seed i against seed i (a one-seed reference pairs with every
  seed), per note the mean of the seed-pair differences d_n, a two-sided sign test and a Wilcoxon
  signed-rank test over notes and a percentile bootstrap interval of the mean of d_n
  (`mistill.stats.note_clustered_comparison`); the pooled note-pair counts are descriptive.

Only notes that carry the readout in every seed of both arms enter a comparison.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.io import read_json, read_jsonl
from mistill.stats import StatsParams, knock_in_recovery, note_clustered_comparison
from mistill.stats.checks import StatsInputError
from mistill.stats.effects import note_means

PHASES = ("P2C", "P2", "P1")


# ---- per-note values from the chain's artifacts --------------------------------------------------------


def labelled_seed_dirs(parent: str | Path, label: str, marker: str) -> dict[int, Path]:
    """seed -> <parent>/<label>-s<seed>, every such directory holding the file `marker`, by seed."""
    pattern = re.compile(rf"^{re.escape(label)}-s(\d+)$")
    out = {}
    for path in Path(parent).glob(f"{label}-s*"):
        m = pattern.match(path.name)
        if m and (path / marker).exists():
            out[int(m.group(1))] = path
    return dict(sorted(out.items()))


def seed_dirs(artifacts: str | Path, arm: str) -> dict[int, Path]:
    """seed -> M6/<arm>-s<seed> directory holding faithfulness2.json."""
    out = labelled_seed_dirs(Path(artifacts) / "M6", arm, "faithfulness2.json")
    if not out:
        raise UserError(f"{artifacts}: no M6/{arm}-s<seed>/faithfulness2.json; run `mistill evaluate own-heads` first")
    return out


def knockin_rows(m6_dir: Path) -> dict[str, list[dict]]:
    """note -> patch2.jsonl rows, for the notes faithfulness2.json summarised."""
    summary = read_json(m6_dir / "faithfulness2.json", "knock-in summary")
    return {note: read_jsonl(m6_dir / note / "patch2.jsonl") for note in summary.get("notes", [])
            if (m6_dir / note / "patch2.jsonl").exists()}


def note_recovery(rows_by_note: Mapping[str, Sequence[dict]], *, phase: str, set_kind: str, k: int,
                  min_range: float = 1.0) -> dict[str, float]:
    """note -> mean over its gated events of R = (m_set - m_corr) / (m_all - m_corr)."""
    sel = [(note, r) for note, rows in rows_by_note.items() for r in rows
           if r["kind"] == phase and r.get("margin_all") is not None
           and str(k) in (r.get("knockin") or {}).get(set_kind, {})]
    if not sel:
        return {}
    rec = knock_in_recovery([r["knockin"][set_kind][str(k)] for _, r in sel], [r["margin_corr"] for _, r in sel],
                            [r["margin_all"] for _, r in sel], min_range=min_range)
    notes = [n for (n, _), ok in zip(sel, rec.passed) if ok]
    if not notes:
        return {}
    ids, means = note_means(rec.recovery, notes)
    return dict(zip(ids, means.tolist()))


def note_lift(m6_dir: Path, *, phase: str, panel: str = "top") -> dict[str, float]:
    """note -> the panel's M2 region lift (mean over heads of per-head medians over events)."""
    path = m6_dir / "readside.json"
    if not path.exists():
        return {}
    phases = read_json(path, "read-side summary")["phases"]
    per_note = phases.get(phase, {}).get("per_note", {}).get(panel, {})
    return {n: v["lift"] for n, v in per_note.items() if v.get("lift") is not None and np.isfinite(v["lift"])}


def arm_values(artifacts: str | Path, arm: str, readout: str, *, phase: str, k: int | None = None,
               set_kind: str = "top", min_range: float = 1.0) -> dict[int, dict[str, float]]:
    """seed -> {note: value} for readout 'm4' (knock-in recovery at k) or 'm2' (region lift)."""
    out = {}
    for seed, path in seed_dirs(artifacts, arm).items():
        if readout == "m4":
            try:
                out[seed] = note_recovery(knockin_rows(path), phase=phase, set_kind=set_kind, k=int(k),
                                          min_range=min_range)
            except StatsInputError as err:  # e.g. a NaN margin in a patch2.jsonl: name the arm's directory
                raise UserError(f"{path}: {phase} knock-in rows: {err}") from None
        elif readout == "m2":
            out[seed] = note_lift(path, phase=phase, panel="random" if set_kind == "random" else "top")
        else:
            raise UserError(f"unknown readout {readout!r} (m4 or m2)")
    return out


# ---- summaries and comparisons ---------------------------------------------------------------------------


def seed_medians(values_by_seed: Mapping[int, Mapping[str, float]]) -> dict:
    """Per-seed medians over notes and their mean over seeds (Table 3's cells)."""
    medians = {int(s): float(np.median(list(v.values()))) for s, v in values_by_seed.items() if v}
    return {"per_seed_median": medians, "n_notes": {int(s): len(v) for s, v in values_by_seed.items()},
            "mean_of_seed_medians": float(np.mean(list(medians.values()))) if medians else None}


def clustered(arm: Mapping[int, Mapping[str, float]], reference: Mapping[int, Mapping[str, float]],
              stats: StatsParams) -> dict | None:
    """Arm minus reference, seed-matched and note-clustered, on the notes every seed of both carries."""
    seeds = [v for v in (*arm.values(), *reference.values())]
    if not seeds or any(not v for v in seeds):
        return None
    notes = sorted(set.intersection(*(set(v) for v in seeds)))
    if not notes:
        return None
    result = note_clustered_comparison({s: [v[n] for n in notes] for s, v in arm.items()},
                                       {s: [v[n] for n in notes] for s, v in reference.items()},
                                       n_resamples=stats.bootstrap_resamples, seed=stats.bootstrap_seed,
                                       confidence=stats.confidence)
    iv = result.mean_difference
    return {"n_notes": result.n_notes, "notes": notes,
            "mean_difference": iv.estimate, "ci_low": iv.low, "ci_high": iv.high, "confidence": iv.confidence,
            "median_difference": result.median_difference,
            "notes_higher": result.sign.n_positive, "notes_lower": result.sign.n_negative,
            "notes_equal": result.sign.n_zero, "sign_p": result.sign.p_value,
            "wilcoxon_statistic": result.wilcoxon.statistic, "wilcoxon_p": result.wilcoxon.p_value,
            "pooled_note_pairs": {"n": result.pooled.n_note_pairs, "higher": result.pooled.n_positive,
                                  "lower": result.pooled.n_negative, "equal": result.pooled.n_zero},
            "seed_pairs": [{"arm_seed": p.arm_seed, "reference_seed": p.reference_seed,
                            "median_difference": p.median_difference, "higher": p.sign.n_positive,
                            "lower": p.sign.n_negative, "sign_p": p.sign.p_value} for p in result.seed_pairs],
            "per_note_difference": dict(zip(notes, result.per_note_difference.tolist())),
            "statistic": iv.statistic}


def compare_arms(artifacts: str | Path, arm: str, reference: str, *, k: int, stats: StatsParams,
                 min_range: float = 1.0, phases: Sequence[str] = PHASES, m2_phases: Sequence[str] = ("P2C", "P1")
                 ) -> dict:
    """Every readout of Table 3 / Table 45 for `arm` against `reference` (both M6 arm labels)."""
    out: dict = {"arm": arm, "reference": reference, "k": k, "min_range": min_range, "m4": {}, "m2": {}}
    for phase in phases:
        a = arm_values(artifacts, arm, "m4", phase=phase, k=k, min_range=min_range)
        r = arm_values(artifacts, reference, "m4", phase=phase, k=k, min_range=min_range)
        out["m4"][phase] = {"arm": seed_medians(a), "reference": seed_medians(r), "comparison": clustered(a, r, stats)}
    for phase in m2_phases:
        a = arm_values(artifacts, arm, "m2", phase=phase)
        r = arm_values(artifacts, reference, "m2", phase=phase)
        if any(a.values()) and any(r.values()):
            out["m2"][phase] = {"arm": seed_medians(a), "reference": seed_medians(r),
                                "comparison": clustered(a, r, stats)}
    return out
