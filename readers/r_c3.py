"""R-C3 (Tables 1, 10, 14): necessity and knock-in of the global sets against random, bottom-k and
the note's own ranking; medians over notes of per-note means; sign tests over notes.

Set sizes come from params: every bin of `instrument.knockin.bins` (the paper's 3, 8, 16, 40, 100),
Table 1's necessity and knock-in sizes from `readers.necessity_k` and `readers.knockin_k` (the
paper's top-8 and top-40).  The spread over notes (10th-90th percentile, notes above half) is read
at the necessity size, as App. D reads it at the chapter top-8.

App. D's isolation pass (stage HD-001-isolation, `mistill.instrument.isolation`; set sizes from params
`isolation.bins`, the paper's 3, 8, 16, 40, 100): per k, the median over notes of per-note means of P1
necessity under each note's own top-k, and beyond the paper the margin left when only that top-k is kept, as a
share of the clean margin (the paper: about -0.6 at every k).

Beyond the paper, where the teacher carries a planted mechanism (params
`models.teacher_training.planted.teacher`, `mistill.models.planted`): each phase's global ranking
scored against the planted set, recall at k = |planted| and every planted head's rank.
"""

from __future__ import annotations

from pathlib import Path

from mistill.errors import UserError
from mistill.instrument.global_sets import load_head_sets
from mistill.instrument.readout import (
    PHASES,
    instrument_dir,
    load_json,
    reader_settings,
    run_reader,
    value,
)
from mistill.models.planted import PLANTED_PHASES, PlantedHeads, planted_ranks, planted_recall

READER = "readers/r_c3.py"
SET_PREFIX = {"top": "{m}_top{k}_{p}", "random": "{m}_random{k}_{p}", "bottom": "{m}_bottom{k}_{p}",
              "own": "own_ranking_{m}_top{k}_{p}"}
MEASURES = ("necessity", "knockin")


def table1_sizes(params: dict) -> tuple[int, int]:
    """(necessity k, knock-in k) of Table 1; each must be one of the knock-in pass's bins."""
    settings = reader_settings(params)
    bins = list(params["instrument"]["knockin"]["bins"])
    for name, k in (("necessity_k", settings.necessity_k), ("knockin_k", settings.knockin_k)):
        if k not in bins:
            raise UserError(f"params.yaml readers.{name} {k} is not one of instrument.knockin.bins {bins}")
    return settings.necessity_k, settings.knockin_k


def planted_section(params: dict) -> dict | None:
    """params `models.teacher_training.planted.teacher`: the teacher's planted sets, if its profile trains it
    with one."""
    training = (params.get("models") or {}).get("teacher_training") or {}
    return (training.get("planted") or {}).get("teacher") or None


def planted_keys(params: dict) -> list[str]:
    if planted_section(params) is None:
        return []
    return [f"planted_{m}_{p.lower()}" for p in PLANTED_PHASES for m in ("recall", "ranks")]


def planted_values(params: dict, sets_path) -> dict:
    """Recall at k = |planted| and the planted heads' ranks in each phase's global ranking."""
    section = planted_section(params)
    if section is None:
        return {}
    body = load_head_sets(sets_path)
    planted = PlantedHeads.from_params(section, n_layers=body["n_layers"], n_heads=body["n_heads"])
    v = {}
    for phase in PLANTED_PHASES:
        ranked = [(row["layer"], row["head"]) for row in body["phases"][phase]]
        heads = planted.sets[phase]
        names = ", ".join(planted.as_dict()[phase])
        v[f"planted_recall_{phase.lower()}"] = value(
            planted_recall(ranked, heads), f"share of the planted {phase} heads ({names}) among the global "
            f"{phase} ranking's top {len(heads)}", sets_path)
        v[f"planted_ranks_{phase.lower()}"] = value(
            list(planted_ranks(ranked, heads).values()), f"rank of each planted {phase} head ({names}) of "
            f"{body['n_layers'] * body['n_heads']}", sets_path)
    return v


def isolation_keys(params: dict) -> dict[str, str]:
    """measure of isolation.json -> its key, named by the first and last of params `isolation.bins`; none where
    the params configure no isolation pass (R-C15 reads the second teacher's run, which has none)."""
    if not params.get("isolation"):
        return {}
    bins = list(params["isolation"]["bins"])
    span = f"k{bins[0]}_to_k{bins[-1]}"
    return {"necessity": f"isolation_necessity_bins_{span}", "isolation_share": f"isolation_margin_share_bins_{span}"}


def isolation_values(params: dict) -> tuple[dict, list[Path]]:
    """Per k of the isolation pass: necessity under the note's own top-k, and the margin share it keeps alone."""
    names = isolation_keys(params)
    if not names:
        return {}, []
    out = Path(params["isolation"]["out_dir"])
    path = out / "isolation.json"
    summary = load_json(path)
    bins = list(params["isolation"]["bins"])
    if summary.get("bins") != bins:
        raise UserError(f"{path}: bins {summary.get('bins')} are not params isolation.bins {bins}; rerun the "
                        "isolation pass (dvc repro HD-001-isolation)")
    cells = [summary["by_k"][str(k)] for k in bins]
    n_notes = max(cell[m]["n_notes"] for cell in cells for m in ("necessity", "isolation_share"))
    head = f"per k in {bins}: median over {n_notes} notes of per-note means of the P1"
    v = {names["necessity"]: value([c["necessity"]["median"] for c in cells],
                                   f"{head} necessity when only the own top-k heads are mean-ablated", path),
         names["isolation_share"]: value([c["isolation_share"]["median"] for c in cells],
                                         f"{head} margin with every head outside the own top-k mean-ablated, as a "
                                         "share of the clean margin", path)}
    return v, [path, *sorted(out.glob("*/isolation.npz"))]


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params`."""
    bins = list(params["instrument"]["knockin"]["bins"])
    nk, kk = table1_sizes(params)
    out = ["corrupt_context_chapter_margin_gap", "knockin_random_max", "knockin_bottom_sets_p1",
           f"necessity_top{nk}_p1_p10_p90", f"knockin_top{nk}_p1_p10_p90", f"notes_top{nk}_p1_knockin_above_half",
           "notes_necessity_above_random_p1_p2", "notes_necessity_above_random_p2c",
           f"global_vs_own_top{kk}_knockin_gap_max"]
    for p in (p.lower() for p in PHASES):
        out += [f"range_gate_pass_rate_{p}", f"notes_knockin_above_random_{p}"]
        for k in bins:
            for m in MEASURES:
                out += [pattern.format(m=m, k=k, p=p) for pattern in SET_PREFIX.values()]
                out.append(f"notes_{m}_above_random_{p}_k{k}")
    return out + list(isolation_keys(params).values()) + planted_keys(params)


def compute_values(params: dict) -> tuple[dict, list]:
    out = instrument_dir(params)
    nk, kk = table1_sizes(params)
    fa = out / "faithfulness2.json"
    f = load_json(fa)
    v: dict = {}
    random_medians = []
    medians: dict[tuple[str, str, str, str], float] = {}   # (measure, kind, k, phase) -> median
    above_random: dict[tuple[str, str, str], dict] = {}    # (measure, k, phase) -> sign test against random
    for phase, entry in f["phases"].items():
        p = phase.lower()
        if phase == "P1" and "corrupt_context_gap_median" in entry:
            v["corrupt_context_chapter_margin_gap"] = value(entry["corrupt_context_gap_median"],
                                                            "nats, median of margin_all - margin_corr", fa)
        if "range_gate_pass_rate" in entry:
            v[f"range_gate_pass_rate_{p}"] = value(entry["range_gate_pass_rate"], "share of events", fa)
        for k, cell in entry["bins"].items():
            for m in MEASURES:
                for kind, stats in cell.get(m, {}).items():
                    if kind == "vs":
                        continue
                    medians[(m, kind, k, phase)] = stats["median"]
                    key = SET_PREFIX[kind].format(m=m, k=k, p=p)
                    v[key] = value(stats["median"], f"median over {stats['n_notes']} notes of per-note means", fa)
                    if kind == "random" and m == "knockin":
                        random_medians.append((int(k), stats["median"]))
                    if kind == "top" and k == str(nk) and phase == "P1":
                        v[f"{m}_top{k}_p1_p10_p90"] = value([stats["p10"], stats["p90"]],
                                                            "10th-90th percentile over notes", fa)
                        if m == "knockin":
                            v[f"notes_top{k}_p1_knockin_above_half"] = value(stats["notes_above_half"],
                                                                             "count of notes", fa)
                vs = cell.get(m, {}).get("vs", {})
                if "random" in vs:
                    above_random[(m, k, phase)] = vs["random"]
                    v[f"notes_{m}_above_random_{p}_k{k}"] = value(
                        vs["random"]["notes_top_above"], f"count of {vs['random']['notes']} notes (sign test "
                        f"p={vs['random']['p_value']:.3g})", fa)
    # Table 1's operating points: the knock-in size (paper top-40), the necessity size (paper top-8)
    for phase in PHASES:
        test = above_random.get(("knockin", str(kk), phase))
        if test is not None:
            v[f"notes_knockin_above_random_{phase.lower()}"] = value(
                test["notes_top_above"], f"count of {test['notes']} notes, top-{kk} knock-in above random (sign "
                f"test p={test['p_value']:.3g})", fa)
    tests = [above_random.get(("necessity", str(nk), phase)) for phase in ("P1", "P2")]
    if all(t is not None for t in tests):
        counts = [t["notes_top_above"] for t in tests]
        v["notes_necessity_above_random_p1_p2"] = value(
            [min(counts), max(counts)], f"range over P1, P2 of counts of notes where the top-{nk} necessity is "
            f"above random (of {tests[0]['notes']}, {tests[1]['notes']} notes)", fa)
    test = above_random.get(("necessity", str(nk), "P2C"))
    if test is not None:
        v["notes_necessity_above_random_p2c"] = value(
            test["notes_top_above"], f"count of {test['notes']} notes, top-{nk} necessity above random (sign test "
            f"p={test['p_value']:.3g})", fa)
    gaps = [abs(medians[("knockin", "top", str(kk), p)] - medians[("knockin", "own", str(kk), p)])
            for p in ("P2", "P2C") if {("knockin", s, str(kk), p) for s in ("top", "own")} <= set(medians)]
    if len(gaps) == 2:
        v[f"global_vs_own_top{kk}_knockin_gap_max"] = value(
            max(gaps), f"max over P2, P2C of |global top-{kk} - own top-{kk}| knock-in medians", fa)
    bottom = [medians[("knockin", "bottom", k, "P1")] for k in map(str, f.get("bins", []))
              if ("knockin", "bottom", k, "P1") in medians]
    if bottom:
        v["knockin_bottom_sets_p1"] = value([min(bottom), max(bottom)], "range over k of the P1 bottom-k knock-in "
                                            "medians [min, max]", fa)
    # Sec. 3.1 "random sets recover at most 0.09": the paper's bins are all <= 6% of its heads; a
    # random set of most heads recovers most of the margin, so only bins of <= 10% of the heads count
    # (the smallest bin where the model has too few heads for any).
    n_heads = f.get("n_heads_total")
    if random_medians and n_heads:
        small = [m for k, m in random_medians if k <= 0.1 * n_heads] or \
                [m for k, m in random_medians if k == min(k for k, _ in random_medians)]
        v["knockin_random_max"] = value(max(small), "max over phases and bins of <= 10% of the heads (else the "
                                        "smallest bin) of random-set medians", fa)
    isolation, isolation_inputs = isolation_values(params)
    v.update(isolation)
    planted = planted_values(params, out / "head_sets_contrast.json")
    v.update(planted)
    return v, [fa, *([out / "head_sets_contrast.json"] if planted else []), *sorted(out.glob("*/patch2.jsonl")),
               *isolation_inputs]


def main() -> int:
    return run_reader("R-C3", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
