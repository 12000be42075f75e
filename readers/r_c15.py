"""R-C15 (Sec. 3.5, App. H, Tables 36-37): a second teacher of another architecture family, through the
first teacher's instrument unchanged.

Stages TR-QWQ, HD-QWQ and HD-QWQ-locus run the characterization of R-C1-R-C6 with the second teacher
(params `models.teacher_qwq`: QwQ-32B, a Qwen2 model of 64 layers; the demo's a 6-layer Qwen2 beside its
4-layer Qwen3 teacher) on TR-006's notes and prompt.  This reader reads those runs with the first
teacher's readers (R-C3, R-C4, R-C6), unchanged, and keeps App. H's numbers under a `qwq_` prefix:

* knock-in of its own global top-k (readers.knockin_k, the paper's top-40) per phase, the random-k floor
  (max over phases), its within-region top-k at readers.necessity_k (the paper's top-8), and the fewest
  notes, over phases and both sizes, where the global set beats random;
* the exact contrastive refinement: the P2C I_c of the heads params `second_teacher.named_heads`
  names (rank 1 and 2 in the run; the paper's L63H32 and L52H33), the leader's with a percentile
  bootstrap interval over notes (`..._interval`, beside the paper's printed [0.58, 0.76]); first-order against exact, the median per-event Pearson; the chapter
  and contrastive top-k (instrument.calibration.pool_k) shared;
* the prose locus: the window share of chapter mentions, the median locus distance, the prose-time
  set's median layer (of its top pool_k) and its top-k overlap with the emission set, its attention
  share on the note at the locus, and [window-only, suffix-only] necessity of the emission and prose-time
  top-k at the larger locus size (locus.k, the paper's 16).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.instrument.global_sets import load_head_sets, phase_scores, ranking
from mistill.instrument.readout import HEAD_NAME, PHASES, head_index, run_reader, value
from mistill.locus.passes import LocusSettings
from mistill.repro.reader_module import load_reader
from mistill.stats import StatsParams, bootstrap_mean

READER = "readers/r_c15.py"
RUN = {"traces": "artifacts/TR-QWQ/traces.jsonl", "instrument": "artifacts/HD-QWQ", "locus": "artifacts/HD-QWQ-locus"}
PHASE_NAMES = {"P1": "p1", "P2": "p2_within_region", "P2C": "p2c"}
ROLES = ("exact_p2c_top", "exact_p2c_second")


def first_teacher_reader(name: str):
    """The first teacher's reader `name` (r_c3, r_c4, r_c6), loaded from beside this file."""
    return load_reader(Path(__file__).with_name(f"{name}.py"))


def second_teacher_params(params: dict) -> dict:
    """The profile's params with the second teacher's runs where the first teacher's are (the second teacher's
    run has no isolation pass)."""
    rest = {k: v for k, v in params.items() if k != "isolation"}
    return {**rest, "instrument": {**params["instrument"], "traces": RUN["traces"], "out_dir": RUN["instrument"]},
            "locus": {**params["locus"], "out_dir": RUN["locus"]}}


def named_heads(params: dict) -> dict[str, str]:
    """params second_teacher.named_heads: the heads App. H names, by role."""
    heads = (params.get("second_teacher") or {}).get("named_heads") or {}
    bad = [r for r in ROLES if not (isinstance(heads.get(r), str) and HEAD_NAME.match(heads[r]))]
    if bad:
        raise UserError(f"params.yaml second_teacher.named_heads: name the {', '.join(bad)} head(s) as "
                        "l<layer>h<head>, as the second teacher's run ranks them")
    return {r: heads[r] for r in ROLES}


def sizes(params: dict) -> dict[str, int]:
    readers, locus = params["readers"], LocusSettings.from_params(params)
    return {"knockin": readers["knockin_k"], "necessity": readers["necessity_k"],
            "pool": params["instrument"]["calibration"]["pool_k"], "overlap": locus.overlap_k[0],
            "locus": max(locus.k)}


def keys(params: dict) -> list[str]:
    """Every key this reader writes under `params` (set sizes and heads from params)."""
    k, heads = sizes(params), named_heads(params)
    both = "_".join(f"k{n}" for n in sorted({k["necessity"], k["knockin"]}))
    return [*(f"qwq_knockin_top{k['knockin']}_{p}" for p in PHASE_NAMES.values()),
            f"qwq_knockin_random{k['knockin']}_max", "qwq_window_locus_share",
            f"qwq_prosetime_top{k['overlap']}_emission_top{k['overlap']}_overlap", f"qwq_notes_above_random_{both}",
            f"qwq_exact_p2c_top_{heads['exact_p2c_top']}", f"qwq_exact_p2c_top_{heads['exact_p2c_top']}_interval",
            f"qwq_exact_p2c_second_{heads['exact_p2c_second']}",
            "qwq_firstorder_exact_pearson", f"qwq_chapter_contrastive_top{k['pool']}_shared",
            f"qwq_within_region_top{k['necessity']}_knockin", "qwq_median_locus_distance", "qwq_prosetime_median_layer",
            "qwq_prosetime_note_share", f"qwq_emission_top{k['locus']}_window_suffix",
            f"qwq_prosetime_top{k['locus']}_window_suffix"]


def exact_p2c_values(run: Path, heads: dict[str, str], stats: StatsParams) -> dict:
    """The named heads' P2C I_c (mean over notes; the leader's with its bootstrap interval over notes)."""
    sets_path, per_note_path = run / "head_sets_contrast.json", run / "calibration.npz"
    sets = load_head_sets(sets_path)
    n_layers, n_heads = sets["n_layers"], sets["n_heads"]
    scores = phase_scores(sets, "P2C")
    order = list(ranking(scores))
    per_note = np.load(per_note_path)["ic_P2C"]
    v = {}
    for role, head in heads.items():
        i = head_index(head, n_layers, n_heads)
        rank = order.index(i) + 1
        name = f"qwq_{role}_{head}"
        v[name] = value(float(scores[i]), f"nats, mean P2C I_c over notes (exact-refined ranking: rank {rank} of "
                                          f"{n_layers * n_heads})", sets_path)
        if role == "exact_p2c_top":
            column = per_note[:, i][np.isfinite(per_note[:, i])]
            interval = bootstrap_mean(column, n_resamples=stats.bootstrap_resamples, seed=stats.bootstrap_seed,
                                      confidence=stats.confidence)
            v[f"{name}_interval"] = value([interval.low, interval.high], f"nats, {stats.confidence:.0%} percentile "
                                          f"bootstrap interval over {interval.n} notes of the mean", per_note_path)
    return v


def prosetime_median_layer(run: Path, pool: int) -> dict:
    sets_path = run / "head_sets_locus.json"
    sets = load_head_sets(sets_path)
    top = ranking(phase_scores(sets, "prose"))[:pool]
    layers = top // sets["n_heads"]
    return value(float(np.median(layers)), f"median layer (0-based) of the prose-time top-{pool}, of "
                                           f"{sets['n_layers']} layers", sets_path)


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    k, heads = sizes(params), named_heads(params)
    qwq = second_teacher_params(params)
    c3, c3_inputs = first_teacher_reader("r_c3").compute_values(qwq)
    c4, _ = first_teacher_reader("r_c4").compute_values(qwq)
    c6, c6_inputs = first_teacher_reader("r_c6").compute_values(qwq)
    kk, nk = k["knockin"], k["necessity"]
    v: dict = {}
    for phase, name in PHASE_NAMES.items():
        v[f"qwq_knockin_top{kk}_{name}"] = c3[f"knockin_top{kk}_{phase.lower()}"]
    randoms = [c3[f"knockin_random{kk}_{p.lower()}"] for p in PHASES]
    v[f"qwq_knockin_random{kk}_max"] = value(max(r["value"] for r in randoms),
                                             f"max over phases of the random-{kk} knock-in medians", randoms[0]["artifact"])
    v[f"qwq_within_region_top{nk}_knockin"] = c3[f"knockin_top{nk}_p2"]
    counts = [c3[f"notes_knockin_above_random_{p.lower()}_k{n}"] for p in PHASES for n in sorted({nk, kk})]
    both = "_".join(f"k{n}" for n in sorted({nk, kk}))
    v[f"qwq_notes_above_random_{both}"] = value(
        min(c["value"] for c in counts), f"fewest notes, over phases and k in {sorted({nk, kk})}, where the global "
        "top-k knock-in is above random (of the notes with events of the phase)", counts[0]["artifact"])
    v.update(exact_p2c_values(Path(RUN["instrument"]), heads, StatsParams.from_params(params)))
    v["qwq_firstorder_exact_pearson"] = c4["p2c_firstorder_vs_exact_per_event_corr"]
    v[f"qwq_chapter_contrastive_top{k['pool']}_shared"] = c4[f"top{k['pool']}_shared_chapter_contrastive"]
    v["qwq_window_locus_share"] = c6["window_locus_share"]
    v["qwq_median_locus_distance"] = c6["median_locus_distance"]
    v["qwq_prosetime_median_layer"] = prosetime_median_layer(Path(RUN["locus"]), k["pool"])
    overlap = c6["prosetime_emission_overlap_" + "_".join(f"top{n}" for n in LocusSettings.from_params(qwq).overlap_k)]
    v[f"qwq_prosetime_top{k['overlap']}_emission_top{k['overlap']}_overlap"] = value(
        overlap["value"][0], f"count of {k['overlap']} heads the prose-time and emission top-{k['overlap']} share",
        overlap["artifact"])
    v["qwq_prosetime_note_share"] = c6["prosetime_note_attention_share"]
    large = k["locus"]
    for name, label in (("emission", "emission"), ("prosetime", "prose-time")):
        window = c6[f"{name}_top{large}_window_only_necessity" if name == "emission" else f"{name}_top{large}_window_only"]
        suffix = c6[f"{name}_top{large}_suffix_only"]
        v[f"qwq_{name}_top{large}_window_suffix"] = value(
            [window["value"], suffix["value"]], f"[window-only, suffix-only] share of the forced margin removed by the "
            f"{label} top-{large}, medians over notes", window["artifact"])
    return v, [*c3_inputs, *c6_inputs, Path(RUN["instrument"]) / "head_sets_contrast.json",
               Path(RUN["instrument"]) / "calibration.npz", Path(RUN["locus"]) / "head_sets_locus.json"]


def main() -> int:
    return run_reader("R-C15", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
