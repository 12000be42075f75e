"""R-D29 and R-D36 (App. L.4, Table 49) on hand-made own-trace and teacher-forced knock-in cells laid out as the
paper profile's (its bins, arm rows and seeds): each value against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from mistill.errors import UserError
from mistill.evaluate.own_heads import arm_dirs
from mistill.io import write_json, write_jsonl
from tests.chain.test_key_coverage import _read_by_hand, _variant_params

NOTES = [f"n{i}" for i in range(8)]


def write_cells(m6, values: dict[str, dict[tuple[str, int], float]], bins) -> None:
    """An M6 directory whose note n recovers values[n][(set, k)] at its one P2C event (margin_all 2, corr 0)."""
    for note, cell in values.items():
        write_jsonl(m6 / note / "patch2.jsonl", [{
            "kind": "P2C", "pos": 3, "margin_clean": 2.0, "margin_corr": 0.0, "margin_all": 2.0,
            "knockin": {s: {str(k): 2.0 * cell[(s, k)] for k in bins} for s in ("top", "random")}}])
    write_json(m6 / "faithfulness2.json", {"notes": list(values), "bins": list(bins)})


@pytest.fixture
def world(tmp_path):
    """Every arm row at its seeds: teacher-forced on all notes, own traces on a seeded subset of them."""
    params = _variant_params(tmp_path)
    section = params["evaluate"]["own_heads"]
    bins, rng = section["bins"], np.random.default_rng(29)
    own, forced = {}, {}
    for row, label in section["arms"].items():
        for seed in ((0,) if row.endswith("untrained") else (0, 1, 2)):
            kept = sorted(rng.choice(NOTES, size=int(rng.integers(3, 8)), replace=False))
            forced[row, seed] = {n: {(s, k): float(rng.uniform(0.2, 0.9)) for s in ("top", "random") for k in bins}
                                 for n in NOTES}
            own[row, seed] = {n: {(s, k): float(rng.uniform(0.2, 0.95)) for s in ("top", "random") for k in bins}
                              for n in kept}
            write_cells(arm_dirs(tmp_path, label, seed)[1], forced[row, seed], bins)
            write_cells(tmp_path / "own-trace" / "M6" / f"{label}-s{seed}", own[row, seed], bins)
            write_json(tmp_path / "own-trace" / "runs" / f"{label}-s{seed}" / "coverage.json",
                       {"generated": len(NOTES), "completed": len(kept) + 1, "completed_notes": kept})
    return params, own, forced, max(bins), min(bins)


def change(own, forced, k):
    notes = sorted(set(own) & set(forced))
    return np.mean([own[n][("top", k)] - forced[n][("top", k)] for n in notes])


def available_pairs(own, arm, ref, k):
    per_note: dict[str, list[float]] = {}
    for s in (0, 1, 2):
        for n in set(own[arm, s]) & set(own[ref, s]):
            per_note.setdefault(n, []).append(own[arm, s][n][("top", k)] - own[ref, s][n][("top", k)])
    return np.mean([np.mean(d) for d in per_note.values()]), len(per_note)


def test_r_d29_by_hand(world):
    params, own, forced, k, k8 = world
    _, v = _read_by_hand("R-D29", params)
    mistill = own["qwen_mistill", 0]
    assert v["mistill_s0_owntrace_p2c_k40"] == pytest.approx(np.mean([x[("top", k)] for x in mistill.values()]))
    assert v["mistill_s0_forced_p2c_k40_same_notes"] == pytest.approx(
        np.mean([forced["qwen_mistill", 0][n][("top", k)] for n in mistill]))
    for tag in ("bf16", "fp32"):
        for kk, suffix in ((k, "k40"), (k8, "k8")):
            mean, n = available_pairs(own, "qwen_mistill", f"qwen_vanilla_{tag}", kk)
            assert v[f"mistill_minus_{tag}_vanilla_owntrace_{suffix}"] == pytest.approx(mean)
    low, high = v["mistill_minus_bf16_vanilla_owntrace_k40_interval"]
    assert low <= v["mistill_minus_bf16_vanilla_owntrace_k40"] <= high
    trained = [change(own[row, s], forced[row, s], k) for row in ("qwen_mistill", "qwen_vanilla_bf16",
                                                                   "qwen_vanilla_fp32") for s in (0, 1, 2)]
    assert v["qwen_largest_owntrace_change_k40"] == pytest.approx(max(trained, key=abs))
    assert v["untrained_qwen_owntrace_change"] == pytest.approx(change(own["qwen_untrained", 0],
                                                                       forced["qwen_untrained", 0], k))
    assert v["smollm_mistill_owntrace_change"] == pytest.approx(
        [change(own["smollm_mistill", s], forced["smollm_mistill", s], k) for s in (0, 1)])
    assert v["smollm_fp32_vanilla_owntrace_change"] == pytest.approx(
        change(own["smollm_vanilla_fp32", 0], forced["smollm_vanilla_fp32", 0], k))
    assert v["smollm_owntrace_mistill_vs_vanilla"] == pytest.approx(
        [np.mean([x[("top", k)] for x in own[row, s].values()]) for row in ("smollm_mistill", "smollm_vanilla_fp32")
         for s in (0, 1)])
    qwen = [len(own[row, s]) for row, s in own if row.startswith("qwen_")]
    assert v["qwen_owntrace_coverage"] == [min(qwen), max(qwen)]
    # Table 49's cells of one row
    assert v["qwen_vanilla_bf16_owntrace_random_p2c_k40_seeds"] == pytest.approx(
        [np.mean([x[("random", k)] for x in own["qwen_vanilla_bf16", s].values()]) for s in (0, 1, 2)])
    assert v["qwen_vanilla_bf16_completed_seeds"] == [len(own["qwen_vanilla_bf16", s]) + 1 for s in (0, 1, 2)]
    assert v["smollm_untrained_owntrace_coverage_seeds"] == [len(own["smollm_untrained", 0])]


def test_r_d36_by_hand(world):
    params, own, forced, k, k8 = world
    _, v = _read_by_hand("R-D36", params)
    cells, tf = own["smollm_mistill", 2], forced["smollm_mistill", 2]
    d = np.array([cells[n][("top", k)] - tf[n][("top", k)] for n in cells])
    assert (v["completed_traces"], v["measurable_traces"], v["generated_traces"]) == (len(cells) + 1, len(cells), 8)
    assert v["owntrace_p2c_k40"] == pytest.approx(np.mean([x[("top", k)] for x in cells.values()]))
    assert v["teacher_forced_p2c_k40_same_notes"] == pytest.approx(np.mean([tf[n][("top", k)] for n in cells]))
    assert v["owntrace_minus_tf"] == pytest.approx(d.mean())
    assert v["owntrace_minus_tf_higher_notes"] == int((d > 0).sum())
    assert v["owntrace_minus_tf_k8"] == pytest.approx(change(cells, tf, k8))


def test_a_missing_own_trace_readout_is_a_user_error(world, tmp_path):
    params, *_ = world
    params["paths"]["artifacts"] = str(tmp_path / "elsewhere")
    with pytest.raises(UserError, match="own-trace"):
        _read_by_hand("R-D36", params)
