"""R-C12's reader on hand-made follow-through files: every value by hand or against scipy."""

from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pytest
from scipy.stats import wilcoxon

from mistill.io import write_json
from mistill.params import load_params
from mistill.repro.registry import load_registry
from tests.repro.repro_helpers import REPO


def _reader():
    spec = importlib.util.spec_from_file_location("reader_r_c12", REPO / "readers" / "r_c12.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(clean, prose, random, sustained, emission, forced):
    return {"event": 0, "distance": 5, "natural": {"clean": clean, "prose": prose, "random": random,
                                                   "sustained": sustained, "emission": emission},
            "forced_clean": 6.0, "forced_drop": forced}


def test_r_c12_values_by_hand(tmp_path):
    params = copy.deepcopy(load_params(REPO / "params.yaml", profile="paper"))
    params["locus"]["follow_out_dir"] = str(tmp_path)
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
    assert len(inputs) == 3
