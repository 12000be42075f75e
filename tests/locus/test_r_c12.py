"""R-C12's reader on hand-made follow-through and residual-swap files: every value by hand or against scipy."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from scipy.stats import wilcoxon

from mistill.errors import UserError
from mistill.io import write_json
from mistill.params import load_params
from mistill.repro.reader_module import load_reader
from mistill.repro.registry import load_registry
from tests.repro.repro_helpers import REPO


def _reader():
    return load_reader(REPO / "readers" / "r_c12.py")


def _row(clean, prose, random, sustained, emission, forced):
    return {"event": 0, "distance": 5, "natural": {"clean": clean, "prose": prose, "random": random,
                                                   "sustained": sustained, "emission": emission},
            "forced_clean": 6.0, "forced_drop": forced}


LAYERS = [0, 12, 20, 24, 28]


def _swap_row(forced: list[float], natural: list[float], gain: list[float], code: list[float],
              code_donor: list[float]) -> dict:
    """Clean margins 10 / -5 (forced) and 8 / -5 (natural, target / donor letter); the tail swap's drops and the
    donor's natural gain per grid layer; the code swap's target drop and donor margin per grid layer."""
    return {"event": 1, "donor_event": 2, "distance": 4,
            "forced": {"clean": [10.0, -5.0], "locus": [[10.0, -5.0]] * len(LAYERS),
                       "tail": [[10.0 - f, -5.0] for f in forced]},
            "natural": {"clean": [8.0, -5.0], "locus": [[8.0, -5.0]] * len(LAYERS),
                        "tail": [[8.0 - n, -5.0 + g] for n, g in zip(natural, gain)],
                        "code": [[8.0 - c, d] for c, d in zip(code, code_donor)]}}


def _write_swaps(out) -> None:
    m1 = _swap_row([3, 9, 5, 1, 0], [1, 3, 2, 0.5, 0], [0, 2, 0, 0, 0], [0, 1, 2, 9, 16], [-5, -4, -1, 2, 6])
    m2 = _swap_row([2, 7, 4, 1, 0], [1, 5, 1, 0.2, 0], [0, 4, 0, 0, 0], [0, 0, 3, 10, 18], [-5, -3, 1, 3, 5])
    m3 = _swap_row([1, 0.5, 6, 0, 0], [0.5, 0.4, 1, 0, 0], [0, 1, 0, 0, 0], [0, 1, 1, 8, 17], [-6, -2, -2, 1, 7])
    for note, rows in {"n0": [m1, m2], "n1": [m3], "n2": []}.items():
        write_json(out / note / "swap.json", {"note_id": note, "layers": LAYERS, "tail": 8, "mentions": rows})


def test_r_c12_values_by_hand(tmp_path):
    params = copy.deepcopy(load_params(REPO / "params.yaml", profile="paper"))
    params["locus"]["follow_out_dir"] = str(tmp_path / "follow")
    params["locus"]["swap"] = {"out_dir": str(tmp_path / "swap"), "layers": LAYERS, "tail": 8}
    _write_swaps(tmp_path / "swap")
    tmp_path = tmp_path / "follow"
    notes = {"n0": [_row(5, 4, 5, 0, 1, 4.0), _row(3, -1, 2.5, -2, 0, 6.0)],
             "n1": [_row(2, 2, 2, 1, 1, 0.5)],
             "n2": [_row(4, 1, 3, 1, -1, 3.0), _row(4, 2, 4, 0, 2, 2.0), _row(6, 6, 6, 5, 5, 0.2)]}
    for note, rows in notes.items():
        write_json(tmp_path / note / "follow.json", {"note_id": note, "k": 16, "mentions": rows})
    module = _reader()
    values, inputs = module.compute_values(params)
    registry = load_registry(REPO)
    listed = set(module.keys(params))
    assert set(values) == listed
    assert set(registry.expected("paper").values["R-C12"]) - listed == set(registry.results["R-C12"].unproduced_keys)
    v = {k: x["value"] for k, x in values.items()}
    # forced drop > 1 nat: drops (natural, forced) = (1, 4), (4, 6), (3, 3), (2, 2)
    assert v["natural_margin_drop"] == pytest.approx(2.5) and v["forced_margin_drop"] == pytest.approx(3.5)
    assert v["follow_through_ratio"] == pytest.approx(2.5 / 3.5)
    assert v["natural_drop_mean"] == pytest.approx(np.mean([1, 4, 0, 3, 2, 0]))
    assert v["flipped_decisions"] == pytest.approx(100 / 6)
    assert v["sustained_window_to_code_drop"] == pytest.approx(np.median([5, 5, 1, 3, 4, 1]))
    assert v["emission_top16_at_code_drop"] == pytest.approx(np.median([4, 3, 1, 5, 2, 1]))
    per_note = [np.mean([1 - 0, 4 - 0.5]), 0.0, np.mean([3 - 1, 2 - 0, 0 - 0])]
    assert v["natural_drop_vs_random_per_note"] == pytest.approx(np.mean(per_note))
    low, high = v["natural_drop_vs_random_per_note_interval"]
    assert low <= np.mean(per_note) <= high
    assert f"Wilcoxon p {wilcoxon([x for x in per_note if x != 0]).pvalue:.3g}" in \
        values["natural_drop_vs_random_per_note"]["statistic"]
    assert len(inputs) == 3 + 3
    # the residual swap: median forced tail drops per layer 2, 7, 5, 1, 0 -> l* = L12
    assert v["analysis_layer_l_star"] == 12
    # at L12, forced drops above 1 nat: 9 and 7 (not 0.5); natural / forced 3/9 and 5/7
    assert v["transport_ratio"] == pytest.approx(np.median([3 / 9, 5 / 7]))
    assert v["tail_swap_forced_natural_donor"] == pytest.approx([7, 3, 2])
    assert v["tail_swap_per_note_drop"] == pytest.approx(np.mean([np.mean([3, 5]), 0.4]))   # n2 has no mention
    assert v["swap_mentions_notes"] == [3, 2]
    # the prose-time band 12-23 holds grid layers 12 and 20: ratio of the median drops there
    assert v["mid_layer_ratio_l12_l20"] == pytest.approx([3 / 7, 1 / 5])
    # donor medians under the code swap -5, -3, -1, 2, 6: it wins from L24 on; target drops there and at L28
    assert v["flip_layer"] == 24
    assert v["code_swap_target_drop_l24_l28"] == pytest.approx([9, 17])
    # Figure 5's profile: medians per grid layer
    assert v["swap_layer_grid"] == LAYERS
    assert v["tail_swap_forced_drop_by_layer"] == pytest.approx([2, 7, 5, 1, 0])
    assert v["tail_swap_natural_drop_by_layer"] == pytest.approx([1, 3, 1, 0.2, 0])
    assert v["locus_swap_forced_drop_by_layer"] == pytest.approx([0] * 5)
    assert v["code_swap_natural_drop_by_layer"] == pytest.approx([0, 1, 2, 9, 17])
    assert v["code_swap_donor_margin_by_layer"] == pytest.approx([-5, -3, -1, 2, 6])


def test_r_c12_refuses_a_grid_without_a_flip(tmp_path):
    params = copy.deepcopy(load_params(REPO / "params.yaml", profile="paper"))
    params["locus"]["swap"] = {"out_dir": str(tmp_path), "layers": [0, 1], "tail": 8}
    row = _swap_row([1, 2], [1, 1], [0, 0], [0, 1], [-3, -2])
    row["forced"]["locus"] = row["natural"]["locus"] = [[10.0, -5.0]] * 2
    write_json(tmp_path / "n0" / "swap.json", {"note_id": "n0", "layers": [0, 1], "tail": 8, "mentions": [row]})
    settings, stats = _reader().LocusSettings.from_params(params), _reader().StatsParams.from_params(params)
    with pytest.raises(UserError, match="never hands the decision"):
        _reader().swap_readout(settings, _reader().SwapSettings.from_params(params), stats)
