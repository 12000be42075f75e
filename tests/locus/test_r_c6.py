"""R-C6's reader on paper-shaped locus artifacts (1,600 heads, the paper's set sizes): every value by hand or
against scipy, and exactly the paper's keys (less the one the registry says no stage produces)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from scipy.stats import spearmanr

from mistill.instrument.global_sets import head_sets
from mistill.io import write_json, write_npz
from mistill.locus.passes import LocusSettings, ablation_sets
from mistill.params import load_params
from mistill.repro.reader_module import load_reader
from mistill.repro.registry import load_registry
from tests.repro.repro_helpers import REPO

L = H = 40


def _reader():
    return load_reader(REPO / "readers" / "r_c6.py")


def _mention(event, outcome, distance, *, jump=None, first=False, own=False, start=False, probes=5):
    return {"event": event, "pos": 500 + event, "outcome": outcome, "distance": distance, "jump": jump,
            "curve": {str(d): 3.0 for d in range(probes)}, "code": "A00.0", "first_code": first,
            "trace_start": start, "own_description_word": own, "locus_word": "word"}


NOTES = {
    "n0": [_mention(0, "window", 4, jump=8.0, first=True, own=True), _mention(1, "window", 10, jump=2.0),
           _mention(2, "never", None), _mention(3, "inherited", 30, start=True)],
    "n1": [_mention(0, "window", 7, jump=5.0, own=True), _mention(1, "code", 0), _mention(2, "censored", 512)],
    "n2": [_mention(0, "inherited", 20), _mention(1, "never", None), _mention(2, "window", 1, jump=9.0)],
}


def write_locus_run(out, notes, prose, suffix, emission, settings, offset=0.0):
    """A `mistill locus all` directory: locus.json per note, its window.npz, head_sets_locus.json, and
    ablation.json whose necessities are, per decided mention i of the n-th note, n + 0.1 i + offset (plus
    0.5 for the prose-time sets)."""
    for note, mentions in notes.items():
        write_json(out / note / "locus.json", {"note_id": note, "mentions": mentions, "skipped_mentions": 0,
                                               "probes": 5 * len(mentions), "n_layers": L, "n_heads": H})
        write_npz(out / note / "window.npz", kinds=np.asarray(["mention", "NULL"]), events=np.arange(2))
    write_json(out / "head_sets_locus.json", head_sets({"prose": prose, "suffix": suffix}, L, H, pool_k=40))
    names = ablation_sets(prose, emission, prose, settings, np.random.default_rng(0))
    for n, (note, mentions) in enumerate(notes.items()):
        decided = [m for m in mentions if m["outcome"] in ("window", "code", "censored")]
        rows = [{"event": m["event"], "outcome": m["outcome"], "clean": 4.0,
                 "necessity": {name: n + 0.1 * i + offset + (0.5 if name.startswith("prosetime") else 0.0)
                               for name in names}} for i, m in enumerate(decided)]
        write_json(out / note / "ablation.json", {"note_id": note, "mentions": rows,
                                                  "read": {"prosetime": [0.3] * len(rows), "random": [0.1] * len(rows)}})


def paper_scores(seed=0):
    """(prose, emission, suffix) of 1,600 heads: the prose-time top 40 all in layer 12; l21h25 at 0.92 in the suffix."""
    rng = np.random.default_rng(seed)
    prose = np.roll(np.concatenate([np.linspace(5, 1, 40), rng.normal(0, 0.01, 1560)]), 12 * H)
    emission, suffix = rng.normal(0, 1, L * H), rng.normal(0, 1, L * H)
    suffix[21 * H + 25] = 0.92
    return prose, emission, suffix


@pytest.fixture
def paper_locus(tmp_path):
    params = copy.deepcopy(load_params(REPO / "params.yaml", profile="paper"))
    out, hd001 = tmp_path / "HD-001-locus", tmp_path / "HD-001"
    params["locus"]["out_dir"], params["instrument"]["out_dir"] = str(out), str(hd001)
    prose, emission, suffix = paper_scores()
    write_json(hd001 / "head_sets_contrast.json", head_sets({"P1": emission}, L, H, pool_k=40))
    write_locus_run(out, NOTES, prose, suffix, emission, LocusSettings.from_params(params))
    # Table 33's read (stage HD-001-locus-read): note n's prose-time top reads the region more than the random
    # heads on the first two notes
    from mistill.instrument.readside import CAT, CATEGORIES
    from mistill.locus.read import SUMMARY, read_dir, summarize_locus_reads

    def locus(top, rand):
        shares = [[0.0] * len(CATEGORIES) for _ in range(2)]
        shares[0][CAT["own_line"]], shares[1][CAT["own_line"]] = top, rand
        return {"heads": [0, 1], "shares": shares, "lift": [2.0, 1.0], "n_eff": [30.0, 60.0]}

    groups = {"prosetime_top": [0], "emission_top": [1], "prosetime_bottom": [1], "random": [1]}
    reads = {note: {"groups": groups, "loci": [locus(*pair)]}
             for note, pair in zip(NOTES, [(0.3, 0.1), (0.2, 0.1), (0.0, 0.4)])}
    write_json(read_dir(out) / SUMMARY, {**summarize_locus_reads(reads), "k": 16})
    return params, prose, emission


def test_r_c6_values_by_hand_on_paper_shaped_artifacts(paper_locus):
    params, prose, emission = paper_locus
    module = _reader()
    values, inputs = module.compute_values(params)
    registry = load_registry(REPO)
    paper = set(registry.expected("paper").values["R-C6"])
    assert set(values) == set(module.keys(params))
    assert paper - set(registry.results["R-C6"].unproduced_keys) <= set(values)
    assert values["notes_prosetime_region_beats_random"]["value"] == 2
    v = {k: x["value"] for k, x in values.items()}
    # 10 mentions: window 4, inherited 2, never 2, code 1, censored 1
    assert v["window_locus_share"] == pytest.approx(40.0) and v["inherited_share"] == pytest.approx(20.0)
    assert v["never_decisive_share"] == pytest.approx(20.0) and v["censored_share"] == pytest.approx(10.0)
    assert v["decisive_at_code_suffix_b"] == pytest.approx(80.0) and v["note_alone_decisive"] == pytest.approx(10.0)
    assert v["attributed_mentions"] == 6 and v["probes_total"] == 50
    assert v["median_locus_distance"] == pytest.approx(5.5)                # distances 1, 4, 7, 10
    assert v["locus_distance_p10_p90"] == pytest.approx(list(np.percentile([1, 4, 7, 10], [10, 90])))
    assert v["first_code_median_locus_distance"] == pytest.approx(4.0)
    assert v["locus_jump"] == pytest.approx(6.5)                           # jumps 2, 5, 8, 9
    assert v["locus_at_own_description_word"] == pytest.approx(50.0)
    assert v["per_note_window_share"] == pytest.approx(100 / 3)             # 50%, 33%, 33%
    assert v["prosetime_top40_in_layers_12_23"] == 40
    assert v["prosetime_emission_ic_spearman"] == pytest.approx(spearmanr(prose, emission).statistic)
    top = lambda x, k: set(np.argsort(-x, kind="stable")[:k].tolist())   # noqa: E731
    assert v["prosetime_emission_overlap_top8_top16_top40"] == [len(top(prose, k) & top(emission, k))
                                                                for k in (8, 16, 40)]
    assert v["suffix_ranking_top_ic_l21h25"] == pytest.approx(0.92)
    # per note means over decided mentions: n0 (two windows) 0.05 + n, n1 (three) 0.1 + n, n2 (one) 0 + n
    assert v["emission_top16_window_only_necessity"] == pytest.approx(1.1)
    assert v["prosetime_top8_window_only_necessity"] == pytest.approx(1.6)
    assert v["random8_window_only_necessity"] == pytest.approx(1.1)
    assert v["notes_prosetime_above_random"] == 3
    assert v["prosetime_note_attention_share"] == pytest.approx(0.3)
    assert v["random_heads_note_share_at_locus"] == pytest.approx(0.1)
    assert len(inputs) == 3 * 3 + 2 + 1     # and the locus read's summary
