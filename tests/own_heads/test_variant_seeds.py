"""A recipe variant trained at a seed other than 0 is read beside the untrained student's one run, which every
stage writes at seed 0 (`mistill.evaluate.variants.UNTRAINED_SEED`); the trained references stay at the
variant's seed. The seed-1 calibration replicate reads every variant so."""

from __future__ import annotations

import copy
import json
import statistics

import pytest

from mistill.evaluate.readout import arm_labels
from mistill.evaluate.variants import VariantReadout
from mistill.io import write_json
from mistill.params import load_params

NOTES = ("n1", "n2", "n3", "n4")


def _m6(root, label: str, recovery: dict[str, float], k: int) -> None:
    """An M6 directory whose P2C events knock in `recovery[note]` of a two-nat range at own top-k."""
    m6 = root / "M6" / label
    m6.mkdir(parents=True)
    write_json(m6 / "faithfulness2.json", {"notes": list(recovery)})
    for note, r in recovery.items():
        (m6 / note).mkdir()
        row = {"kind": "P2C", "margin_corr": 0.0, "margin_all": 2.0, "knockin": {"top": {str(k): 2.0 * r}}}
        (m6 / note / "patch2.jsonl").write_text(json.dumps(row) + "\n")


@pytest.fixture
def seed1_randpos(tmp_path):
    params = copy.deepcopy(load_params(profile="demo"))
    params["paths"]["artifacts"] = str(tmp_path / "artifacts")
    params["variants"]["dir"] = str(tmp_path / "variants")
    params["variants"]["arms"]["randpos"] = {**params["variants"]["arms"]["randpos"], "seed": 1}
    k = max(params["evaluate"]["own_heads"]["bins"])
    variant = {n: 0.1 * (i + 1) for i, n in enumerate(NOTES)}
    untrained = {n: 0.05 for n in NOTES}
    _m6(tmp_path / "variants", "student-qwen-randpos-bf16-s1", variant, k)
    labels = arm_labels(params)
    _m6(tmp_path / "artifacts", f"{labels['qwen_untrained']}-s0", untrained, k)
    _m6(tmp_path / "artifacts", f"{labels['qwen_mistill']}-s0", {n: 0.9 for n in NOTES}, k)  # seed 0: not read
    _m6(tmp_path / "artifacts", f"{labels['qwen_mistill']}-s1", {n: 0.5 for n in NOTES}, k)
    return VariantReadout("randpos", params), variant, untrained


def test_a_seed_1_variant_is_paired_with_the_untrained_student_s_seed_0_run(seed1_randpos):
    readout, variant, untrained = seed1_randpos
    assert readout.where("untrained").endswith("-s0")
    assert readout.where("mistill").endswith("-s1")
    assert readout.own_median("untrained", "P2C") == pytest.approx(0.05)
    pair = readout.paired_values("randpos_minus_untrained", "RandPos minus the untrained student", "untrained")
    expected = statistics.fmean(variant[n] - untrained[n] for n in NOTES)
    assert pair["randpos_minus_untrained"]["value"] == pytest.approx(expected)
    assert "-s0" in pair["randpos_minus_untrained"]["artifact"]
    assert "P2C recovery, seed 1 against seed 0)" in pair["randpos_minus_untrained"]["statistic"]


def test_the_trained_references_stay_at_the_variant_s_seed(seed1_randpos):
    readout, variant, _ = seed1_randpos
    pair = readout.paired_values("randpos_minus_mistill", "RandPos minus Mistill", "mistill")
    assert pair["randpos_minus_mistill"]["value"] == pytest.approx(statistics.fmean(v - 0.5 for v in variant.values()))
    assert "P2C recovery, seed 1)" in pair["randpos_minus_mistill"]["statistic"]
