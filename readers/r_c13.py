"""R-C13 (App. C "Patients", App. D Table 15): the characterization with patients as the unit.

* Re-aggregation: HD-001's knock-in rows summarised again with each note mapped to its patient
  (`knockin.summarize(..., units=)`: a patient's prompt variants' per-note means averaged first).
  The per-trace summary is recomputed first and must equal faithfulness2.json, else the reader
  stops (the paper's "fails if the 100-trace cells stop matching").  Reported: the largest move of
  any knock-in median (every phase, bin and set), of any P1 and P2C necessity median, and the
  range of the P2 necessity medians' change over the bins (top sets).
* Split halves: the patients split into random halves (`stats.split_half_stability`, 200 splits,
  seed 0), each half ranking heads by its mean calibrated I_c (calibration.npz), HD-001 and the
  shortlist run HD-002.  Reconstructed from App. D's prose (Table 15's body was lost): the top-k
  overlap of the halves at params readers.split_half_k (the paper's 8 and 40), the first on the
  chapter ranking (P1), the second as the range over phases; the halves' Spearman as the range over
  HD-001's phases, and the shortlist run's lowest phase median (the paper's P2C, 0.63).
* Exact carry (App. D "Stability", reconstructed from its one sentence: 0.83 to 1.00): on HD-001's
  exact contrastive effects, each note's exact-merged P2C importance (`stats.heads.exact_merged`: at
  each P2C event the first-order I of attr.npz with the nominees' exact single-head effects of
  patch2.jsonl `p2c_exact` in their place, averaged over the note's patched events; a head never
  patched in the note keeps its mean first-order I).  Over the same 200 patient halves, each half's
  top-k (the smaller readers.split_half_k) is chosen by its mean calibrated I_c (the contrast ranking)
  or by its mean exact-merged importance, and read on the other half: the share of the other half's
  own best k's summed exact-merged importance it carries (`stats.heads.split_half_carry`).  Reported:
  the medians over both directions of every split, chosen by the contrast ranking, then by the exact.

* Read side: the read-side lifts of Table 16 (each phase's top-k, random panel and bottom-k, HD-001-read)
  re-aggregated by patient; the largest move of a median.
* Suffix robustness (App. F, Table 25): the walk-back again under each other wording of params
  locus.suffix_rerun (stage HD-001-locus-suffix, the paper's suffixes D and A) on HD-001's first notes,
  against the main wording's locus (HD-001-locus) mention by mention: the median locus distance under
  each wording and the median of those, the category agreement, the window shares, and how many mentions
  decided in the window under both wordings lie within one walk-back step of each other.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.instrument.knockin import SET_KINDS, summarize
from mistill.instrument.read_passes import ReadSide
from mistill.instrument.readout import (
    PHASES,
    instrument_dir,
    load_json,
    run_reader,
    value,
)
from mistill.io import read_jsonl, read_npz
from mistill.locus.passes import LocusSettings
from mistill.locus.readout import LocusRun, compare_wordings
from mistill.models.traces import TRACE_SETS
from mistill.models.world_files import data_dir
from mistill.stats import split_half_stability
from mistill.stats.heads import SplitHalfCarry, exact_merged, split_half_carry

READER = "readers/r_c13.py"
N_SPLITS, SPLIT_SEED = 200, 0
MEASURES = ("necessity", "knockin")


def split_half_k(params: dict) -> tuple[int, int]:
    ks = (params.get("readers") or {}).get("split_half_k")
    if not (isinstance(ks, list) and len(ks) == 2 and all(isinstance(k, int) and k > 0 for k in ks) and ks[0] < ks[1]):
        raise UserError(f"params.yaml readers.split_half_k: two increasing set sizes such as [8, 40], got {ks!r}")
    return ks[0], ks[1]


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params`."""
    small, large = split_half_k(params)
    return ["knockin_median_shift_patient_unit_max", "necessity_median_shift_patient_unit_max_p1_p2c",
            "p2_necessity_rise_patient_unit", f"split_half_top{small}_overlap", f"split_half_top{large}_overlap",
            "split_half_spearman_full", "split_half_spearman_shortlist_p2c_min", f"split_half_exact_top{small}_carry",
            "patient_units_notes_patients", "readside_lift_shift_max", *suffix_keys(params)]


def suffix_variants(params: dict) -> list[str]:
    """The other wordings' names, in params order (the paper's D, A)."""
    return list((((params.get("locus") or {}).get("suffix_rerun") or {}).get("variants") or {}))


def suffix_keys(params: dict) -> list[str]:
    names = [n.lower() for n in suffix_variants(params)]
    if not names:
        return []
    return ["median_locus_distance_all_suffixes", "median_locus_distance_b_d_a",
            *(f"category_agreement_suffix_{n}" for n in names), "window_share_suffix_" + "_".join(names) + "_b",
            "same_step_agreement", "same_step_median_distance_difference", "suffix_rerun_notes_mentions"]


def patients(params: dict) -> dict[str, str]:
    """note -> patient of the characterization notes (the notes files of TR-006)."""
    from mistill.world.notes import load_notes

    out = {}
    for name in TRACE_SETS["TR-006"].files:
        out.update({n.note_id: n.patient_id for n in load_notes(data_dir(params) / name)})
    return out


def _cells(summary: dict):
    """(phase, bin, measure, set kind) -> median of every cell of a knock-in summary."""
    return {(p, k, m, s): cell[m][s]["median"] for p, entry in summary["phases"].items()
            for k, cell in entry["bins"].items() for m in MEASURES if m in cell
            for s in SET_KINDS if s in cell[m]}


def _split_halves(run: Path, units: dict[str, str], ks: tuple[int, int]) -> dict[str, object]:
    cal = read_npz(run / "calibration.npz", "calibration arrays")
    out = {}
    for phase in PHASES:
        if f"ic_{phase}" not in cal:
            continue
        notes = cal[f"notes_{phase}"].tolist()
        missing = [n for n in notes if n not in units]
        if missing:
            raise UserError(f"{run}: note {missing[0]} has no patient in the characterization notes")
        out[phase] = split_half_stability(cal[f"ic_{phase}"], [units[n] for n in notes], n_splits=N_SPLITS,
                                          seed=SPLIT_SEED, ks=ks, full_k=ks[1])
    if not out:
        raise UserError(f"{run}/calibration.npz: no per-note I_c; run the calibration pass first")
    return out


def exact_merged_p2c(run: Path, notes: list[str]) -> np.ndarray:
    """(notes, heads): each note's exact-merged P2C importance from its attr.npz (first-order I at every
    event) and patch2.jsonl (the exact patches of each P2C event's nominees, `p2c_exact`)."""
    out = []
    for note in notes:
        attr = read_npz(run / note / "attr.npz", "attribution arrays")
        at_p2c = attr["kinds"] == "P2C"
        rows = [r for r in read_jsonl(run / note / "patch2.jsonl") if r.get("kind") == "P2C"]
        # both follow the note's events, so the n-th P2C row is the n-th P2C event (two events may share
        # a position, contrasting against different siblings)
        if [int(r["pos"]) for r in rows] != attr["positions"][at_p2c].tolist():
            raise UserError(f"{run / note}: the knock-in rows' P2C events differ from attr.npz's; rerun the "
                            "knock-in pass")
        first = attr["first_order"][at_p2c].reshape(len(rows), -1)
        patches = [(r["p2c_exact"]["heads"], r["p2c_exact"]["exact"]) if r.get("p2c_exact") else None for r in rows]
        if not any(patches):
            raise UserError(f"{run / note}/patch2.jsonl: no P2C event patched exactly; rerun the knock-in pass")
        out.append(exact_merged(first, patches))
    return np.stack(out)


def _exact_carry(run: Path, units: dict[str, str], k: int) -> tuple[SplitHalfCarry, list[Path]] | None:
    """The halves' exact P2C carry, or None where the run ranks no P2C or patched none exactly."""
    cal = read_npz(run / "calibration.npz", "calibration arrays")
    if "ic_P2C" not in cal:
        return None
    notes = cal["notes_P2C"].tolist()
    if not any(r.get("p2c_exact") for n in notes for r in read_jsonl(run / n / "patch2.jsonl")):
        return None
    carry = split_half_carry(cal["ic_P2C"], exact_merged_p2c(run, notes), [units[n] for n in notes], k=k,
                             n_splits=N_SPLITS, seed=SPLIT_SEED)
    return carry, [run / n / "attr.npz" for n in sorted(notes)]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    hd = instrument_dir(params)
    faith_path = hd / "faithfulness2.json"
    faith = load_json(faith_path)
    units = patients(params)
    rows = {p.parent.name: read_jsonl(p) for p in sorted(hd.glob("*/patch2.jsonl"))}
    if not rows:
        raise UserError(f"{hd}: no knock-in rows (run `mistill instrument all` first)")
    per_trace = summarize(rows, bins=faith["bins"], min_range=faith["min_range"])
    stored = _cells(faith)
    if _cells(per_trace) != stored:
        raise UserError(f"{faith_path}: its cells differ from the knock-in rows' summary; rerun the knock-in pass")
    per_patient = _cells(summarize(rows, bins=faith["bins"], min_range=faith["min_range"], units=units))
    shift = {key: per_patient[key] - median for key, median in stored.items()}
    n_patients = len({units[n] for n in rows})
    where = f"{hd}/*/patch2.jsonl"
    v = {
        "knockin_median_shift_patient_unit_max": value(
            max(abs(d) for (_, _, m, _), d in shift.items() if m == "knockin"),
            f"max abs shift of a knock-in median (every phase, bin and set) with {n_patients} patients as units "
            f"instead of {len(rows)} notes", where),
        "necessity_median_shift_patient_unit_max_p1_p2c": value(
            max(abs(d) for (p, _, m, _), d in shift.items() if m == "necessity" and p in ("P1", "P2C")),
            "max abs shift of the P1 and P2C necessity medians with patients as units", where),
        "p2_necessity_rise_patient_unit": value(
            [min(d for (p, _, m, s), d in shift.items() if (p, m, s) == ("P2", "necessity", "top")),
             max(d for (p, _, m, s), d in shift.items() if (p, m, s) == ("P2", "necessity", "top"))],
            "range over bins of the change of the P2 necessity median (top sets) with patients as units", where),
        "patient_units_notes_patients": value([len(rows), n_patients], "count of notes and of patients", where),
    }
    small, large = split_half_k(params)
    full = _split_halves(hd, units, (small, large))
    # the shortlist run: where the distillation's teacher head sets come from (HD-002)
    shortlist_dir = Path((params.get("distill") or {}).get("teacher_head_sets") or hd / "none").parent
    art = f"{hd}/calibration.npz"
    splits = f"{N_SPLITS} random patient halves, seed {SPLIT_SEED}"
    if "P1" in full:
        v[f"split_half_top{small}_overlap"] = value(full["P1"].median_overlap[small], f"median over {splits} of the "
                                                     f"top-{small} overlap of the halves' P1 rankings", art)
    overlaps = [s.median_overlap[large] for s in full.values()]
    v[f"split_half_top{large}_overlap"] = value([min(overlaps), max(overlaps)], f"range over phases of the median "
                                                f"over {splits} of the top-{large} overlap of the halves", art)
    rhos = [s.median_spearman for s in full.values()]
    v["split_half_spearman_full"] = value([min(rhos), max(rhos)], f"range over phases of the median over {splits} "
                                          "of the Spearman of the halves' rankings, full inventory", art)
    inputs = [faith_path, *(hd / n / "patch2.jsonl" for n in rows), hd / "calibration.npz"]
    exact = _exact_carry(hd, units, small)
    if exact is not None:
        carry, attr_inputs = exact
        v[f"split_half_exact_top{small}_carry"] = value(
            [carry.median_by_ranking, carry.median_by_importance], f"share of the other half's own best {small} by "
            "summed exact P2C importance (exact where patched, first order where not) that a half's top-"
            f"{small} carries, picked by the contrast ranking (I_c) and by the exact ranking; medians over {splits}, "
            "and over which half picks", f"{hd}/*/attr.npz, {hd}/*/patch2.jsonl, {hd}/calibration.npz")
        inputs += attr_inputs
    if (shortlist_dir / "calibration.npz").is_file():
        short = _split_halves(shortlist_dir, units, (small, large))
        phase = min(short, key=lambda p: short[p].median_spearman)
        v["split_half_spearman_shortlist_p2c_min"] = value(
            short[phase].median_spearman, f"lowest over phases ({phase}) of the median over {splits} of the "
            "Spearman of the halves' rankings, shortlist traces", f"{shortlist_dir}/calibration.npz")
        inputs.append(shortlist_dir / "calibration.npz")
    read_dir = ReadSide.from_params(params).pass_dir("readside")
    if (read_dir / "read_panel.json").is_file():
        shift, n = readside_lift_shift(read_dir, units)
        v["readside_lift_shift_max"] = value(shift, f"max abs shift of a read-side lift median (each phase's top-k, "
                                             f"random panel and bottom-k) with {n} patients as units",
                                             f"{read_dir}/*/read.jsonl")
        inputs += [read_dir / "read_panel.json", *sorted(read_dir.glob("*/read.jsonl"))]
    if suffix_variants(params):
        suffix_v, suffix_inputs = suffix_values(params)
        v.update(suffix_v)
        inputs += suffix_inputs
    return v, inputs


def suffix_values(params: dict) -> tuple[dict, list[Path]]:
    """The walk-back under each other wording against the main one (App. F "suffix robustness", Table 25)."""
    settings = LocusSettings.from_params(params)
    names = suffix_variants(params)
    # <wording>/<note>/locus.json, stage HD-001-locus-suffix
    rerun_dir = Path((params.get("paths") or {}).get("artifacts", "artifacts")) / "HD-001-locus-suffix"
    runs = {name: LocusRun.load(rerun_dir / name, ablations=False) for name in names}
    main = LocusRun.load(settings.out_dir, ablations=False)
    notes = sorted({b["note_id"] for run in runs.values() for b in run.bodies})
    if any(sorted(b["note_id"] for b in run.bodies) != notes for run in runs.values()):
        raise UserError(f"{rerun_dir}: the wordings were re-run on different notes; rerun stage HD-001-locus-suffix")
    base = [b for b in main.bodies if b["note_id"] in notes]
    compared = {name: compare_wordings(base, runs[name].bodies, settings.step) for name in names}
    base_window = [m for b in base for m in b["mentions"] if m["outcome"] == "window"]
    if not base_window or any(not c.window_distances for c in compared.values()):
        raise UserError("a wording decides no chapter mention in the window; no locus distance to compare")
    medians = [float(np.median([m["distance"] for m in base_window]))]
    medians += [float(np.median(compared[name].window_distances)) for name in names]
    mentions = sum(len(b["mentions"]) for b in base)
    on = f"{len(notes)} notes, {mentions} chapter mentions"
    art = f"{rerun_dir}/*/*/locus.json"
    both = sum(c.both_window for c in compared.values())
    differences = [d for c in compared.values() for d in c.distance_differences]
    order = "main, " + ", ".join(names)
    v = {"median_locus_distance_all_suffixes": value(float(np.median(medians)), f"tokens, median of the median "
                                                     f"locus distances under the {len(medians)} wordings; {on}", art),
         "median_locus_distance_b_d_a": value(medians, f"tokens, median locus distance under each wording ({order})",
                                              art),
         "window_share_suffix_" + "_".join(n.lower() for n in names) + "_b": value(
             [compared[n].window_share for n in names] + [100.0 * len(base_window) / mentions],
             f"percent of chapter mentions decided in the window ({', '.join(names)}, main); {on}", art),
         "same_step_agreement": value(100.0 * sum(c.within_step for c in compared.values()) / both if both else
                                      float("nan"), f"percent of {both} mentions decided in the window under the main "
                                      f"wording and another within one {settings.step}-token step", art),
         "same_step_median_distance_difference": value(float(np.median(differences)) if differences else float("nan"),
                                                       "tokens, median difference of their distances", art),
         "suffix_rerun_notes_mentions": value([len(notes), mentions], "notes and chapter mentions re-run", art)}
    for name in names:
        v[f"category_agreement_suffix_{name.lower()}"] = value(
            compared[name].category_agreement, f"percent of {compared[name].mentions} chapter mentions with the same "
            f"outcome under wording {name} and the main one", art)
    inputs = [*main.loci, *(p for run in runs.values() for p in run.loci)]
    return v, [p for p in inputs if p.parent.name in notes]


def readside_lift_shift(read_dir: Path, units: dict[str, str]) -> tuple[float, int]:
    """(largest |median over patients - median over notes| of a Table 16 group lift, patients)."""
    from mistill.instrument import read_readout as rr

    summary, rows = rr.load_reads(read_dir)
    panel = summary["panel"]
    groups = [(phase, heads) for phase, heads in panel["top"].items()]
    groups += [(phase, heads) for phase, heads in panel["bottom"].items()]
    groups += [(phase, panel["random"]) for phase in panel["top"]]
    shifts = []
    for phase, heads in groups:
        per_note = rr.group_lift_per_note(rows, phase, heads)
        if per_note:
            shifts.append(abs(rr.median(rr.by_unit(per_note, units)) - rr.median(per_note)))
    return max(shifts), len({units[n] for n in rows})


def main() -> int:
    return run_reader("R-C13", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
