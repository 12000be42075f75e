"""R-C15 (App. H): the second teacher's reader names the paper's keys under the paper profile, and its own
numbers (the named heads' exact P2C I_c with a bootstrap interval, the prose-time set's median layer) match
numpy on hand-made runs."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from mistill.errors import UserError
from mistill.io import write_json
from mistill.stats import StatsParams
from tests.chain.test_key_coverage import DEMO_PARAMS, PAPER_PARAMS, REGISTRY, reader

R_C15 = reader("R-C15")


def test_the_paper_profile_writes_exactly_the_papers_keys():
    assert set(R_C15.keys(PAPER_PARAMS)) == set(REGISTRY.expected("paper").values["R-C15"]) | {
        "qwq_exact_p2c_top_l63h32_interval"}
    assert REGISTRY.results["R-C15"].extra_keys == ["qwq_exact_p2c_top_l63h32_interval"]
    # the demo's sizes and heads are its own: no paper set size leaks into its keys
    demo = R_C15.keys(DEMO_PARAMS)
    assert "qwq_knockin_top8_p1" in demo and not any("top40" in k for k in demo)


def test_named_heads_must_be_head_names():
    params = copy.deepcopy(PAPER_PARAMS)
    params["second_teacher"]["named_heads"]["exact_p2c_second"] = "L52H33 "
    with pytest.raises(UserError, match="exact_p2c_second"):
        R_C15.keys(params)


def _ranked(scores: np.ndarray, n_heads: int) -> list[dict]:
    order = np.argsort(-scores, kind="stable")
    return [{"layer": int(i // n_heads), "head": int(i % n_heads), "ic": float(scores[i]), "weight": None}
            for i in order]


def test_exact_p2c_heads_and_prosetime_layer_by_hand(tmp_path):
    n_layers, n_heads, notes = 6, 4, 9
    rng = np.random.default_rng(15)
    per_note = rng.normal(0.0, 0.05, (notes, n_layers * n_heads))
    per_note[:, 5 * n_heads + 2] += rng.uniform(0.5, 0.9, notes)      # l5h2 leads by a wide margin
    per_note[:, 3 * n_heads + 1] += 0.15                               # l3h1 second
    mean = per_note.mean(axis=0)
    write_json(tmp_path / "head_sets_contrast.json", {"n_layers": n_layers, "n_heads": n_heads, "pool_k": 8,
                                                       "phases": {"P2C": _ranked(mean, n_heads)}})
    np.savez(tmp_path / "calibration.npz", ic_P2C=per_note)
    stats = StatsParams(bootstrap_resamples=2000, bootstrap_seed=0)
    values = R_C15.exact_p2c_values(tmp_path, {"exact_p2c_top": "l5h2", "exact_p2c_second": "l3h1"}, stats)
    top, second = values["qwq_exact_p2c_top_l5h2"], values["qwq_exact_p2c_second_l3h1"]
    low, high = values["qwq_exact_p2c_top_l5h2_interval"]["value"]
    assert top["value"] == pytest.approx(per_note[:, 22].mean()) and "rank 1 of 24" in top["statistic"]
    assert second["value"] == pytest.approx(per_note[:, 13].mean()) and "rank 2 of 24" in second["statistic"]
    # the leader's interval: the percentile bootstrap of the mean over notes, against resampling by hand
    boot = np.random.default_rng(1).choice(per_note[:, 22], (20000, notes)).mean(axis=1)
    assert low < top["value"] < high and not any(k.startswith("qwq_exact_p2c_second") and k.endswith("_interval")
                                                  for k in values)
    assert low == pytest.approx(np.quantile(boot, 0.025), abs=0.02) and high == pytest.approx(np.quantile(boot, 0.975), abs=0.02)
    # the prose-time set's median layer: layers of its top-4 heads 5, 4, 4, 1 -> 4.0
    prose = np.zeros(n_layers * n_heads)
    prose[[5 * n_heads + 0, 4 * n_heads + 3, 4 * n_heads + 1, 1 * n_heads + 2]] = [4.0, 3.0, 2.0, 1.0]
    write_json(tmp_path / "head_sets_locus.json", {"n_layers": n_layers, "n_heads": n_heads,
                                                    "phases": {"prose": _ranked(prose, n_heads)}})
    layer = R_C15.prosetime_median_layer(tmp_path, 4)
    assert layer["value"] == 4.0 and "of 6 layers" in layer["statistic"]
