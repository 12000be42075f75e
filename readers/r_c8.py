"""R-C8 (App. C, Table 9): the P2 ranking with the gradient graph intact against HD-001's detached ranking.

The intact re-run (stage HD-001-intact, `mistill.instrument.intact`) attributes the first notes of the
corpus again with every path kept and exact P2 patches of each event's nominees, and calibrates against
the NULL events as HD-001 does.  On the same notes (HD-001's per-note I_c, calibration.npz):

* the Spearman over every head of the two mean P2 I_c, their top-k overlap at the pool size
  (instrument.calibration.pool_k, the paper's 40) and at the necessity size (readers.necessity_k, its 8),
  and the chapter (P1) and contrastive (P2C) top-k overlaps;
* within the re-run, first-order against exact-refined importance at P2 (raw I, per note the mean over
  its P2 events of the vector that is exact where a head was patched and first-order elsewhere; then
  the mean over notes): Spearman over heads and top-k overlap;
* the P2 ranks (1 = first) under both hooks of the heads params readers.named_heads.intact_p2 names.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.instrument.intact import IntactRerun
from mistill.instrument.passes import load_attr
from mistill.instrument.readout import (
    head_index,
    instrument_dir,
    load_json,
    reader_settings,
    run_reader,
    value,
)
from mistill.io import read_npz
from mistill.stats import spearman_over_heads, top_k_overlap

READER = "readers/r_c8.py"


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params` (sizes and heads from params)."""
    pool_k = params["instrument"]["calibration"]["pool_k"]
    small = reader_settings(params).necessity_k
    notes = IntactRerun.from_params(params).notes
    heads = reader_settings(params).named_heads.intact_p2
    out = ["p2_spearman_intact_vs_detached", f"p2_top{pool_k}_overlap", f"p2_top{small}_overlap",
           "intact_firstorder_vs_exact_spearman", f"intact_firstorder_vs_exact_top{pool_k}_overlap",
           f"chapter_contrastive_top{pool_k}_overlap_{notes}notes"]
    out += [f"named_head_ranks_intact_{'_'.join(heads)}"] if heads else []
    return list(dict.fromkeys(out))       # a profile whose two sizes agree names one key


def mean_ic(path: Path, phase: str, notes: list[str] | None = None) -> tuple[np.ndarray, list[str]]:
    """Mean over `notes` (default: all) of the per-note calibrated I_c of a run's calibration.npz."""
    cal = read_npz(path, "calibration arrays")
    ids = cal[f"notes_{phase}"].tolist()
    rows = [ids.index(n) for n in notes] if notes is not None else list(range(len(ids)))
    if notes is not None and len(rows) != len(notes):
        raise UserError(f"{path}: notes of the re-run missing from {phase}")
    return cal[f"ic_{phase}"][rows].astype(float).mean(axis=0), [ids[i] for i in rows]


def ranks(scores: np.ndarray) -> np.ndarray:
    """1-based rank of every head by descending score (ties by index, as the global sets order them)."""
    order = np.argsort(-scores, kind="stable")
    out = np.empty(scores.size, dtype=int)
    out[order] = np.arange(1, scores.size + 1)
    return out


def exact_refined(run: Path, notes: list[str], kind: str = "P2") -> tuple[np.ndarray, np.ndarray]:
    """(first-order, exact-refined) raw importance at `kind`: per note the mean over its events, then over notes."""
    first, merged = [], []
    for note in notes:
        arrays = load_attr(run / note / "attr.npz")
        sel = arrays["kinds"] == kind
        if not sel.any():
            continue
        fo = arrays["first_order"][sel].reshape(sel.sum(), -1)
        ex = arrays["exact"][sel].reshape(sel.sum(), -1)
        first.append(fo.mean(axis=0))
        merged.append(np.where(np.isnan(ex), fo, ex).mean(axis=0))
    if not first:
        raise UserError(f"{run}: no {kind} events in the re-run's attribution")
    return np.mean(first, axis=0), np.mean(merged, axis=0)


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    rerun = IntactRerun.from_params(params)
    intact_dir, detached_dir = Path(rerun.out_dir), instrument_dir(params)
    pool_k = params["instrument"]["calibration"]["pool_k"]
    settings = reader_settings(params)
    small = settings.necessity_k
    intact_p2, notes = mean_ic(intact_dir / "calibration.npz", "P2")
    detached_p2, _ = mean_ic(detached_dir / "calibration.npz", "P2", notes)
    art = f"{intact_dir}/calibration.npz, {detached_dir}/calibration.npz"
    on = f"{len(notes)} notes"
    v = {
        "p2_spearman_intact_vs_detached": value(spearman_over_heads(intact_p2, detached_p2).rho,
                                                f"Spearman over {intact_p2.size} heads of mean P2 I_c, intact "
                                                f"against detached, {on}", art),
        f"p2_top{pool_k}_overlap": value(top_k_overlap(intact_p2, detached_p2, pool_k),
                                         f"count of {pool_k} heads in both P2 top-{pool_k}, {on}", art),
        f"p2_top{small}_overlap": value(top_k_overlap(intact_p2, detached_p2, small),
                                        f"count of {small} heads in both P2 top-{small}, {on}", art),
    }
    overlaps = []
    for phase in ("P1", "P2C"):
        a, ids = mean_ic(intact_dir / "calibration.npz", phase)
        b, _ = mean_ic(detached_dir / "calibration.npz", phase, ids)
        overlaps.append(top_k_overlap(a, b, pool_k))
    v[f"chapter_contrastive_top{pool_k}_overlap_{rerun.notes}notes"] = value(
        overlaps, f"counts of {pool_k} heads in both top-{pool_k}, intact against detached, [P1, P2C], {on}", art)
    first, merged = exact_refined(intact_dir, notes)
    attr_art = f"{intact_dir}/*/attr.npz"
    v["intact_firstorder_vs_exact_spearman"] = value(
        spearman_over_heads(first, merged).rho, f"Spearman over {first.size} heads of first-order and exact-refined "
        f"raw P2 importance, intact hook, {on}", attr_art)
    v[f"intact_firstorder_vs_exact_top{pool_k}_overlap"] = value(
        top_k_overlap(first, merged, pool_k), f"count of {pool_k} heads in both top-{pool_k} of first-order and "
        "exact-refined raw P2 importance, intact hook", attr_art)
    heads = settings.named_heads.intact_p2
    if heads:
        sets = load_json(detached_dir / "head_sets_contrast.json")
        flat = [head_index(h, sets["n_layers"], sets["n_heads"]) for h in heads]
        intact_ranks, detached_ranks = ranks(intact_p2), ranks(detached_p2)
        v[f"named_head_ranks_intact_{'_'.join(heads)}"] = value(
            [int(intact_ranks[i]) for i in flat], f"ranks in the intact P2 ranking of {', '.join(heads)} "
            f"(detached: {', '.join(str(int(detached_ranks[i])) for i in flat)}), {on}", art)
    inputs = [intact_dir / "calibration.npz", detached_dir / "calibration.npz",
              *(intact_dir / n / "attr.npz" for n in notes)]
    inputs += [detached_dir / "head_sets_contrast.json"] if heads else []
    return v, inputs


def main() -> int:
    return run_reader("R-C8", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
