"""Every paper key of a demo result is producible: its reader writes it under the paper profile's params,
or registry.yaml says why no stage produces it yet (`unproduced_keys`), and the check then reports
it as not reproduced, never as a pass.

Each reader's `keys(params)` lists the keys it can write; the lists are checked against
results/expected/paper.yaml under the paper profile's params, and each reader runs once on small
artifacts laid out as the paper profile's (1,600 teacher heads, its bins, arms and seeds), built
with the passes' own summary functions, where the keys it writes must be exactly the keys it lists.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from mistill.errors import UserError
from mistill.evaluate.compare import arm_values, clustered, knockin_rows, note_recovery, seed_dirs
from mistill.evaluate.own_heads import arm_dirs, edits_dir
from mistill.evaluate.readout import baseline_label
from mistill.instrument.attribution import fidelity
from mistill.instrument.calibration import calibrate, note_contrast
from mistill.instrument.global_sets import head_sets, phase_scores
from mistill.instrument.isolation import summarize as isolation_summary
from mistill.instrument.knockin import SET_KINDS, exact_refinement, summarize
from mistill.io import write_json, write_jsonl, write_npz
from mistill.params import load_params
from mistill.repro.check import NOT_REPRODUCED, PASS, run_check
from mistill.repro.reader_module import load_reader
from mistill.repro.registry import load_registry
from mistill.repro.text_fields import artifact_problem, statistic_problem
from mistill.stats import StatsParams
from tests.chain.test_readers import GOLD, write_arm
from tests.repro.repro_helpers import REPO, paper_values, write_fixture

REGISTRY = load_registry(REPO)
DEMO_IDS = [rid for rid, result in REGISTRY.results.items() if result.status == "demo"]
PAPER_PARAMS = load_params(REPO / "params.yaml", profile="paper")
DEMO_PARAMS = load_params(REPO / "params.yaml", profile="demo")
PHASES = ("P1", "P2", "P2C")


def reader(result_id: str):
    """The reader module registry.yaml names for a result."""
    return load_reader(REPO / REGISTRY.results[result_id].reader)


# ---- the key lists against the paper's keys ------------------------------------------------------------


@pytest.mark.parametrize("rid", DEMO_IDS)
def test_every_paper_key_is_listed_by_its_reader_or_said_why(rid):
    paper = set(REGISTRY.expected("paper").values[rid])
    listed = set(reader(rid).keys(PAPER_PARAMS))
    unproduced = REGISTRY.results[rid].unproduced_keys
    assert not sorted(paper - listed - set(unproduced)), "paper keys neither written nor said why"
    assert set(unproduced) <= paper, "unproduced_keys must be the paper's keys"


@pytest.mark.parametrize("rid", DEMO_IDS)
def test_demo_goldens_are_keys_the_reader_lists_under_the_demo(rid):
    assert set(REGISTRY.expected("demo").values[rid]) <= set(reader(rid).keys(DEMO_PARAMS))


def test_keys_naming_heads_and_sizes_come_from_params():
    keys = reader("R-C4").keys(PAPER_PARAMS)
    assert {"l39h38_ic_p2c", "l30h11_rank_p1", "chapter_top40_heads_in_layers_24_31",
            "recurrence_counts_l39h38_l39h13_l26h36_l26h37_l28h21"} <= set(keys)
    demo = reader("R-C4").keys(DEMO_PARAMS)
    named = DEMO_PARAMS["readers"]["named_heads"]
    assert {f"{named['leader']}_ic_p2c", f"{named['contrastive_specialist']}_rank_p1",
            "chapter_top8_heads_in_layers_2_3"} <= set(demo)
    assert not any("l39h38" in k for k in demo)
    params = copy.deepcopy(PAPER_PARAMS)
    params["readers"]["named_heads"]["leader"] = "l7h3"
    assert "l7h3_ic_p1" in reader("R-C4").keys(params) and "l39h38_ic_p1" not in reader("R-C4").keys(params)
    params["instrument"]["knockin"]["bins"] = [3, 8, 16, 24]
    with pytest.raises(UserError, match="readers.knockin_k 40 is not one of instrument.knockin.bins"):
        reader("R-C3").keys(params)


# ---- the check under the paper profile ------------------------------------------------------------------


@pytest.mark.parametrize("rid", [rid for rid in DEMO_IDS if REGISTRY.results[rid].unproduced_keys])
def test_unproduced_keys_are_not_reproduced_under_the_paper_profile_never_passed(tmp_path, rid):
    unproduced = REGISTRY.results[rid].unproduced_keys
    values = {k: v for k, v in paper_values(REGISTRY, rid).items() if k not in unproduced}
    write_fixture(tmp_path, rid, values, profile="paper")
    report = run_check(REGISTRY, "paper", tmp_path, [rid])
    verdicts = {line.key: line for line in report.lines}
    for key in unproduced:
        assert verdicts[key].verdict == NOT_REPRODUCED and verdicts[key].fails
    assert all(verdicts[k].verdict == PASS for k in values)
    assert report.failed


# ---- each reader on artifacts laid out as the paper profile's ------------------------------------------


def _assert_writes_what_it_lists(module, params, values):
    assert sorted(set(values) - set(module.keys(params))) == [], "written but not listed"
    assert sorted(set(module.keys(params)) - set(values)) == [], "listed but not written on complete artifacts"
    for key, record in values.items():
        assert statistic_problem(record["statistic"]) is None, (key, record["statistic"])
        artifact = record["artifact"]   # its roots shortened: a test's temporary directories are long
        for root in sorted({params["paths"]["artifacts"], params["variants"]["dir"]}, key=len, reverse=True):
            artifact = artifact.replace(str(root), "artifacts")
        assert artifact_problem(artifact) is None, (key, record["artifact"])


def _patch_rows(rng, note: str, bins, n_heads_total: int) -> tuple[list[dict], dict[int, np.ndarray]]:
    """patch2.jsonl rows of one note (three events per phase) and its P2C first-order arrays."""
    rows, firsts = [], {}
    for e, kind in enumerate(k for k in PHASES for _ in range(3)):
        pos = 10 + 7 * e
        clean = rng.uniform(2, 6)
        corr, all_heads = clean - rng.uniform(3, 8), clean + rng.normal(0, 1e-3)
        row = {"kind": kind, "pos": pos, "target_id": 1, "margin_clean": clean,
               "donor_note": "other", "donor_pos": pos, "margin_corr": corr, "margin_all": all_heads,
               "necessity": {s: {str(k): clean * rng.uniform(-0.5, 1.5) for k in bins} for s in SET_KINDS},
               "knockin": {s: {str(k): corr + (all_heads - corr) * rng.uniform(-0.2, 1.0) for k in bins}
                           for s in SET_KINDS}}
        if kind == "P2C":
            firsts[pos] = rng.normal(0, 0.1, (40, 40))
            heads = rng.choice(n_heads_total, 6, replace=False).tolist()
            row["p2c_exact"] = {"heads": heads, "exact": rng.normal(0, 0.2, 6).tolist(),
                                "first_order": [float(firsts[pos].reshape(-1)[h]) for h in heads]}
        rows.append(row)
    return rows, firsts


@pytest.fixture(scope="module")
def paper_hd001(tmp_path_factory):
    """HD-001 (and HD-002's head sets) of a 40-layer, 40-head teacher at the paper's settings."""
    root = tmp_path_factory.mktemp("paper_hd001")
    params = copy.deepcopy(PAPER_PARAMS)
    instrument = params["instrument"]
    out = root / "HD-001"
    instrument["out_dir"] = str(out)
    params["distill"]["teacher_head_sets"] = str(root / "HD-002" / "head_sets_contrast.json")
    L = H = 40
    cal_cfg, bins = instrument["calibration"], instrument["knockin"]["bins"]
    rng = np.random.default_rng(0)
    notes = [f"n{i}" for i in range(5)]
    kinds = [k for k in PHASES for _ in range(3)] + ["NULL"] * 6
    contrasts = []
    for note in notes:
        importance = rng.normal(0, 0.05, (len(kinds), L, H))
        importance[:9, 39, 38] += 1.0          # one head leads every phase, as the paper's L39H38
        importance[6:9, 30, 11] += 0.5         # a contrastive specialist
        contrasts.append(note_contrast(note, kinds, importance, seed=0))
    cal = calibrate(contrasts, fdr=cal_cfg["fdr"], top_k=cal_cfg["summary_top_k"], pool_k=cal_cfg["pool_k"],
                    recurrence_top_k=cal_cfg["recurrence_top_k"])
    body = head_sets(cal.ic_mean, L, H, pool_k=cal_cfg["pool_k"])
    write_json(out / "head_sets_contrast.json", body)
    write_json(root / "HD-002" / "head_sets_contrast.json", body)
    write_json(out / "calibration.json", {**cal.summary, "n_layers": L, "n_heads": H})
    rows_by_note, firsts = {}, {}
    for note in notes:
        rows_by_note[note], firsts[note] = _patch_rows(rng, note, bins, L * H)
        write_jsonl(out / note / "patch2.jsonl", rows_by_note[note])
    summary = summarize(rows_by_note, bins=bins, min_range=instrument["knockin"]["min_range"])
    summary.update(bins=bins, n_heads_total=L * H)
    summary["p2c_exact_refinement"] = exact_refinement(rows_by_note, firsts, cal.ic_mean["P2C"],
                                                       top_k=cal_cfg["pool_k"], fdr=cal_cfg["fdr"])
    write_json(out / "faithfulness2.json", summary)
    exact = rng.normal(0, 0.3, (10, L * H))
    top_k = instrument["selftest"]["selftest_top_k"]
    write_json(out / "selftest.json", {
        "note_id": "n0", "n_events": 10, "n_heads": L * H, "top_k": top_k, "forward_margin_noise_sd": 0.046,
        "forward_noise_range": 0.09, "single_head_detection_floor": 0.14,
        **{name: fidelity(exact, exact + rng.normal(0, s, exact.shape), floor=0.14, top_k=top_k)
           for name, s in (("intact", 0.1), ("detached", 0.5), ("integrated_gradients", 0.3))}})
    for i, note in enumerate(notes):   # the full run's first-order rows and the proxy pass's DLA rows
        first_order = rng.normal(0, 0.1, (len(kinds), L, H)).astype(np.float32)
        positions = np.arange(len(kinds)) * 7 + 10   # the decision events' positions are patch2.jsonl's
        write_npz(out / note / "attr.npz", kinds=np.asarray(kinds), positions=positions, first_order=first_order)
        decisions = np.asarray([k != "NULL" for k in kinds])
        dla = -0.3 * first_order[decisions] + rng.normal(0, 0.1, first_order[decisions].shape)
        write_npz(root / "HD-001-proxy" / note / "proxy.npz", kinds=np.asarray(kinds)[decisions],
                  positions=positions[decisions], occurrence=np.zeros(decisions.sum(), dtype=np.int64),
                  c=dla.astype(np.float32), m=np.zeros_like(dla, dtype=np.float32),
                  margin=np.ones(decisions.sum(), dtype=np.float32),
                  target_logit=np.full(decisions.sum(), 20.0, dtype=np.float32))
    # the isolation pass's summary (App. D; stage HD-001-isolation) at the paper's bins
    isolation, iso_bins = root / "HD-001-isolation", params["isolation"]["bins"]
    params["isolation"] = {**params["isolation"], "out_dir": str(isolation)}
    write_json(isolation / "isolation.json", isolation_summary(
        {note: {"bins": np.asarray(iso_bins), "margin_clean": rng.uniform(2, 6, 3),
                "margin_isolated": rng.normal(-1, 1, (3, len(iso_bins))),
                "margin_ablated": rng.normal(1, 1, (3, len(iso_bins)))} for note in notes}, iso_bins))
    return params, body, cal.summary


@pytest.mark.parametrize("rid", ["R-C2", "R-C3", "R-C4"])
def test_instrument_readers_write_the_paper_keys_on_paper_shaped_artifacts(paper_hd001, rid):
    params, *_ = paper_hd001
    module = reader(rid)
    values, inputs = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    missing = set(REGISTRY.expected("paper").values[rid]) - set(values)
    assert missing == set(REGISTRY.results[rid].unproduced_keys)
    assert inputs


def test_r_c4_named_heads_and_layer_ranges_by_hand(paper_hd001):
    params, body, cal = paper_hd001
    values, _ = reader("R-C4").compute_values(params)
    ranked = {p: [(r["layer"], r["head"]) for r in body["phases"][p]] for p in PHASES}
    assert all(ranked[p][0] == (39, 38) for p in PHASES)
    assert values["l39h38_ic_p1"]["value"] == body["phases"]["P1"][0]["ic"]
    assert values["l39h38_weight_top40_p1_p2_p2c"]["value"] == [body["phases"][p][0]["weight"] for p in PHASES]
    assert values["l30h11_rank_p2c"]["value"] == 1 + ranked["P2C"].index((30, 11))
    assert values["l30h11_rank_p1"]["value"] == 1 + ranked["P1"].index((30, 11))
    counts = cal["recurrence"]["counts"]
    assert values["recurrence_counts_l39h38_l39h13_l26h36_l26h37_l28h21"]["value"] == [
        counts[39 * 40 + 38], counts[39 * 40 + 13], counts[26 * 40 + 36], counts[26 * 40 + 37], counts[28 * 40 + 21]]
    layers = [layer for layer, _ in ranked["P1"][:40]]
    ranges = ((0, 11), (12, 23), (24, 31), (32, 39))
    assert [values[f"chapter_top40_heads_in_layers_{a}_{b}"]["value"] for a, b in ranges] == [
        sum(a <= x <= b for x in layers) for a, b in ranges]
    ic = [r["ic"] for r in body["phases"]["P1"][:40]]
    share = 100 * sum(v for v, x in zip(ic, layers) if 24 <= x <= 31) / sum(ic)
    assert values["chapter_top40_importance_share_layers_24_31"]["value"] == pytest.approx(share)


def test_r_c3_operating_points_by_hand(paper_hd001):
    params, *_ = paper_hd001
    values, _ = reader("R-C3").compute_values(params)
    for p in ("p1", "p2", "p2c"):
        assert values[f"notes_knockin_above_random_{p}"]["value"] == values[f"notes_knockin_above_random_{p}_k40"][
            "value"]
    counts = [values[f"notes_necessity_above_random_{p}_k8"]["value"] for p in ("p1", "p2")]
    assert values["notes_necessity_above_random_p1_p2"]["value"] == [min(counts), max(counts)]
    bottom = [values[f"knockin_bottom{k}_p1"]["value"] for k in (3, 8, 16, 40, 100)]
    assert values["knockin_bottom_sets_p1"]["value"] == [min(bottom), max(bottom)]
    gap = max(abs(values[f"knockin_top40_{p}"]["value"] - values[f"own_ranking_knockin_top40_{p}"]["value"])
              for p in ("p2", "p2c"))
    assert values["global_vs_own_top40_knockin_gap_max"]["value"] == pytest.approx(gap)


def _write_las(directory: Path, rng) -> None:
    """Stage LAS's las.json of one run (`mistill evaluate fidelity --simulator`), the leakage-adjusted LAS beside
    App. K's."""
    from mistill.evaluate.leakage_adjusted import leakage_adjusted

    per_note = {n: float(rng.uniform(-0.5, 1.0)) for n in GOLD}
    leaking = {n: bool(i % 2) for i, n in enumerate(GOLD)}
    adjusted = leakage_adjusted(list(per_note.values()), list(leaking.values()))
    write_json(directory / "las.json", {"metrics": {"las": float(np.mean(list(per_note.values()))),
                                                    "las_leakage_adjusted": adjusted.value},
                                        "per_note": {"las": per_note, "leaks": leaking},
                                        "leakage_adjusted": adjusted.as_dict()})


@pytest.fixture(scope="module")
def paper_evaluations(tmp_path_factory):
    """DT-eval directories of every Table 2 row at the paper's seeds, with fidelity (LAS included) and M1."""
    root = tmp_path_factory.mktemp("paper_eval")
    params = copy.deepcopy(PAPER_PARAMS)
    params["paths"] = {"artifacts": str(root / "artifacts"), "results": str(root / "results")}
    params["evaluate"]["test_notes"] = str(root / "dt_test.jsonl")
    params["evaluate"]["teacher_traces"] = str(root / "teacher.jsonl")
    params["stats"]["bootstrap_resamples"] = 200
    write_jsonl(root / "dt_test.jsonl", [{"note_id": n, "patient_id": f"p{n}", "text": "x", "gold_codes": g,
                                          "split": "test"} for n, g in GOLD.items()])
    write_jsonl(root / "teacher.jsonl", [{"note_id": n, "valid": True, "answer": g} for n, g in GOLD.items()])
    rng = np.random.default_rng(1)
    codes = sorted({c for g in GOLD.values() for c in g})
    m1 = {k: {"pooled": 0.6, "per_note": {n: float(rng.uniform()) for n in GOLD}} for k in PHASES}
    for row, label in params["evaluate"]["own_heads"]["arms"].items():
        for seed in ([0] if row.endswith("untrained") else [0, 1, 2]):
            preds = {n: sorted(rng.choice(codes, 2, replace=False).tolist()) if i % 3 else None
                     for i, n in enumerate(GOLD)}
            preds["n1"] = GOLD["n1"]                      # a completed answer with a prediction
            write_arm(root / "artifacts", label, seed, preds, m1)
            write_json(root / "artifacts" / "DT-eval" / f"{label}-s{seed}" / "fidelity.json",
                       {"metrics": {"bleu4": 0.17, "ppl_median": 1.5},
                        "per_note": {"bleu4": {n: float(rng.uniform()) for n in GOLD}}})
            _write_las(root / "artifacts" / "LAS" / f"{label}-s{seed}", rng)
    params["baselines"]["dir"] = str(root / "artifacts" / "baselines")
    baselines = Path(params["baselines"]["dir"])
    for arm, section in params["baselines"].items():   # the baseline arms' runs (R-D3, R-D4)
        if not isinstance(section, dict):
            continue
        for run in section["runs"].values():
            label = baseline_label(params, arm, run["student"])
            preds = {n: sorted(rng.choice(codes, 2, replace=False).tolist()) for n in GOLD}
            write_arm(baselines, label, run["seed"], preds, m1)
            write_json(baselines / "DT-eval" / f"{label}-s{run['seed']}" / "fidelity.json",
                       {"metrics": {"bleu4": 0.2, "ppl_median": 1.6},
                        "per_note": {"bleu4": {n: float(rng.uniform()) for n in GOLD}}})
            _write_las(root / "artifacts" / "LAS" / f"{label}-s{run['seed']}", rng)
            write_json(baselines / "DT-000" / f"{label}-s{run['seed']}" / "config.json",
                       {"example_ids": ["t1", "t2", "t3"], "completions_cut": 2})
    return params


@pytest.mark.parametrize("rid", ["R-D1", "R-D2", "R-D4", "R-D5"])
def test_distillation_readers_write_the_paper_keys_on_paper_shaped_evaluations(paper_evaluations, rid):
    module = reader(rid)
    values, _ = module.compute_values(paper_evaluations)
    _assert_writes_what_it_lists(module, paper_evaluations, values)
    assert set(REGISTRY.expected("paper").values[rid]) - set(REGISTRY.results[rid].unproduced_keys) <= set(values)


def test_r_d3_writes_the_paper_keys_on_paper_shaped_evaluations_and_own_heads(paper_evaluations):
    """Feature-KD's task rows from the evaluations, its own-heads cells from M6 chains of both students'
    Feature-KD runs and of fp32 Vanilla CoT-KD."""
    params = copy.deepcopy(paper_evaluations)
    root = Path(params["paths"]["artifacts"])
    k, rng, notes = max(params["evaluate"]["own_heads"]["bins"]), np.random.default_rng(4), list(GOLD)
    labels = [(Path(params["baselines"]["dir"]), baseline_label(params, "featurekd", run["student"]), run["seed"])
              for run in params["baselines"]["featurekd"]["runs"].values()]
    labels += [(root, params["evaluate"]["own_heads"]["arms"][f"{family}_vanilla_fp32"], 0) for family in ("qwen", "smollm")]
    for own_root, label, seed in labels:
        m6 = arm_dirs(own_root, label, seed)[1]
        for note in notes:
            write_jsonl(m6 / note / "patch2.jsonl", _m6_rows(rng, k))
        write_json(m6 / "faithfulness2.json", {"notes": notes, "bins": params["evaluate"]["own_heads"]["bins"]})
    module = reader("R-D3")
    values, _ = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    assert set(REGISTRY.expected("paper").values["R-D3"]) - set(REGISTRY.results["R-D3"].unproduced_keys) <= set(values)
    assert values["qwen_featurekd_microf1_seeds"]["value"] == pytest.approx(
        [json.loads((labels[0][0] / "DT-eval" / f"{labels[0][1]}-s{s}" / "task.json").read_text())["metrics"]["micro_f1"]
         for s in (0, 1, 2)])


def _m6_rows(rng, k: int) -> list[dict]:
    def row(kind):
        return {"kind": kind, "pos": 1, "margin_clean": 2.0, "margin_corr": 0.0, "margin_all": 2.0,
                "knockin": {"top": {str(k): 2.0 * rng.uniform()}, "random": {str(k): 0.2 * rng.uniform()}}}
    return [row(kind) for kind in PHASES]


def test_r_d6_writes_the_paper_keys_on_paper_shaped_own_heads_artifacts(tmp_path):
    params = copy.deepcopy(PAPER_PARAMS)
    params["paths"] = {"artifacts": str(tmp_path), "results": str(tmp_path / "results")}
    params["stats"]["bootstrap_resamples"] = 200
    section = params["evaluate"]["own_heads"]
    section["teacher_faithfulness"] = str(tmp_path / "HD-002" / "faithfulness2.json")
    k, rng, notes = max(section["bins"]), np.random.default_rng(2), [f"n{i}" for i in range(6)]
    write_json(tmp_path / "HD-002" / "faithfulness2.json", {"phases": {phase: {"bins": {
        str(section["teacher_k"]): {"knockin": {"top": {"median": 0.85}}}}} for phase in PHASES}})
    for row, label in section["arms"].items():
        for seed in ([0] if row.endswith("untrained") else [0, 1, 2]):
            m6 = arm_dirs(tmp_path, label, seed)[1]
            for note in notes:
                write_jsonl(m6 / note / "patch2.jsonl", _m6_rows(rng, k))
            write_json(m6 / "faithfulness2.json", {"notes": notes, "bins": section["bins"], "phases": {
                "P2C": {"all_heads_minus_clean_max_abs": 1e-5}}})
            lift = {n: {"lift": float(rng.uniform(0, 1))} for n in notes}
            panel = {"lift": float(rng.uniform(0, 2)), "share_prefix": float(rng.uniform(0, 0.5))}
            write_json(m6 / "readside.json", {"phases": {p: {"per_note": {"top": lift, "random": lift}, "top": panel}
                                                         for p in PHASES}})
    module = reader("R-D6")
    values, _ = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    assert set(REGISTRY.expected("paper").values["R-D6"]) <= set(values)



def _readside_rows(heads: list[int], shares_n: list[float]) -> list[dict]:
    """One note's readside.jsonl: one P2C event where each head puts `shares_n` on the near-miss's mentions."""
    from mistill.instrument.readside import CAT, CATEGORIES

    shares = []
    for share in shares_n:
        row = [0.0] * len(CATEGORIES)
        row[CAT["trace_N"]] = share
        shares.append(row)
    return [{"kind": "P2C", "pos": 5, "heads": heads, "shares": shares, "lift": [1.0] * len(heads)}]


def test_r_d15_readouts_by_hand(tmp_path):
    """Paper-shaped own-heads, evaluation and locus artifacts whose M4, M3 and M5 values are set by hand."""
    from tests.chain.test_readers import write_arm
    from tests.locus.test_r_c6 import _mention

    params = copy.deepcopy(PAPER_PARAMS)
    params["paths"] = {"artifacts": str(tmp_path), "results": str(tmp_path / "results")}
    section = params["evaluate"]["own_heads"]
    section["teacher_faithfulness"] = str(tmp_path / "HD-002" / "faithfulness2.json")
    k, notes, heads = max(section["bins"]), ["n0", "n1", "n2"], [7, 3, 12]   # 3 of 4-head layers: l1h3, l0h3, l3h0
    write_json(tmp_path / "HD-002" / "faithfulness2.json", {"phases": {"P1": {"bins": {
        str(section["teacher_k"]): {"knockin": {"top": {"median": 0.915}}}}}}})
    # every arm's P1 knock-in recovers (m_set - 0) / 2: untrained Qwen 0.9, 1.0, 0.95 -> median 0.95
    recovery = {"qwen_untrained": [0.9, 1.0, 0.95], "smollm_untrained": [0.99, 0.98, 0.97]}
    # M3 share_N per arm (readside.json) and which head leads the loop-back per arm (readside.jsonl)
    m3 = {"qwen_untrained": 0.05, "qwen_vanilla_fp32": 0.08, "qwen_vanilla_bf16": 0.04, "qwen_mistill": 0.06,
          "smollm_untrained": 0.081, "smollm_vanilla_fp32": 0.058, "smollm_vanilla_bf16": 0.05, "smollm_mistill": 0.025}
    for row, label in section["arms"].items():
        for seed in ([0] if row.endswith("untrained") else [0, 1, 2]):
            hd, m6 = arm_dirs(tmp_path, label, seed)
            write_json(hd / "head_sets_contrast.json", {"n_layers": 4, "n_heads": 4, "phases": {}})
            lead = 1 if row == "qwen_vanilla_bf16" else 0      # l0h3 leads one Qwen arm's loop-back, l1h3 the rest
            for i, note in enumerate(notes):
                value_p1 = 2.0 * recovery.get(row, [0.5] * 3)[i]
                write_jsonl(m6 / note / "patch2.jsonl", [{"kind": "P1", "pos": 1, "margin_clean": 2.0,
                                                         "margin_corr": 0.0, "margin_all": 2.0,
                                                         "knockin": {"top": {str(k): value_p1}}}])
                write_jsonl(m6 / note / "readside.jsonl",
                            _readside_rows(heads, [0.3 if h == lead else 0.1 for h in range(3)]))
            share = m3[row] + (0.01 * seed if row == "smollm_mistill" else 0.0)   # seeds 0.025, 0.035, 0.045
            write_json(m6 / "faithfulness2.json", {"notes": notes, "bins": section["bins"], "phases": {}})
            write_json(m6 / "readside.json", {"panels": {"P2C": {"top": heads}},
                                              "phases": {"P2C": {"top": {"share_N": share}}}})
    # M5: window distances per arm, and the teacher's on the shortlist traces
    params["locus"]["shortlist_out_dir"] = str(tmp_path / "HD-002-locus")
    for directory, distances in (("M5/student-qwen-untrained-s0", [8, 9, 7]),
                                 ("M5/student-qwen-vanilla-fp32-s0", [7, 6, 8, 7]),
                                 ("M5/student-qwen-mistill-bf16-s0", [7]), ("HD-002-locus", [9, 10, 8])):
        mentions = [_mention(i, "window", d) for i, d in enumerate(distances)] + [_mention(9, "never", None)]
        write_json(tmp_path / directory / "n0" / "locus.json", {"note_id": "n0", "mentions": mentions})
    params["student_locus"]["out_dir"] = str(tmp_path / "M5")
    # SmolLM3's task: untrained gets nothing right, fp32 Vanilla seed 0 one code of note n1
    from tests.chain.test_readers import GOLD

    write_arm(tmp_path, section["arms"]["smollm_untrained"], 0, {n: [] for n in GOLD})
    write_arm(tmp_path, section["arms"]["smollm_vanilla_fp32"], 0, {n: (GOLD[n] if n == "n1" else []) for n in GOLD})
    module = reader("R-D15")
    values, _ = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    assert set(REGISTRY.expected("paper").values["R-D15"]) <= set(values)
    v = {key: x["value"] for key, x in values.items()}
    assert v["untrained_qwen_own_p1_k40"] == pytest.approx(0.95)
    assert v["untrained_smollm_own_p1_k40"] == pytest.approx(0.98)
    assert v["teacher_own_p1_k40"] == 0.915
    assert v["m5_locus_distance_untrained_vanilla_mistill"] == [8.0, 7.0, 7.0]
    assert v["m5_window_share_untrained_vanilla_mistill"] == pytest.approx([75.0, 80.0, 50.0])
    assert v["m5_locus_distance_teacher"] == 9.0
    assert (v["smollm_m3_untrained"], v["smollm_m3_vanilla_s0"]) == (0.081, 0.058)
    assert v["smollm_m3_mistill"] == pytest.approx(0.035)
    # Qwen: untrained, vanilla fp32 s0-2, vanilla bf16 s0-2, mistill s0-2
    assert v["qwen_m3_arms_read"] == 10 and v["qwen_m3_range_23_arms"] == [0.04, 0.08]
    assert v["l24h21_top_loopback_arms"] == 7 and "l1h3, the most frequent" in values["l24h21_top_loopback_arms"][
        "statistic"]
    untrained_f1 = json.loads((tmp_path / "DT-eval" / f"{section['arms']['smollm_untrained']}-s0" / "task.json"
                               ).read_text())["metrics"]["micro_f1"]
    assert v["smollm_microf1_untrained_to_vanilla"][0] == untrained_f1 == 0.0
    assert v["smollm_microf1_untrained_to_vanilla"][1] > 0


def _variant_params(tmp_path: Path, *, test_notes: bool = False) -> dict:
    """The paper profile's params with its artifacts, variants and (when asked) test notes under tmp_path."""
    from tests.chain.test_readers import GOLD

    params = copy.deepcopy(PAPER_PARAMS)
    params["paths"] = {"artifacts": str(tmp_path), "results": str(tmp_path / "results")}
    params["stats"]["bootstrap_resamples"] = 200
    params["variants"]["dir"] = str(tmp_path / "variants")
    if test_notes:
        write_jsonl(tmp_path / "dt_test.jsonl", [{"note_id": n, "patient_id": f"p{n}", "text": "x", "gold_codes": g,
                                                  "split": "test"} for n, g in GOLD.items()])
        params["evaluate"]["test_notes"] = str(tmp_path / "dt_test.jsonl")
    return params


def _read_by_hand(rid: str, params: dict) -> tuple[dict, dict]:
    """A reader run on hand-made artifacts: (its values, their bare numbers), once it has written exactly the
    keys it lists and every paper key."""
    module = reader(rid)
    values, _ = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    assert set(REGISTRY.expected("paper").values[rid]) <= set(values)
    return values, {key: x["value"] for key, x in values.items()}


def _own_heads_by_hand(where: dict, seed: int, notes: list[str], recovery: dict, lifts: dict, bins: list[int],
                       lift_phase: str) -> None:
    """M6 directories whose per-note recoveries (margin_all 2, margin_corr 0: a knock-in margin of 2r recovers r)
    and M2 lifts at `lift_phase` are the given ones."""
    for arm, (root, label) in where.items():
        m6 = arm_dirs(root, label, seed)[1]
        for i, note in enumerate(notes):
            write_jsonl(m6 / note / "patch2.jsonl", [
                {"kind": phase, "pos": 1, "margin_clean": 2.0, "margin_corr": 0.0, "margin_all": 2.0,
                 "knockin": {"top": {str(kk): 2.0 * recovery[arm][(ph, kk)][i] for ph, kk in recovery[arm]
                                     if ph == phase}}}
                for phase in sorted({ph for ph, _ in recovery[arm]})])
        write_json(m6 / "faithfulness2.json", {"notes": notes, "bins": bins})
        write_json(m6 / "readside.json", {"phases": {lift_phase: {"per_note": {"top": {
            n: {"lift": float(x)} for n, x in zip(notes, lifts[arm])}}}}})


def test_r_d24_uniform_attention_against_mistill_by_hand(tmp_path):
    """The uniform-attention variant against Mistill at its seed: recoveries, lifts, generations and M1 set by
    hand; the λ is the one its run config recorded."""
    from mistill.distill.runs import variant_label, variant_run_dir
    from tests.chain.test_readers import GOLD, write_arm

    params = _variant_params(tmp_path)
    section, entry = params["evaluate"]["own_heads"], params["variants"]["arms"]["uniform"]
    k, k8, notes = max(section["bins"]), min(section["bins"]), [f"n{i}" for i in range(6)]
    rng = np.random.default_rng(8)
    recovery = {arm: {("P2C", kk): rng.uniform(0.3, 1.0, len(notes)) for kk in (k, k8)}
                for arm in ("uniform", "mistill")}
    recovery["uniform"][("P2C", k)] = recovery["mistill"][("P2C", k)] + np.array([0.05, 0.04, 0.03, 0.02, 0.01, -0.01])
    lifts = {arm: rng.uniform(1.0, 4.0, len(notes)) for arm in recovery}
    label = variant_label("uniform", entry)
    _own_heads_by_hand({"uniform": (tmp_path / "variants", label), "mistill": (tmp_path, section["arms"]["qwen_mistill"])},
                       entry["seed"], notes, recovery, lifts, section["bins"], "P2C")
    m1 = {kind: {"pooled": share, "per_note": {}} for kind, share in (("P1", 0.9), ("P2", 0.7), ("P2C", 0.766))}
    write_arm(tmp_path / "variants", label, entry["seed"], {"n1": GOLD["n1"], "n2": None, "n3": None, "n4": GOLD["n4"]}, m1)
    write_arm(tmp_path, section["arms"]["qwen_mistill"], entry["seed"], {n: GOLD[n] for n in GOLD},
              {kind: {**cell, "pooled": 0.802} for kind, cell in m1.items()})
    run = variant_run_dir(params["variants"]["dir"], "uniform", entry)
    write_json(run / "config.json", {"arm": {"lambda_p1": 0.135, "lambda_p2": 0.135}, "dose": {"lambda": 0.135}})
    values, v = _read_by_hand("R-D24", params)
    assert v["uniform_own_p2c_k40"] == pytest.approx(np.median(recovery["uniform"][("P2C", k)]))
    assert v["uniform_own_p2c_k8"] == pytest.approx(np.median(recovery["uniform"][("P2C", k8)]))
    assert v["uniform_vs_mistill_s0_p2c"] == pytest.approx(0.14 / 6)       # mean of the six per-note differences
    assert "5 higher / 1 lower of 6" in values["uniform_vs_mistill_s0_p2c"]["statistic"]
    assert v["uniform_m2_lift"] == pytest.approx(np.median(lifts["uniform"]))
    assert v["mistill_s0_m2_lift_p2c"] == pytest.approx(np.median(lifts["mistill"]))
    assert (v["uniform_cap_rate"], v["mistill_s0_cap_rate"]) == (0.5, 0.0)   # two of four generations hit the cap
    assert (v["uniform_m1_p2c"], v["mistill_s0_m1_p2c"]) == (0.766, 0.802)
    assert v["uniform_lambda"] == 0.135 and v["mistill_s0_microf1"] == 1.0 and 0 < v["uniform_microf1"] < 1


def test_r_d25_no_window_against_mistill_and_vanilla_by_hand(tmp_path):
    """The no-window variant (under variants.dir) against Mistill and fp32 Vanilla CoT-KD at its seed:
    recoveries, M2 lifts and micro-F1 set by hand; the paired differences against numpy and scipy."""
    from scipy.stats import binomtest

    from mistill.distill.runs import variant_label
    from tests.chain.test_readers import GOLD, write_arm

    params = _variant_params(tmp_path)
    section, entry = params["evaluate"]["own_heads"], params["variants"]["arms"]["nowindow"]
    k, k8 = max(section["bins"]), min(section["bins"])
    notes = [f"n{i}" for i in range(7)]
    # per-note recovery (margin_all 2, margin_corr 0: a knock-in margin of 2r recovers r) at P1 and P2C, k and k8
    rng = np.random.default_rng(6)
    recovery = {arm: {(phase, kk): rng.uniform(0.3, 1.0, len(notes)) for phase in ("P1", "P2C") for kk in (k, k8)}
                for arm in ("nowindow", "mistill", "vanilla")}
    recovery["nowindow"][("P2C", k)] = recovery["mistill"][("P2C", k)] - np.linspace(0.001, 0.02, len(notes))
    lifts = {arm: rng.uniform(1.0, 3.0, len(notes)) for arm in recovery}
    where = {"nowindow": (tmp_path / "variants", variant_label("nowindow", entry)),
             "mistill": (tmp_path, section["arms"]["qwen_mistill"]),
             "vanilla": (tmp_path, section["arms"]["qwen_vanilla_fp32"])}
    _own_heads_by_hand(where, entry["seed"], notes, recovery, lifts, section["bins"], "P1")
    write_arm(tmp_path / "variants", variant_label("nowindow", entry), entry["seed"], {n: GOLD[n] for n in GOLD})
    write_arm(tmp_path, section["arms"]["qwen_mistill"], entry["seed"], {n: (GOLD[n] if n == "n1" else []) for n in GOLD})
    values, v = _read_by_hand("R-D25", params)
    assert v["nowindow_own_p1_k40"] == pytest.approx(np.median(recovery["nowindow"][("P1", k)]))
    assert v["mistill_s0_own_p2c_k40"] == pytest.approx(np.median(recovery["mistill"][("P2C", k)]))
    assert v["nowindow_minus_mistill_p2c"] == pytest.approx(-np.mean(np.linspace(0.001, 0.02, len(notes))))
    low, high = v["nowindow_minus_mistill_p2c_interval"]
    assert low <= v["nowindow_minus_mistill_p2c"] <= high < 0
    sign_p = binomtest(len(notes), len(notes)).pvalue       # lower on every note
    assert f"sign p {sign_p:.3g}" in values["nowindow_minus_mistill_p2c"]["statistic"]
    assert v["nowindow_vs_vanilla_k8"] == pytest.approx(np.mean(recovery["nowindow"][("P2C", k8)]
                                                                - recovery["vanilla"][("P2C", k8)]))
    assert v["nowindow_m2_lift_p1"] == pytest.approx(np.median(lifts["nowindow"]))
    assert v["mistill_s0_m2_lift_p1"] == pytest.approx(np.median(lifts["mistill"]))
    assert v["nowindow_microf1"] == 1.0 and 0 < v["mistill_s0_microf1"] < 1.0
    # the variant must be read at its own seed
    params["variants"]["arms"]["nowindow"]["seed"] = 1
    with pytest.raises(UserError, match="-s1"):
        reader("R-D25").compute_values(params)


def test_r_d14_ablations_by_hand(tmp_path):
    """The five ablation variants at seed 0, Mistill and the untrained student: recoveries and answers set by
    hand; the paired differences against numpy and scipy, the F1 differences against per-note F1 by hand."""
    from scipy.stats import binomtest

    from mistill.distill.runs import variant_label
    from tests.chain.test_readers import GOLD, write_arm

    params = _variant_params(tmp_path, test_notes=True)
    section, arms = params["evaluate"]["own_heads"], params["variants"]["arms"]
    k, k8, notes = max(section["bins"]), min(section["bins"]), [f"n{i}" for i in range(8)]
    names = ("p1only", "p2only", "attnonly", "interonly", "lam003")
    where = {name: (tmp_path / "variants", variant_label(name, arms[name])) for name in names}
    where |= {"mistill": (tmp_path, section["arms"]["qwen_mistill"]),
              "untrained": (tmp_path, section["arms"]["qwen_untrained"])}
    rng = np.random.default_rng(14)
    recovery = {arm: {("P2C", kk): rng.uniform(0.3, 0.9, len(notes)) for kk in (k, k8)} for arm in where}
    step = np.array([0.05, 0.04, 0.03, 0.02, 0.01, 0.02, -0.01, 0.03])
    recovery["p2only"][("P2C", k)] = recovery["p1only"][("P2C", k)] + step          # 7 higher, 1 lower
    recovery["attnonly"][("P2C", k)] = recovery["interonly"][("P2C", k)] - step     # 1 higher, 7 lower
    _own_heads_by_hand(where, 0, notes, recovery, {arm: np.ones(len(notes)) for arm in where}, section["bins"], "P2C")
    # answers: Mistill exact on every note; P1-only misses n3's second code and answers n4 wrongly
    for name in (*names, "mistill"):
        preds = {n: list(g) for n, g in GOLD.items()}
        if name == "p1only":
            preds |= {"n3": ["D00.0"], "n4": ["Z99.9"]}
        write_arm(where[name][0], where[name][1], 0, preds)
    write_arm(tmp_path / "variants", variant_label("randheads1", arms["randheads1"]), arms["randheads1"]["seed"],
              {n: (GOLD[n] if n != "n2" else []) for n in GOLD})
    values, v = _read_by_hand("R-D14", params)
    assert v["qwen_p1only_own_p2c"] == pytest.approx(np.median(recovery["p1only"][("P2C", k)]))
    assert v["qwen_lambda_003_003_own_p2c"] == pytest.approx(np.median(recovery["lam003"][("P2C", k)]))
    assert v["qwen_attnonly_own_p2c_k8"] == pytest.approx(np.median(recovery["attnonly"][("P2C", k8)]))
    assert v["untrained_own_p2c"] == pytest.approx(np.median(recovery["untrained"][("P2C", k)]))
    assert v["p2only_minus_p1only"] == pytest.approx(step.mean())
    assert "7 higher / 1 lower of 8" in values["p2only_minus_p1only"]["statistic"]
    for name in ("p2only", "attnonly", "interonly"):
        assert v[f"{name}_minus_untrained"] == pytest.approx(np.mean(recovery[name][("P2C", k)]
                                                                     - recovery["untrained"][("P2C", k)]))
    assert v["attnonly_minus_interonly"] == pytest.approx(-step.mean())
    assert v["attnonly_vs_interonly_p"] == pytest.approx(binomtest(1, 8).pvalue)
    # per-note F1 of P1-only: n3 2/3 (one of two codes), n4 0; every other note 1 -> mean difference -(1/3 + 1) / 4
    assert v["p1only_minus_mistill_f1"] == pytest.approx(-(1 / 3 + 1) / 4)
    assert v["p2only_minus_mistill_f1"] == 0.0 and v["p2only_minus_mistill_f1_interval"] == [0.0, 0.0]
    assert v["qwen_p2only_microf1"] == 1.0 and v["qwen_p1only_microf1"] == pytest.approx(2 * 4 / (2 * 4 + 1 + 2))
    assert v["qwen_randheads_seed1_microf1"] == pytest.approx(2 * 5 / (2 * 5 + 1))   # n2's one code missed
    # another variant is read at the first one's student and seed, or not at all
    params["variants"]["arms"]["lam003"]["seed"] = 1
    with pytest.raises(UserError, match="lam003"):
        reader("R-D14").compute_values(params)


def test_r_d13_head_pool_controls_by_hand(tmp_path):
    """Bottom, k8, k100 and RandHeads pools of both students beside Mistill and the untrained student: recoveries,
    lifts, prefix shares, head rankings, pools and answers set by hand."""
    from mistill.distill.runs import variant_label, variant_run_dir
    from tests.chain.test_readers import GOLD, write_arm

    params = _variant_params(tmp_path, test_notes=True)
    section, arms = params["evaluate"]["own_heads"], params["variants"]["arms"]
    k, k8, notes = max(section["bins"]), min(section["bins"]), [f"n{i}" for i in range(6)]
    rng = np.random.default_rng(13)
    main = {"qwen_mistill": 0, "qwen_untrained": 0, "smollm_mistill": 0, "smollm_untrained": 0}
    where = {name: ((tmp_path / "variants", variant_label(name, arms[name])), int(arms[name]["seed"]))
             for name in ("bottom", "k8", "k100", "randheads", "smolbottom", "smolbottom1", "smolk8", "smolrandheads")}
    where |= {row: ((tmp_path, section["arms"][row]), seed) for row, seed in main.items()}
    where["smollm_mistill1"] = ((tmp_path, section["arms"]["smollm_mistill"]), 1)
    recovery = {arm: {(ph, kk): rng.uniform(0.2, 0.9, len(notes)) for ph in ("P2", "P2C") for kk in (k, k8)}
                for arm in where}
    recovery["bottom"][("P2C", k)] = recovery["qwen_untrained"][("P2C", k)] - np.array([.1, .1, .1, .1, -.1, .1])
    recovery["smolk8"][("P2C", k)] = recovery["smolrandheads"][("P2C", k)] + 0.05
    lifts = {arm: rng.uniform(1.0, 4.0, len(notes)) for arm in where}
    prefix = {arm: float(x) for arm, x in zip(where, rng.uniform(0.1, 0.5, len(where)))}
    for arm, (root_label, seed) in where.items():
        _own_heads_by_hand({arm: root_label}, seed, notes, recovery, lifts, section["bins"], "P2C")
        readside = arm_dirs(*root_label, seed)[1] / "readside.json"
        body = json.loads(readside.read_text())
        body["phases"]["P2C"]["top"] = {"share_prefix": prefix[arm]}
        write_json(readside, body)
    # head rankings: 4 layers x 4 heads (the paper profile's k40 ranks 40 of 144 here, 12 x 12)
    n_layers = n_heads = 12
    ic = {arm: rng.normal(size=n_layers * n_heads) for arm in where}
    for arm, ((root, label), seed) in where.items():
        order = np.argsort(-ic[arm], kind="stable")
        write_json(arm_dirs(root, label, seed)[0] / "head_sets_contrast.json", {
            "n_layers": n_layers, "n_heads": n_heads, "phases": {p: [
                {"layer": int(h) // n_heads, "head": int(h) % n_heads, "ic": float(ic[arm][h])} for h in order]
                for p in ("P1", "P2", "P2C")}})
    # the bottom pools: the untrained student's most negative heads (as mistill.distill.pools builds them)
    for name, untrained in (("bottom", "qwen_untrained"), ("smolbottom", "smollm_untrained")):
        pool = [divmod(int(h), n_heads) for h in np.argsort(ic[untrained], kind="stable")[:k]]
        write_json(variant_run_dir(params["variants"]["dir"], name, arms[name]) / "config.json",
                   {"pools": {p: {"heads": [list(h) for h in pool]} for p in ("P1", "P2", "P2C")}})
    write_arm(tmp_path / "variants", where["bottom"][0][1], 0, {n: list(g) for n, g in GOLD.items()})
    write_arm(tmp_path / "variants", where["smolbottom"][0][1], 0, {n: list(g) for n, g in GOLD.items()})
    write_arm(tmp_path / "variants", where["smolbottom1"][0][1], 1, {n: (GOLD[n] if n != "n2" else []) for n in GOLD})
    write_arm(tmp_path / "variants", where["smolk8"][0][1], 0, {n: (GOLD[n] if n != "n4" else []) for n in GOLD})
    write_arm(tmp_path, section["arms"]["smollm_mistill"], 0, {n: list(g) for n, g in GOLD.items()})
    values, v = _read_by_hand("R-D13", params)

    med = lambda arm, ph="P2C", kk=k: pytest.approx(np.median(recovery[arm][(ph, kk)]))
    assert v["qwen_bottom40_own_p2c"] == med("bottom") and v["qwen_k100_own_p2c"] == med("k100")
    assert v["smollm_bottom40_own_p2c_seeds"] == [med("smolbottom"), med("smolbottom1")]
    assert v["qwen_bottom40_lower_than_untrained_notes"] == 5
    assert v["smollm_k8_minus_randheads"] == pytest.approx(0.05)
    assert "6 higher / 0 lower of 6" in values["smollm_k8_minus_randheads"]["statistic"]
    rh = recovery["smolrandheads"][("P2C", k)]
    assert v["smollm_bottom40_minus_randheads"] == pytest.approx(
        [np.mean(recovery[b][("P2C", k)] - rh) for b in ("smolbottom", "smolbottom1")])
    assert v["smollm_k8_minus_bottom40"] == pytest.approx(
        [np.mean(recovery["smolk8"][("P2C", k)] - recovery[b][("P2C", k)]) for b in ("smolbottom", "smolbottom1")])
    assert v["smollm_p2_bottom40_k8_mistill"] == [med(a, "P2") for a in ("smolbottom", "smolbottom1", "smolk8",
                                                                         "smollm_mistill", "smollm_mistill1")]
    assert v["qwen_p2_k100_randheads_bottom_mistill_untrained"] == [
        med(a, "P2") for a in ("k100", "randheads", "bottom", "qwen_mistill", "qwen_untrained")]
    assert v["qwen_top8_concentration_bottom40_vs_mistill"] == pytest.approx(
        [np.mean(recovery[a][("P2C", k8)]) for a in ("bottom", "qwen_mistill")])
    assert v["smollm_top8_concentration_bottom40_mistill_k8"] == pytest.approx(
        [np.mean(recovery[a][("P2C", k8)]) for a in ("smolbottom", "smolbottom1", "smollm_mistill", "smollm_mistill1",
                                                    "smolk8")])
    top = lambda arm: set(np.argsort(-ic[arm], kind="stable")[:k].tolist())
    shared = [len(top(a) & top(u)) for a, u in (("bottom", "qwen_untrained"), ("k8", "qwen_untrained"),
                                                ("k100", "qwen_untrained"), ("randheads", "qwen_untrained"),
                                                ("qwen_mistill", "qwen_untrained"), ("smolbottom", "smollm_untrained"),
                                                ("smolk8", "smollm_untrained"), ("smolrandheads", "smollm_untrained"),
                                                ("smollm_mistill", "smollm_untrained"),
                                                ("smolbottom1", "smollm_untrained"))]
    assert v["carriers_shared_with_untrained_top40"] == [min(shared), max(shared)]
    bottom_pool = set(np.argsort(ic["smollm_untrained"], kind="stable")[:k].tolist())
    assert v["bottom40_supervised_heads_in_own_top40"] == [len(bottom_pool & top("smolbottom"))] * 3
    for family, untrained in (("smollm", "smollm_untrained"), ("qwen", "qwen_untrained")):
        ranked = np.sort(ic[untrained])
        assert v[f"{family}_bottom40_importance_sum"] == pytest.approx(ranked[:k].sum())
        assert v[f"{family}_top40_importance_sum"] == pytest.approx(ranked[::-1][:k].sum())
    assert v["smollm_m2_k8_mistill_bottom40"] == pytest.approx(
        [np.median(lifts[a]) for a in ("smolk8", "smollm_mistill", "smolbottom")])
    assert v["smollm_prefix_bottom40_randheads_k8_mistill"] == pytest.approx(
        [prefix[a] for a in ("smolbottom", "smolrandheads", "smolk8", "smollm_mistill")])
    assert v["smollm_bottom40_task"] == pytest.approx((1.0 + 2 * 5 / 11) / 2)   # seed 1 misses n2's one code
    assert v["smollm_k8_minus_mistill_f1"] == pytest.approx(-1 / 4)              # n4 answered with nothing
    assert v["qwen_bottom40_task"] == 1.0


def test_r_d7_position_and_head_controls_by_hand(tmp_path):
    """RandPos, RandHeads and RandBoth beside Mistill and the untrained student: recoveries, lifts and prefix
    shares set by hand; the paired differences against numpy and scipy."""
    from scipy.stats import binomtest

    from mistill.distill.runs import variant_label

    params = _variant_params(tmp_path)
    section, arms = params["evaluate"]["own_heads"], params["variants"]["arms"]
    k, notes = max(section["bins"]), [f"n{i}" for i in range(7)]
    where = {name: (tmp_path / "variants", variant_label(name, arms[name]))
             for name in ("randpos", "randheads", "randboth", "smolrandpos", "smolrandheads")}
    where |= {row: (tmp_path, section["arms"][row]) for row in ("qwen_mistill", "qwen_untrained", "smollm_mistill",
                                                               "smollm_untrained")}
    rng = np.random.default_rng(7)
    recovery = {arm: {(ph, k): rng.uniform(0.3, 0.9, len(notes)) for ph in ("P2", "P2C")} for arm in where}
    recovery["randpos"][("P2C", k)] = recovery["qwen_untrained"][("P2C", k)] - 0.1       # below on every note
    recovery["randboth"][("P2C", k)] = recovery["randpos"][("P2C", k)] + np.linspace(0.1, 0.3, len(notes))
    lifts = {arm: rng.uniform(1.0, 4.0, len(notes)) for arm in where}
    _own_heads_by_hand(where, 0, notes, recovery, lifts, section["bins"], "P2C")
    prefix = {"randboth": 0.139, "qwen_untrained": 0.185}
    for arm, share in prefix.items():
        readside = arm_dirs(*where[arm], 0)[1] / "readside.json"
        body = json.loads(readside.read_text())
        body["phases"]["P2C"]["top"] = {"share_prefix": share}
        write_json(readside, body)
    values, v = _read_by_hand("R-D7", params)
    med = lambda arm, ph="P2C": pytest.approx(np.median(recovery[arm][(ph, k)]))
    assert (v["qwen_randpos_own_p2c"], v["smollm_randpos_own_p2c"]) == (med("randpos"), med("smolrandpos"))
    assert v["qwen_randheads_own_p2"] == med("randheads", "P2")
    assert v["smollm_mistill_s0_own_p2c"] == med("smollm_mistill")
    assert v["qwen_randpos_minus_untrained"] == pytest.approx(-0.1)
    assert f"sign p {binomtest(0, 7).pvalue:.3g}" in values["qwen_randpos_minus_untrained"]["statistic"]
    assert v["randboth_minus_randpos"] == pytest.approx(0.2)
    assert "7 higher / 0 lower of 7" in values["randboth_minus_randpos"]["statistic"]
    assert v["randboth_minus_randheads"] == pytest.approx(np.mean(recovery["randboth"][("P2C", k)]
                                                                  - recovery["randheads"][("P2C", k)]))
    assert v["qwen_randboth_m2_lift_p2c"] == pytest.approx(np.median(lifts["randboth"]))
    assert v["smollm_randpos_m2_lift_p2c"] == pytest.approx(np.median(lifts["smolrandpos"]))
    assert (v["qwen_randboth_prefix_share"], v["qwen_untrained_prefix_share"]) == (0.139, 0.185)


def test_r_d23_event_weighted_vanilla_by_hand(tmp_path):
    """The event-weighted Vanilla variant against fp32 Vanilla and Mistill at its seed: recoveries, answers, M1,
    the cap and both runs' logged extra losses set by hand."""
    from mistill.distill.runs import run_dir, variant_label, variant_run_dir
    from tests.chain.test_readers import GOLD, write_arm

    params = _variant_params(tmp_path)
    params["distill"]["runs_dir"] = str(tmp_path)
    section, entry = params["evaluate"]["own_heads"], params["variants"]["arms"]["evw4"]
    k, k8, notes = max(section["bins"]), min(section["bins"]), [f"n{i}" for i in range(6)]
    where = {"evw4": (tmp_path / "variants", variant_label("evw4", entry)),
             "mistill": (tmp_path, section["arms"]["qwen_mistill"]),
             "vanilla": (tmp_path, section["arms"]["qwen_vanilla_fp32"])}
    rng = np.random.default_rng(23)
    recovery = {arm: {("P2C", kk): rng.uniform(0.3, 0.9, len(notes)) for kk in (k, k8)} for arm in where}
    recovery["evw4"][("P2C", k)] = recovery["mistill"][("P2C", k)] - np.array([.1, .1, .1, .1, .1, -.1])
    recovery["evw4"][("P2C", k8)] = recovery["mistill"][("P2C", k8)] - 0.2
    _own_heads_by_hand(where, entry["seed"], notes, recovery, {a: np.ones(len(notes)) for a in where},
                       section["bins"], "P2C")
    m1 = {kind: {"pooled": share, "per_note": {}} for kind, share in (("P1", 0.9), ("P2", 0.7), ("P2C", 0.772))}
    write_arm(tmp_path / "variants", where["evw4"][1], entry["seed"], {"n1": GOLD["n1"], "n2": None, "n3": GOLD["n3"],
                                                                       "n4": GOLD["n4"]}, m1)
    write_arm(tmp_path, where["vanilla"][1], entry["seed"], {n: list(g) for n, g in GOLD.items()},
              {kind: {**cell, "pooled": 0.773} for kind, cell in m1.items()})
    evw4 = variant_run_dir(params["variants"]["dir"], "evw4", entry)
    write_json(evw4 / "config.json", {"arm": {"arm": "vanilla", "event_weight": 4.0}})
    write_jsonl(evw4 / "metrics.jsonl", [{"step": 1, "event_extra": 0.27}, {"step": 2, "event_extra": 0.16}])
    mistill = run_dir(tmp_path, "student_qwen", "mistill", "bf16", entry["seed"])
    write_json(mistill / "config.json", {"arm": {"lambda_p1": 0.1, "lambda_p2": 0.5}})
    write_jsonl(mistill / "metrics.jsonl", [{"step": 1, "P1_attn": 1.0, "P2_attn": 0.3},
                                            {"step": 2, "P1_attn": 0.6, "P2_attn": 0.2}])
    values, v = _read_by_hand("R-D23", params)
    assert v["evw4_own_p2c_k40"] == pytest.approx(np.median(recovery["evw4"][("P2C", k)]))
    assert v["plain_vanilla_own_p2c_k40_k8"] == pytest.approx([np.median(recovery["vanilla"][("P2C", kk)])
                                                                for kk in (k, k8)])
    assert v["evw4_vs_mistill_s0_p2c"] == pytest.approx(-0.4 / 6)
    assert v["evw4_below_mistill_notes_k40_k8"] == [5, 6]
    assert v["evw4_minus_vanilla"] == pytest.approx(np.mean(recovery["evw4"][("P2C", k)]
                                                            - recovery["vanilla"][("P2C", k)]))
    assert (v["evw4_m1_p2c"], v["vanilla_m1_p2c"], v["evw4_cap_rate"]) == (0.772, 0.773, 0.25)
    assert v["extra_loss_start_evw4_vs_mistill"] == pytest.approx([0.27, 0.1 * 1.0 + 0.5 * 0.3])
    assert v["extra_loss_end_evw4_vs_mistill"] == pytest.approx([0.16, 0.1 * 0.6 + 0.5 * 0.2])


def test_r_d16_writes_the_paper_keys_on_three_paper_shaped_reads(tmp_path):
    """The arm's chain, its gate and its second read, each with paper-sized bins and a 36 x 32 head ranking."""
    params = copy.deepcopy(PAPER_PARAMS)
    params["paths"] = {"artifacts": str(tmp_path / "artifacts"), "results": str(tmp_path / "results")}
    params["stats"]["bootstrap_resamples"] = 200
    section, reread = params["evaluate"]["own_heads"], params["reread"]
    reread.update(gate_dir=str(tmp_path / "gate"), second_read_dir=str(tmp_path / "second"))
    bins, notes, rng = section["bins"], [f"n{i}" for i in range(6)], np.random.default_rng(5)
    scores = rng.normal(size=36 * 32)
    for root in (tmp_path / "artifacts", tmp_path / "gate", tmp_path / "second"):
        hd, m6 = arm_dirs(root, reread["arm"], reread["seed"])
        for note in notes:
            write_jsonl(m6 / note / "patch2.jsonl", [
                {"kind": kind, "pos": 1 + i, "margin_clean": 2.0 + rng.normal(0, 1e-3), "margin_corr": 0.0,
                 "margin_all": 2.0, "knockin": {"top": {str(k): 2.0 * rng.uniform() for k in bins}}}
                for i, kind in enumerate(PHASES)])
        write_json(m6 / "faithfulness2.json", {"notes": notes, "bins": bins, "phases": {}})
        write_json(hd / "head_sets_contrast.json", {"n_layers": 36, "n_heads": 32, "phases": {
            p: [{"layer": h // 32, "head": h % 32, "ic": float(scores[h])} for h in range(36 * 32)] for p in PHASES}})
    module = reader("R-D16")
    values, _ = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    assert set(REGISTRY.expected("paper").values["R-D16"]) <= set(values)
    assert values["crosshw_same_top_k_phases"]["value"] == 3


def test_every_demo_reader_lists_its_keys():
    for rid in DEMO_IDS:
        keys = reader(rid).keys(PAPER_PARAMS)
        assert len(keys) == len(set(keys)), f"{rid}: a key listed twice"
        assert Path(REPO / REGISTRY.results[rid].reader).is_file()


def _setup_artifacts(root: Path, params: dict, *, k: int = 15) -> None:
    """RT-003's recall report and the two shortlist trace sets' summaries, small enough to check by hand."""
    sweep = [{"k": kk, **{split: {"recall": base + kk / 1000, "completed_recall": base + kk / 500,
                                  "median_length": float(kk + 20)}
                          for split, base in (("validation", 0.5), ("test", 0.6), ("corpus", 0.7))}}
             for kk in (10, 15, 20)]
    write_json(root / "data" / "shortlists_recall.json",
               {"k": k, "sibling_top": 10, "completed_recall": {"validation": 0.53, "test": 0.63, "corpus": 0.73},
                "shortlist_length": {"median": 40.0}, "sweep": sweep})
    write_json(Path(params["evaluate"]["own_heads"]["validation_traces"]).with_name("summary.json"),
               {"overall": {"notes": 5, "teacher": {"micro_f1": 0.41}}})
    per_note = {f"n{i}": {"split": "train" if i < 4 else "test", "valid": i != 2, "n_new_tokens": tokens}
                for i, tokens in enumerate((100, 300, 200, 900, 400, 50))}
    write_json(Path(params["evaluate"]["teacher_traces"]).with_name("summary.json"),
               {"test": {"notes": 2, "teacher": {"micro_f1": 0.37}}, "per_note": per_note})


def test_r_d0_setup_facts_by_hand(tmp_path):
    params = copy.deepcopy(PAPER_PARAMS)
    params["paths"]["artifacts"] = str(tmp_path)
    params["evaluate"]["own_heads"]["validation_traces"] = str(tmp_path / "TR-007" / "traces.jsonl")
    params["evaluate"]["teacher_traces"] = str(tmp_path / "TR-008" / "traces.jsonl")
    _setup_artifacts(tmp_path, params)
    module = reader("R-D0")
    values, inputs = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    got = {k: v["value"] for k, v in values.items()}
    assert got["retriever_recall_validation"] == 0.53 and got["retriever_recall_corpus"] == 0.73
    assert got["recall_without_completion_corpus_vs_val"] == [0.7 + 15 / 1000, 0.5 + 15 / 1000]  # the K=15 row
    assert got["shortlist_size_k"] == 15 and got["k_sweep_k"] == [10, 15, 20]
    assert got["k_sweep_completed_recall_test"] == [0.6 + kk / 500 for kk in (10, 15, 20)]
    assert got["teacher_microf1_validation"] == 0.41 and got["teacher_microf1_test"] == 0.37
    assert got["valid_training_traces"] == 3                       # notes n0-n3 train, n2 invalid
    assert got["teacher_shortlist_trace_tokens"] == 250.0          # median of 50, 100, 200, 300, 400, 900
    assert "count of 4 training notes" in values["valid_training_traces"]["statistic"]
    assert len(inputs) == 3

    _setup_artifacts(tmp_path, params, k=12)   # a chosen K the sweep never scored
    with pytest.raises(UserError, match="no row for the chosen K=12"):
        module.compute_values(params)


def test_r_d21_retriever_as_the_answer_by_hand(tmp_path):
    """Two test notes, rankings of 20 codes: counts worked out by hand, and one re-run shortlist that differs."""
    params = copy.deepcopy(PAPER_PARAMS)
    params["paths"]["artifacts"] = str(tmp_path)
    params["evaluate"]["test_notes"] = str(tmp_path / "data" / "dt_test.jsonl")
    gold = {"a": ["C01", "C15", "C30"], "b": ["C02"]}
    write_jsonl(tmp_path / "data" / "dt_test.jsonl", [{"note_id": n, "patient_id": f"p{n}", "text": "x",
                                                        "gold_codes": g, "split": "test"} for n, g in gold.items()])
    ranked = {"a": [f"C{i:02d}" for i in range(1, 21)],    # C01 and C15 in the top 20, C01 alone in the top 10
              "b": [f"C{i:02d}" for i in range(3, 23)]}    # C02 never ranked
    stored = [{"note_id": n, "codes": sorted(ranked[n][:12] + ["C30"]), "k": 12, "ranked": ranked[n]} for n in gold]
    rerun = [dict(stored[0]), {**stored[1], "codes": stored[1]["codes"][:-1]}]   # note b loses one of its 13 codes
    write_jsonl(tmp_path / "data" / "shortlists.jsonl", stored)
    write_jsonl(tmp_path / "data" / "shortlists_rerun.jsonl", rerun)
    module = reader("R-D21")
    values, _ = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    got = {k: v["value"] for k, v in values.items()}
    # top-20: tp 2 (C01, C15), fp 38, fn 2 (C30, C02)
    assert got["retriever_top20_precision"] == 2 / 40 and got["retriever_top20_recall"] == 2 / 4
    assert got["retriever_top20_microf1"] == 4 / (4 + 38 + 2)
    assert got["retriever_top10_microf1"] == 2 / (2 + 19 + 3)                   # tp 1, fp 19, fn 3
    assert got["retriever_shortlist_recall"] == 2 / 4                          # C01, C30 of note a
    assert got["rerun_shortlist_exact_match_notes"] == 1
    assert got["rerun_shortlist_median_jaccard"] == (1 + 12 / 13) / 2


def test_r_d18_corpus_and_note_clustered_against_independent_computations(paper_evaluations):
    """Three seed pairs per family on paper-shaped evaluations and own-heads cells: the corpus-level difference
    is the mean over seed pairs of sklearn's micro-F1 differences; the note-clustered gain is R-D6's reading."""
    from sklearn.metrics import f1_score
    from sklearn.preprocessing import MultiLabelBinarizer

    from mistill.evaluate.readout import load_arms, test_notes

    params = copy.deepcopy(paper_evaluations)
    section = params["evaluate"]["own_heads"]
    root = Path(params["paths"]["artifacts"])     # the own-heads cells sit beside the evaluations
    k, rng, notes = max(section["bins"]), np.random.default_rng(5), list(GOLD)
    for row, label in section["arms"].items():
        for seed in ([0] if row.endswith("untrained") else [0, 1, 2]):
            m6 = arm_dirs(root, label, seed)[1]
            for note in notes:
                write_jsonl(m6 / note / "patch2.jsonl", _m6_rows(rng, k))
            write_json(m6 / "faithfulness2.json", {"notes": notes, "bins": section["bins"], "phases": {}})
    module = reader("R-D18")
    values, _ = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    assert set(REGISTRY.expected("paper").values["R-D18"]) <= set(values)

    arms, test = load_arms(params), test_notes(params)
    binarizer = MultiLabelBinarizer().fit([list(n.gold_codes) for n in test] + [["X"]] + [
        list(r.get("answer") or []) for seeds in arms.values() for run in seeds.values() for r in run.generations.values()])
    gold = binarizer.transform([list(n.gold_codes) for n in test])

    def f1(run):
        pred = [run.generations[n.note_id]["answer"] if run.generations[n.note_id]["valid"] else [] for n in test]
        return f1_score(gold, binarizer.transform(pred), average="micro", zero_division=0)

    for family, tag in (("qwen", "bf16"), ("smollm", "fp32")):
        arm, ref = arms[f"{family}_mistill"], arms[f"{family}_vanilla_{tag}"]
        expected = np.mean([f1(arm[s]) - f1(ref[s]) for s in (0, 1, 2)])
        assert values[module.corpus_key(family, tag)]["value"] == pytest.approx(expected, abs=1e-12)
        low, high = values[f"{module.corpus_key(family, tag)}_interval"]["value"]
        assert low <= high
    gaps = [max(abs(values[f"{module.corpus_key(f, t)}_interval"]["value"][i]
                    - values[f"{module.per_note_key(f, t)}_interval"]["value"][i]) for i in (0, 1))
            for f in ("qwen", "smollm") for t in ("bf16", "fp32")]
    assert values["corpus_vs_per_note_interval_endpoint_gap_max"]["value"] == pytest.approx(max(gaps))

    r_d6, _ = reader("R-D6").compute_values(params)
    for family in ("qwen", "smollm"):
        assert (values[f"{family}_note_clustered_p2c_gain_vs_bf16"]["value"]
                == r_d6[f"{family}_mistill_minus_bf16_vanilla_p2c"]["value"])


def test_r_d20_writes_the_paper_keys_on_paper_shaped_proxy_artifacts(tmp_path):
    """1,600 heads, the paper's named heads among each event's patched nominees; the named heads' c and exact
    importance are their means over the events where they were patched."""
    params = copy.deepcopy(PAPER_PARAMS)
    hd = tmp_path / "HD-001"
    params["instrument"]["out_dir"] = str(hd)
    write_json(hd / "head_sets_contrast.json", {"n_layers": 40, "n_heads": 40})
    named = [39 * 40 + 12, 39 * 40 + 10, 30 * 40 + 11]
    rng = np.random.default_rng(4)
    for note in ("n1", "n2"):
        heads = [named + sorted(rng.choice(1200, 53, replace=False).tolist()) for _ in range(3)]
        write_jsonl(hd / note / "patch2.jsonl", [
            {"kind": "P2C", "pos": 100 + e, "p2c_exact": {"heads": h, "exact": rng.normal(size=56).tolist(),
                                                           "first_order": rng.normal(size=56).tolist()}}
            for e, h in enumerate(heads)])
        write_npz(tmp_path / "HD-001-proxy" / note / "proxy.npz", kinds=np.asarray(["P2C"] * 3),
                  positions=np.arange(100, 103),
                  occurrence=np.zeros(3, dtype=np.int64), c=rng.normal(size=(3, 40, 40)).astype(np.float32),
                  m=rng.uniform(size=(3, 40, 40)).astype(np.float32), margin=np.full(3, 5.0, dtype=np.float32),
                  target_logit=np.full(3, 20.0, dtype=np.float32))
    module = reader("R-D20")
    values, _ = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    assert set(REGISTRY.expected("paper").values["R-D20"]) <= set(values)
    assert values["contrastive_events_with_exact_patches"]["value"] == 6
    c = [float(np.mean([np.load(tmp_path / "HD-001-proxy" / n / "proxy.npz")["c"][e].reshape(-1)[h]
                        for n in ("n1", "n2") for e in range(3)])) for h in named]
    assert values["c_vs_exact_l39h12_l39h10_l30h11"]["value"] == pytest.approx(c, rel=1e-6)



def _write_read_side(directory: Path, sets_body: dict, notes: list[str], params: dict, seed: int) -> None:
    """A read-side pass's output (read_panel.json, <note>/read.jsonl) over the App. E panel of `sets_body`."""
    from mistill.instrument.read_passes import named_head_ids, teacher_panel
    from mistill.instrument.readside import CATEGORIES

    rng = np.random.default_rng(seed)
    L, H = sets_body["n_layers"], sets_body["n_heads"]
    named = named_head_ids(params, L, H)
    panel = teacher_panel(sets_body, params["read_side"]["panel_k"], 0, [h for hs in named.values() for h in hs])
    heads = panel.heads()
    for note in notes:
        rows = []
        for e, kind in enumerate(k for k in PHASES for _ in range(3)):
            shares = rng.dirichlet(np.ones(len(CATEGORIES)), size=len(heads))
            rows.append({"kind": kind, "pos": 10 + 7 * e, "code": "N18.3", "heads": heads,
                         "shares": shares.tolist(), "lift": rng.uniform(0.5, 10, len(heads)).tolist(),
                         "n_eff": rng.uniform(5, 50, len(heads)).tolist(),
                         "qk_s_minus_n": rng.normal(0, 0.01, len(heads)).tolist(),
                         "importance": rng.normal(0, 0.2, len(heads)).tolist(), "has_S": True, "has_N": True})
        write_jsonl(directory / note / "read.jsonl", rows)
    write_json(directory / "read_panel.json", {"panel": panel.as_dict(), "panel_size": panel.size(),
                                               "named": named, "n_layers": L, "n_heads": H, "notes": notes})


def test_r_c13_writes_its_keys_on_paper_shaped_artifacts(paper_hd001, tmp_path):
    """Five notes of four patients (n0 and n1 are one patient's two prompt variants)."""
    from mistill.io import write_npz

    params = copy.deepcopy(paper_hd001[0])
    params["paths"]["artifacts"] = str(tmp_path)
    out = Path(params["instrument"]["out_dir"])
    notes, patients = [f"n{i}" for i in range(5)], ["p0", "p0", "p1", "p2", "p3"]
    write_jsonl(tmp_path / "data" / "corpus_char.jsonl", [{"note_id": n, "patient_id": p, "text": "x",
                                                           "gold_codes": [], "split": "char"}
                                                          for n, p in zip(notes, patients)])
    rng = np.random.default_rng(6)
    leaders = np.concatenate([np.arange(40, 0, -1), np.zeros(1560)])   # forty heads a full unit apart
    ic = {f"ic_{p}": rng.normal(0, 0.05, (5, 1600)) + leaders for p in PHASES}
    for run in (out, Path(params["distill"]["teacher_head_sets"]).parent):
        write_npz(run / "calibration.npz", **ic, **{f"notes_{p}": np.asarray(notes) for p in PHASES})
    params["read_side"]["out_dir"] = str(tmp_path / "HD-001-read")
    _write_read_side(tmp_path / "HD-001-read" / "readside", paper_hd001[1], notes, params, seed=7)
    _write_suffix_reruns(tmp_path, params)
    module = reader("R-C13")
    values, _ = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    paper = set(REGISTRY.expected("paper").values["R-C13"])
    assert not sorted(paper - set(values) - set(REGISTRY.results["R-C13"].unproduced_keys))
    assert values["patient_units_notes_patients"]["value"] == [5, 4]
    # a ranking this clear keeps its top-8 and top-40 in every split
    assert values["split_half_top8_overlap"]["value"] == 8.0
    assert values["split_half_top40_overlap"]["value"] == [40.0, 40.0]
    # the suffix re-runs (see _write_suffix_reruns): window distances main 4, 10, 7, 1; D 4, 7, 9; A 20, 10, 7, 3, 1
    v = {k: x["value"] for k, x in values.items()}
    assert v["median_locus_distance_b_d_a"] == [5.5, 7.0, 7.0] and v["median_locus_distance_all_suffixes"] == 7.0
    assert v["category_agreement_suffix_d"] == pytest.approx(90.0)
    assert v["category_agreement_suffix_a"] == pytest.approx(90.0)
    assert v["window_share_suffix_d_a_b"] == pytest.approx([30.0, 50.0, 40.0])
    # in the window under both: D (4, 4), (7, 7), (1, 9); A (4, 20), (10, 10), (7, 7), (1, 1): 6 of 7 within 8 tokens
    assert v["same_step_agreement"] == pytest.approx(600 / 7)
    assert v["same_step_median_distance_difference"] == 0.0
    assert v["suffix_rerun_notes_mentions"] == [3, 10]


def _write_suffix_reruns(root: Path, params: dict) -> None:
    """The main wording's locus (test_r_c6's NOTES) and wordings D and A with a few mentions moved."""
    from mistill.locus.passes import LocusSettings
    from tests.locus.test_r_c6 import NOTES, paper_scores, write_locus_run

    params["locus"]["out_dir"] = str(root / "HD-001-locus")
    prose, emission, suffix = paper_scores()
    write_locus_run(root / "HD-001-locus", NOTES, prose, suffix, emission, LocusSettings.from_params(params))
    moved = {"D": {("n0", 1): ("never", None), ("n2", 2): ("window", 9)},
             "A": {("n1", 1): ("window", 3), ("n0", 0): ("window", 20)}}
    for name, changes in moved.items():
        for note, mentions in NOTES.items():
            rows = [{**m, **dict(zip(("outcome", "distance"), changes.get((note, m["event"]), (m["outcome"],
                                                                                           m["distance"]))))}
                    for m in mentions]
            write_json(root / "HD-001-locus-suffix" / name / note / "locus.json",
                       {"note_id": note, "mentions": rows, "skipped_mentions": 0, "probes": 5, "n_layers": 40,
                        "n_heads": 40})


def test_r_d9_costs_from_run_logs_by_hand(tmp_path):
    """Two students, three arms, seeds 0-2 (the paper profile's runs), each step logging 8 notes, a time and a peak."""
    from mistill.distill.runs import run_dir

    params = copy.deepcopy(PAPER_PARAMS)
    params["distill"]["runs_dir"] = str(tmp_path)
    cfg = params["distill"]
    gib = 2 ** 30
    for s_i, student in enumerate(cfg["students"]):
        for seed in cfg["seeds"]:
            for a_i, (arm, precision) in enumerate([("mistill", "bf16"), *(("vanilla", p) for p in
                                                                             cfg["vanilla_precisions"])]):
                d = run_dir(tmp_path, f"student_{student}", arm, precision, seed)
                write_json(d / "config.json", {"example_ids": [f"n{i}" for i in range(20)]})
                # mistill 30 s per step, vanilla 10 s; peaks 10 + student + arm GiB, fp32 one more
                step_s = 30.0 if arm == "mistill" else 10.0
                peak = (10 + s_i + a_i) * gib
                write_jsonl(d / "metrics.jsonl", [{"notes": n, "step_time_s": step_s, "peak_memory_bytes": peak}
                                                  for n in (8, 8, 4)])
    # R-D17's fp32 Mistill variants: peaks 20, 21, 22 GiB
    from mistill.distill.runs import FP32_MISTILL_VARIANTS, variant_run_dir

    params["variants"]["dir"] = str(tmp_path / "variants")
    for i, name in enumerate(FP32_MISTILL_VARIANTS):
        d = variant_run_dir(params["variants"]["dir"], name, params["variants"]["arms"][name])
        write_json(d / "config.json", {"example_ids": [f"n{i}" for i in range(20)]})
        write_jsonl(d / "metrics.jsonl", [{"notes": 8, "step_time_s": 60.0, "peak_memory_bytes": (20 + i) * gib}])
    module = reader("R-D9")
    values, _ = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    got = {k: v["value"] for k, v in values.items()}
    assert got["qwen_mistill_step_peak_memory"] == 10.0                    # Qwen is the first student
    assert got["qwen_mistill_time_per_note"] == 90.0 / 20                  # three steps of 30 s over 20 notes
    assert got["mistill_100_notes_train_time"] == [90.0 * 5 / 60] * 2      # 100 notes are five runs of 20
    assert got["vanilla_100_notes_train_time"] == [30.0 * 5 / 60] * 2
    assert got["mistill_step_time"] == [0.5, 0.5] and got["mistill_over_vanilla_time_per_note"] == 3.0
    assert got["tier1_logged_peak_memory"] == 12.0                         # smollm's fp32 Vanilla: 10 + 1 + 1
    assert got["fp32_mistill_memory"] == 22.0                              # the largest fp32 Mistill peak
    assert got["vanilla_fp32_493_train_time"] == 30.0 / 3600
    assert got["paper_shape_qwen_mistill_step_peak_memory"] > got["paper_shape_qwen_vanilla_step_peak_memory"]


def test_r_d19_coverage_and_the_aligned_subset(tmp_path):
    """Paper-shaped cells where the SmolLM3 student drops one of note n0's three contrastive events: the aligned
    subset has 3 x 4 - 1 events, SmolLM3's reading is R-D6's, and Qwen's loses exactly that event."""
    params = copy.deepcopy(PAPER_PARAMS)
    params["paths"] = {"artifacts": str(tmp_path), "results": str(tmp_path / "results")}
    params["stats"]["bootstrap_resamples"] = 200
    section = params["evaluate"]["own_heads"]
    section["teacher_faithfulness"] = str(tmp_path / "HD-002" / "faithfulness2.json")
    write_json(tmp_path / "HD-002" / "faithfulness2.json", {"phases": {"P2C": {"range_gate_pass_rate": 0.71}}})
    report = {"P1": {"teacher": 10, "realized": 10, "share": 1.0}, "P2": {"teacher": 30, "realized": 16, "share": 16 / 30},
              "P2C": {"teacher": 11, "realized": 8, "share": 8 / 11}, "per_note_median_share": 0.74, "notes": 4}
    write_json(tmp_path / "DT-coverage" / "coverage.json", {"coverage": {
        "student_qwen": {**report, "P2": {"teacher": 30, "realized": 30, "share": 1.0}}, "student_smol": report}})
    k, rng, notes = max(section["bins"]), np.random.default_rng(8), [f"n{i}" for i in range(4)]
    for row, label in section["arms"].items():
        smol = row.startswith("smollm")
        for seed in ([0] if row.endswith("untrained") else [0, 1, 2]):
            m6 = arm_dirs(tmp_path, label, seed)[1]
            for note in notes:
                anchors = [10, 20, 30] if not (smol and note == "n0") else [10, 30]
                write_jsonl(m6 / note / "events.jsonl", [{"kind": "P2C", "pos": a, "anchor": a, "near_miss": "X"}
                                                         for a in anchors])
                write_jsonl(m6 / note / "patch2.jsonl", [
                    {"kind": "P2C", "pos": a, "margin_clean": 2.0, "margin_corr": 0.0, "margin_all": 2.0,
                     "knockin": {"top": {str(k): 2.0 * rng.uniform()}}} for a in anchors])
            write_json(m6 / "faithfulness2.json", {"notes": notes, "bins": section["bins"],
                                                   "phases": {"P2C": {"range_gate_pass_rate": 0.6}}})
    module = reader("R-D19")
    values, _ = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    assert set(REGISTRY.expected("paper").values["R-D19"]) <= set(values)
    got = {key: v["value"] for key, v in values.items()}
    assert got["aligned_p2c_events"] == 11 and got["smollm_event_coverage_p2"] == pytest.approx(100 * 16 / 30)
    assert got["smollm_realized_events"] == 34 and got["knockin_denominator_students_p2c"] == [0.6, 0.6]
    stats = StatsParams.from_params(params)
    full = [arm_values(tmp_path, section["arms"][r], "m4", phase="P2C", k=k) for r in ("smollm_mistill",
                                                                                       "smollm_vanilla_bf16")]
    assert got["smollm_aligned_subset_gain_vs_bf16"] == pytest.approx(clustered(*full, stats)["mean_difference"])

    def without_n0_20(label):
        out = {}
        for seed, d in seed_dirs(tmp_path, label).items():
            rows = knockin_rows(d)
            rows["n0"] = [r for r in rows["n0"] if r["pos"] != 20]
            out[seed] = note_recovery(rows, phase="P2C", set_kind="top", k=k)
        return out

    qwen = [without_n0_20(section["arms"][r]) for r in ("qwen_mistill", "qwen_vanilla_bf16")]
    assert got["qwen_aligned_subset_gain_vs_bf16"] == pytest.approx(clustered(*qwen, stats)["mean_difference"])


def test_r_c7_shortlist_against_full_inventory_on_paper_shaped_artifacts(paper_hd001, tmp_path):
    """HD-002 with the same rankings as HD-001 but its leader demoted: Spearman and overlaps by hand."""
    import shutil

    params = copy.deepcopy(paper_hd001[0])
    full = Path(params["instrument"]["out_dir"])
    short = tmp_path / "HD-002"
    params["distill"]["teacher_head_sets"] = str(short / "head_sets_contrast.json")
    body = copy.deepcopy(paper_hd001[1])
    for ranked in body["phases"].values():   # the leader falls to the bottom of every shortlist ranking
        ranked[0]["ic"] = min(r["ic"] for r in ranked) - 1.0
    write_json(short / "head_sets_contrast.json", body)
    shutil.copy(full / "faithfulness2.json", short / "faithfulness2.json")
    params["read_side"].update(out_dir=str(tmp_path / "HD-001-read"), shortlist_out_dir=str(tmp_path / "HD-002-read"))
    _write_read_side(tmp_path / "HD-001-read" / "readside", paper_hd001[1], ["n0", "n1"], params, seed=8)
    _write_read_side(tmp_path / "HD-002-read", body, ["n0", "n1"], params, seed=9)
    # the prose locus on both runs: the shortlist's prose-time ranking reversed in its top 40, its necessities 1 higher
    from mistill.locus.passes import LocusSettings
    from tests.locus.test_r_c6 import NOTES, paper_scores, write_locus_run

    params["locus"].update(out_dir=str(tmp_path / "HD-001-locus"), shortlist_out_dir=str(tmp_path / "HD-002-locus"))
    prose, emission, suffix = paper_scores()
    short_prose = prose.copy()
    top = np.argsort(-prose, kind="stable")[:40]
    short_prose[top] = prose[top[::-1]]
    settings = LocusSettings.from_params(params)
    write_locus_run(tmp_path / "HD-001-locus", NOTES, prose, suffix, emission, settings)
    write_locus_run(tmp_path / "HD-002-locus", {k: v[:2] for k, v in NOTES.items()}, short_prose, suffix, emission,
                    settings, offset=1.0)
    module = reader("R-C7")
    values, _ = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    assert not sorted(set(REGISTRY.expected("paper").values["R-C7"]) - set(values)
                      - set(REGISTRY.results["R-C7"].unproduced_keys))
    a = phase_scores(paper_hd001[1], "P1")
    b = phase_scores(body, "P1")
    assert values["ic_spearman_full_vs_shortlist_p1"]["value"] == pytest.approx(spearmanr(a, b).statistic)
    assert values["top40_overlap_p1"]["value"] == 39 and values["top8_overlap_p1_p2_p2c"]["value"] == [7, 7, 7]
    assert values["prosetime_ranking_spearman"]["value"] == pytest.approx(spearmanr(prose, short_prose).statistic)
    assert values["prosetime_top40_overlap"]["value"] == 40
    # the shortlist run keeps each note's first two mentions: window 4 + 10 | window 7 + code | inherited + never
    assert values["hd002_window_inherited_never_shares"]["value"] == pytest.approx([3 / 6, 1 / 6, 1 / 6])
    assert values["hd002_median_locus_distance"]["value"] == pytest.approx(7.0)
    # per note means over decided mentions (offset 1): n0 1.05, n1 2.05, n2 none (inherited, never); prose-time +0.5
    assert values["hd002_emission_top16_window_only"]["value"] == pytest.approx(1.55)
    assert values["hd002_prosetime_top8_window_only"]["value"] == pytest.approx(2.05)


def _recovery_by_hand(rows_by_note: dict[str, list[dict]], phase: str, k: int, kind: str) -> dict[str, float]:
    """Per note the mean knock-in recovery (m_set - m_corr) / (m_all - m_corr) of one set kind at one phase."""
    return {note: float(np.mean([(r["knockin"][kind][str(k)] - r["margin_corr"]) / (r["margin_all"] - r["margin_corr"])
                                 for r in rows if r["kind"] == phase]))
            for note, rows in rows_by_note.items()}


def test_r_c14_instruction_control_by_hand(paper_hd001, tmp_path):
    """Three drawn notes of HD-001's five: the re-ranked sets with HD-001's leader demoted, HD-001's sets knocked in
    beating random on 3 of 3 (P1) and 2 of 3 (P2C) notes, the prose locus on the notes' first two mentions."""
    import shutil

    from mistill.io import read_jsonl
    from mistill.locus.passes import LocusSettings
    from tests.locus.test_r_c6 import NOTES, paper_scores, write_locus_run

    params = copy.deepcopy(paper_hd001[0])
    hd001 = Path(params["instrument"]["out_dir"])
    params["paths"] = {**params["paths"], "artifacts": str(tmp_path / "artifacts")}
    control = params["instruction_control"]
    control.update(out_dir=str(tmp_path / "HD-A"), orig_sets_dir=str(tmp_path / "KI-A-orig"),
                   locus_out_dir=str(tmp_path / "HD-A-locus"))
    write_jsonl(tmp_path / "artifacts" / "TR-A" / "traces.jsonl",
                [{"note_id": n, "valid": v, "n_new_tokens": t} for n, v, t in (("n0", True, 100), ("n1", True, 300),
                                                                              ("n2", False, 1024))])
    write_jsonl(tmp_path / "artifacts" / "TR-006" / "traces.jsonl",
                [{"note_id": f"n{i}", "valid": True, "n_new_tokens": 50 + 10 * i} for i in range(5)])
    body = copy.deepcopy(paper_hd001[1])
    for ranked in body["phases"].values():   # the leader falls to the bottom of every re-ranked ranking
        ranked[0]["ic"] = min(r["ic"] for r in ranked) - 1.0
    write_json(tmp_path / "HD-A" / "head_sets_contrast.json", body)
    shutil.copy(hd001 / "faithfulness2.json", tmp_path / "HD-A" / "faithfulness2.json")
    orig = json.loads((hd001 / "faithfulness2.json").read_text())
    for phase, above in (("P1", 3), ("P2C", 2)):
        orig["phases"][phase]["bins"]["8"]["knockin"]["vs"]["random"].update(notes_top_above=above, notes=3)
    write_json(tmp_path / "KI-A-orig" / "faithfulness2.json", orig)
    # the locus: HD-001's on every mention; the control's prose-time ranking with ranks 5-8 and 9-12 swapped
    prose, emission, suffix = paper_scores()
    new_prose = prose.copy()
    order = np.argsort(-prose, kind="stable")
    new_prose[order[4:8]], new_prose[order[8:12]] = prose[order[8:12]], prose[order[4:8]]
    params["locus"]["out_dir"] = str(tmp_path / "HD-001-locus")
    settings = LocusSettings.from_params(params)
    write_locus_run(tmp_path / "HD-001-locus", NOTES, prose, suffix, emission, settings)
    write_locus_run(tmp_path / "HD-A-locus", {k: v[:2] for k, v in NOTES.items()}, new_prose, suffix, emission, settings)

    module = reader("R-C14")
    values, _ = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    assert not sorted(set(REGISTRY.expected("paper").values["R-C14"]) - set(values))
    v = {k: x["value"] for k, x in values.items()}
    assert (v["notes_orig_sets_beat_random_chapter"], v["notes_orig_sets_beat_random_contrastive"]) == (3, 2)
    assert v["orig_sets_beat_random_notes_of"] == [3, 3]
    assert v["reranked_top40_overlap_chapter"] == 39 and v["reranked_top40_overlap_contrastive"] == 39
    # NOTES: window 2 + 1 + 1 of 10 mentions, inherited 1 + 0 + 1; the first two of each: window 2 + 1 + 0 of 6
    assert v["window_locus_share_with_instruction_same_notes"] == pytest.approx(40.0)
    assert v["window_locus_share_no_instruction"] == pytest.approx(50.0)
    assert v["inherited_share_no_instruction_with"] == pytest.approx([100 / 6, 20.0])
    assert v["prosetime_top8_heads_from_hd001"] == 4
    new_top = set(np.argsort(-new_prose, kind="stable")[:8].tolist())
    emission_top = set(np.argsort(-phase_scores(body, "P1"), kind="stable")[:8].tolist())
    assert v["prosetime_top8_emission_top8_overlap"] == len(new_top & emission_top)
    assert v["valid_traces"] == 2 and v["median_generated_tokens"] == [300.0, 60.0]
    assert v["criteria_thresholds"] == [90.0, 20, 2]
    assert v["criteria_met"] == [0, 1, int(len(new_top & emission_top) <= 2)]   # 2 of 3 contrastive notes < 90%
    # HD-001's own cells on the same notes (n0, n1, n2), recomputed by hand from its patch rows
    rows = {n: read_jsonl(hd001 / n / "patch2.jsonl") for n in ("n0", "n1", "n2")}
    for i, phase in enumerate(("P1", "P2C")):
        top = _recovery_by_hand(rows, phase, 40, "top")
        assert v["knockin_hd001_same_notes_p1_p2c"][i] == pytest.approx(float(np.median(list(top.values()))))
        top8, rand8 = _recovery_by_hand(rows, phase, 8, "top"), _recovery_by_hand(rows, phase, 8, "random")
        assert v["hd001_same_notes_beat_random_p1_p2c"][i] == sum(top8[n] > rand8[n] for n in rows)
        assert v["knockin_random_p1_p2c"][i] == orig["phases"][phase]["bins"]["40"]["knockin"]["random"]["median"]
    # a size that is not a knock-in bin is a one-line error
    control["k"] = 7
    with pytest.raises(UserError, match="k=7"):
        module.compute_values(params)


def test_r_c8_intact_against_detached_on_paper_shaped_artifacts(paper_hd001, tmp_path):
    """Two hooks' calibration arrays and the re-run's attribution: every value against scipy and by hand."""
    from mistill.io import write_npz

    params = copy.deepcopy(paper_hd001[0])
    intact, detached = tmp_path / "HD-001-intact", tmp_path / "HD-001"
    params["instrument"]["out_dir"] = str(detached)
    params["intact_rerun"] = {**params["intact_rerun"], "out_dir": str(intact)}   # 50 notes named; 3 computed
    notes = [f"n{i}" for i in range(5)]
    rng = np.random.default_rng(8)
    base = np.concatenate([np.arange(60, 0, -1), np.zeros(1540)])   # sixty heads a full unit apart
    detached_ic = {p: rng.normal(0, 0.05, (5, 1600)) + base for p in PHASES}
    intact_ic = {p: v[:3].copy() for p, v in detached_ic.items()}
    intact_ic["P2"][:, [0, 45]] = intact_ic["P2"][:, [45, 0]]          # the intact hook swaps the P2 leader and #46
    write_json(detached / "head_sets_contrast.json", paper_hd001[1])
    write_npz(detached / "calibration.npz", **{f"ic_{p}": v for p, v in detached_ic.items()},
              **{f"notes_{p}": np.asarray(notes) for p in PHASES})
    write_npz(intact / "calibration.npz", **{f"ic_{p}": v for p, v in intact_ic.items()},
              **{f"notes_{p}": np.asarray(notes[:3]) for p in PHASES})
    first, merged = [], []
    for note in notes[:3]:
        kinds = np.asarray(["P1", "P2", "P2", "NULL"])
        fo = rng.normal(0, 1, (4, 40, 40)).astype(np.float32)
        exact = np.full((4, 40, 40), np.nan, dtype=np.float32)
        exact[1:3, 39, :5] = rng.normal(0, 1, (2, 5))                 # P2 nominees patched exactly
        write_npz(intact / note / "attr.npz", kinds=kinds, positions=np.arange(4), margin=np.ones(4),
                  first_order=fo, exact=exact, importance=fo)
        first.append(fo[1:3].reshape(2, -1).mean(0))
        merged.append(np.where(np.isnan(exact[1:3]), fo[1:3], exact[1:3]).reshape(2, -1).mean(0))
    module = reader("R-C8")
    values, inputs = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    assert set(REGISTRY.expected("paper").values["R-C8"]) == set(values)
    a, b = intact_ic["P2"].mean(0), detached_ic["P2"][:3].mean(0)
    assert values["p2_spearman_intact_vs_detached"]["value"] == pytest.approx(spearmanr(a, b).statistic)
    assert values["p2_top40_overlap"]["value"] == 39 and values["p2_top8_overlap"]["value"] == 7
    assert values["chapter_contrastive_top40_overlap_50notes"]["value"] == [40, 40]
    f, m = np.mean(first, axis=0), np.mean(merged, axis=0)
    assert values["intact_firstorder_vs_exact_spearman"]["value"] == pytest.approx(spearmanr(f, m).statistic)
    # named heads l39h10, l39h29, l39h12, l37h6 are flat indices 1570, 1589, 1572, 1486: all in the zero tail
    ranks = values["named_head_ranks_intact_l39h10_l39h29_l39h12_l37h6"]["value"]
    order = np.argsort(-a, kind="stable").tolist()
    assert ranks == [order.index(h) + 1 for h in (1570, 1589, 1572, 1486)]
    assert len(inputs) == 2 + 3 + 1


def test_r_c5_writes_the_paper_keys_on_a_paper_shaped_read_side(paper_hd001, tmp_path):
    """The App. E panel of a 1,600-head teacher (68 heads at k = 16 in the paper; here its own count) and the
    paper's named heads: every key R-C5 lists is written, and the panel size is the ranked and random groups'."""
    params = copy.deepcopy(paper_hd001[0])
    params["read_side"]["out_dir"] = str(tmp_path / "HD-001-read")
    _write_read_side(tmp_path / "HD-001-read" / "readside", paper_hd001[1], ["n0", "n1", "n2"], params, seed=10)
    module = reader("R-C5")
    values, _ = module.compute_values(params)
    _assert_writes_what_it_lists(module, params, values)
    assert not sorted(set(REGISTRY.expected("paper").values["R-C5"]) - set(values))
    panel = json.loads((tmp_path / "HD-001-read" / "readside" / "read_panel.json").read_text())["panel"]
    ranked = {h for group in ("top", "bottom") for hs in panel[group].values() for h in hs} | set(panel["random"])
    assert values["read_panel_size"]["value"] == len(ranked) <= 16 * 6


def test_r_d10_lambda_selection_by_hand(tmp_path):
    """The selection grid's readout: its pick and cells as DT-select wrote them, answers, caps, M1 per note and the
    cells' training logs set by hand, read beside the validation references (EV-val)."""
    from mistill.evaluate.task import task_metrics
    from tests.chain.test_readers import TRAIN_GOLD, note_f1

    params = _variant_params(tmp_path)
    selection = params["selection"]
    selection["dir"], selection["notes"] = str(tmp_path / "select"), str(tmp_path / "val.jsonl")
    write_jsonl(tmp_path / "val.jsonl", [{"note_id": n, "patient_id": f"p{n}", "text": "x", "gold_codes": g,
                                          "split": "val"} for n, g in GOLD.items()])
    grid = params["distill"]["lambda_from"]
    root = tmp_path / "select"

    def evaluation(path: Path, preds: dict, m1_per_note: dict) -> None:
        notes = list(GOLD)
        write_jsonl(path / "generations.jsonl", [{"note_id": n, "valid": p is not None, "answer": p or [],
                                                  "hit_cap": p is None} for n, p in preds.items()])
        write_json(path / "task.json", {"metrics": task_metrics([preds[n] or [] for n in notes], [GOLD[n] for n in notes],
                                                                [preds[n] is not None for n in notes], TRAIN_GOLD)})
        write_json(path / "m1.json", {"m1": {kind: {"p_margin_positive": float(np.mean(list(shares.values()))),
                                                    "per_note_share": shares} for kind, shares in m1_per_note.items()}})

    good = {"n1": GOLD["n1"], "n2": GOLD["n2"], "n3": ["D00.0"], "n4": None}
    cells = {0.1: good, 0.3: {**good, "n3": None}, 1.0: {"n1": None, "n2": None, "n3": ["D00.0"], "n4": ["F00.0"]},
             3.0: {n: None for n in GOLD}}
    m1_pick = {kind: {"n1": 0.9, "n2": 0.8, "n3": 0.7, "n4": 0.6} for kind in PHASES}
    for lam, preds in cells.items():
        evaluation(root / grid / f"l{lam:g}", preds, m1_pick)
    for lam, (loss, cot) in {1.0: ([3.0, 2.0], [0.5, 0.25]), 0.3: ([1.0, 0.6], [0.5, 0.2])}.items():
        write_jsonl(root / grid / f"l{lam:g}" / "run" / "metrics.jsonl",
                    [{"step": i + 1, "loss": a, "cot": b} for i, (a, b) in enumerate(zip(loss, cot))])
    f1s = {lam: json.loads((root / grid / f"l{lam:g}" / "task.json").read_text())["metrics"]["micro_f1"] for lam in cells}
    write_json(root / "picks" / f"{grid}.json", {"cells": [{"lambda": lam, "micro_f1": f1s[lam], "m1_p2c": 0.75} for lam in cells],
                                       "tied": [0.1], "selected": {"lambda_p1": 0.1, "lambda_p2": 0.1},
                                       "outward_step": 0.1})
    vanilla = {"n1": ["A00.0"], "n2": None, "n3": ["D00.0", "E00.0"], "n4": None}
    m1_vanilla = {"P2C": {"n1": 0.5, "n2": 0.8, "n3": 0.6, "n4": 0.6}, "P1": {"n1": 1.0, "n2": 0.8, "n3": 0.7, "n4": 0.6},
                  "P2": {"n1": 0.9, "n2": 0.8, "n3": 0.7, "n4": 0.6}}
    labels = {ref["role"]: label for label, ref in selection["references"].items()}
    evaluation(root / "reference" / labels["vanilla"], vanilla, m1_vanilla)
    evaluation(root / "reference" / labels["untrained"], {"n1": None, "n2": ["C00.0"], "n3": None, "n4": None},
               m1_vanilla)
    # the pick at seeds 1 and 2 on the validation notes (references of role pick_seed)
    seed_preds = {1: {**good, "n2": None}, 2: {**good, "n4": ["F00.0"]}}
    for label, ref in selection["references"].items():
        if ref["role"] == "pick_seed":
            evaluation(root / "reference" / label, seed_preds[int(ref["seed"])], m1_pick)
    # App. I.2's write-term grids: the cells R-D10 reads, their diagnostics set by hand
    grids = selection["write_term"]

    def diagnostics(path: Path, write: tuple[float, float], corr: tuple[float, float]) -> None:
        side = lambda w, r: {"P1": {"terms": {"attn": 0.1, "inter": 0.2, "write": w}, "notes": 4, "events": 9,  # noqa: E731
                                    "c_correlation": r}}
        write_json(path / "diagnostics.json", {"before": side(write[0], corr[0]), "after": side(write[1], corr[1]),
                                               "write_drop_percent": {"P1": 100 * (1 - write[1] / write[0])}})

    m1_raw = {kind: {"n1": 0.5, "n2": 0.25, "n3": 0.25, "n4": 0.0} for kind in PHASES}
    evaluation(root / grids["raw"] / "l1", cells[1.0], m1_raw)
    diagnostics(root / grids["raw"] / "l1", (2.0, 0.14), (0.11, -0.06))
    evaluation(root / grids["standardised"] / "l1", cells[1.0], m1_pick)
    diagnostics(root / grids["standardised"] / "l1", (1.0, 0.5), (0.1, 0.38))
    # at 0.1: n1 half right, n2 right, n3 wrong, n4 never completed
    evaluation(root / grids["standardised"] / "l0.1", {"n1": GOLD["n1"][:1] + ["Z99.9"], "n2": GOLD["n2"],
                                                       "n3": ["D00.0"], "n4": None}, m1_pick)
    # App. K's NULL control in the arms' test evaluations (<artifacts>/DT-eval); one arm run without it
    for label, null in (("student-qwen-vanilla-bf16-s0", 0.02), ("student-qwen-mistill-bf16-s0", 0.011),
                        ("student-smol-untrained-s0", None)):
        m1 = {"P1": {"p_margin_positive": 0.9, "events": 4}}
        if null is not None:
            m1["NULL"] = {"p_margin_positive": null, "median_margin": -5.0, "events": 20}
        write_json(tmp_path / "DT-eval" / label / "m1.json", {"m1": m1})

    values, _ = reader("R-D10").compute_values(params)
    v = {key: x["value"] for key, x in values.items()}
    _assert_writes_what_it_lists(reader("R-D10"), params, values)
    assert v["m1_null_range_all_arms"] == [0.011, 0.02]
    produced = set(REGISTRY.expected("paper").values["R-D10"]) - set(REGISTRY.results["R-D10"].unproduced_keys)
    assert produced <= set(values)
    assert (v["selected_lambda"], v["tied_lambdas"], v["grid_lambdas"]) == (0.1, [0.1], [0.1, 0.3, 1.0, 3.0])
    pre = [f1s[x] for x in (0.3, 1.0, 3.0)]
    assert v["preregistered_grid_val_microf1"] == [min(pre), max(pre)] and pre[2] == 0.0
    assert v["cap_rate_lambda1"] == [50.0, 50.0] and v["grid_cap_percent"] == [25.0, 50.0, 50.0, 100.0]
    assert (v["cap_rate_vanilla_100"], v["cap_rate_untrained"]) == (50.0, 75.0)
    assert v["mech_to_task_loss_ratio_lambda1_lambda03"] == pytest.approx([(5 + 7) / 2, (1 + 2) / 2])
    diff = [note_f1(good[n] or [], GOLD[n]) - note_f1(vanilla[n] or [], GOLD[n]) for n in GOLD]
    assert v["selected_vs_vanilla_task"] == pytest.approx(np.mean(diff))
    assert v["selected_vs_vanilla_m1_p2c"] == pytest.approx(np.mean([0.4, 0.0, 0.1, 0.0]))
    assert v["selected_vs_vanilla_m1_p1"] == pytest.approx(np.mean([-0.1, 0, 0, 0]))
    low, high = v["selected_vs_vanilla_m1_p2c_interval"]
    assert low <= v["selected_vs_vanilla_m1_p2c"] <= high
    seed_f1 = [f1s[0.1]] + [json.loads((root / "reference" / label / "task.json").read_text())["metrics"]["micro_f1"]
                            for label, ref in sorted(selection["references"].items(), key=lambda x: x[1].get("seed", -1))
                            if ref["role"] == "pick_seed"]
    assert v["one_seed_val_microf1_seeds"] == pytest.approx(seed_f1) and len(set(seed_f1)) == 3
    assert v["one_seed_noise_val_microf1"] == pytest.approx(np.std(seed_f1, ddof=1))
    assert v["write_term_p1_drop"] == pytest.approx(93.0) and v["write_term_p1_before_after"] == [2.0, 0.14]
    assert v["write_term_c_corr_before_after"] == [0.11, -0.06]
    assert v["write_term_m1_p1_before_after"] == pytest.approx([np.mean(list(m1_vanilla["P1"].values())), 0.25])
    assert v["standardised_write_term_c_corr"] == 0.38 and v["standardised_write_term_p1_drop"] == pytest.approx(50.0)
    # completed answers n1-n3: A00.0, C00.0, D00.0 right; Z99.9 wrong; B00.0, E00.0 missed (n4 never completed)
    tp, fp, fn = 3, 1, 2
    assert v["standardised_write_lambda01_completed_f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn))


def _seed_grid_by_hand(tmp_path, params, rows: dict, notes: list[str], phases=("P2C",), rng_seed: int = 12) -> dict:
    """Own-heads chains of Table 3 rows at the given seeds ({row: seeds}), recoveries drawn at random: returns
    {row: {seed: {(phase, k): per-note recoveries}}}."""
    section = params["evaluate"]["own_heads"]
    k, rng = max(section["bins"]), np.random.default_rng(rng_seed)
    drawn: dict = {}
    for row, seeds in rows.items():
        label = section["arms"][row]
        for seed in seeds:
            rec = {(ph, kk): rng.uniform(0.2, 0.95, len(notes)) for ph in phases for kk in section["bins"]}
            _own_heads_by_hand({row: (tmp_path, label)}, seed, notes, {row: rec}, {row: np.ones(len(notes))},
                               section["bins"], "P2C")
            drawn.setdefault(row, {})[seed] = {key: rec[key] for key in rec if key[1] == k}
    return drawn


def test_r_d27_third_smollm_seed_by_hand(tmp_path):
    params = _variant_params(tmp_path)
    k, notes = max(params["evaluate"]["own_heads"]["bins"]), [f"n{i}" for i in range(7)]
    drawn = _seed_grid_by_hand(tmp_path, params, {"smollm_mistill": (0, 1, 2), "smollm_untrained": (0,)}, notes)
    values, v = _read_by_hand("R-D27", params)
    mistill = np.stack([drawn["smollm_mistill"][s][("P2C", k)] for s in (0, 1, 2)])
    untrained = drawn["smollm_untrained"][0][("P2C", k)]
    assert v["smollm_mistill_s2_own_p2c_k40"] == pytest.approx(np.median(mistill[2]))
    assert v["smollm_mistill_three_seed_mean"] == pytest.approx(mistill.mean())
    assert v["untrained_mean_over_notes"] == pytest.approx(untrained.mean())
    assert v["ratio_to_untrained_mean"] == pytest.approx(mistill.mean() / untrained.mean())
    assert v["mean_of_per_seed_medians"] == pytest.approx(np.median(mistill, axis=1).mean())
    assert v["ratio_to_untrained_median"] == pytest.approx(np.median(mistill, axis=1).mean() / np.median(untrained))
    low, high = v["smollm_mistill_three_seed_mean_interval"]
    assert low < mistill.mean() < high


def test_r_d12_seed_spread_by_hand(tmp_path):
    from mistill.distill.runs import variant_label
    from tests.chain.test_readers import GOLD, write_arm

    params = _variant_params(tmp_path, test_notes=True)
    section, k = params["evaluate"]["own_heads"], max(params["evaluate"]["own_heads"]["bins"])
    notes = [f"n{i}" for i in range(8)]
    drawn = _seed_grid_by_hand(tmp_path, params, {"qwen_mistill": (0, 1, 2), "qwen_vanilla_fp32": (0, 1, 2),
                                                  "qwen_vanilla_bf16": (0, 1, 2), "smollm_mistill": (0, 1, 2),
                                                  "smollm_vanilla_fp32": (0, 1)}, notes)
    rng = np.random.default_rng(5)
    controls = {}
    for name in ("randheads", "randheads1", "smolbottom", "smolbottom1"):
        entry = params["variants"]["arms"][name]
        controls[name] = {(ph, kk): rng.uniform(0.2, 0.95, len(notes)) for ph in ("P2", "P2C") for kk in section["bins"]}
        _own_heads_by_hand({name: (tmp_path / "variants", variant_label(name, entry))}, entry["seed"], notes,
                           {name: controls[name]}, {name: np.ones(len(notes))}, section["bins"], "P2C")
    for name, preds in (("randheads", {n: list(g) for n, g in GOLD.items()}),
                        ("randheads1", {"n1": GOLD["n1"], "n2": None, "n3": None, "n4": GOLD["n4"]})):
        entry = params["variants"]["arms"][name]
        write_arm(tmp_path / "variants", variant_label(name, entry), entry["seed"], preds)
    values, v = _read_by_hand("R-D12", params)

    def medians(row):
        return [float(np.median(drawn[row][s][("P2C", k)])) for s in (0, 1, 2)]

    assert v["qwen_mistill_own_p2c_seeds"] == pytest.approx(medians("qwen_mistill"))
    assert v["qwen_bf16_vanilla_seed_spread_p2c"] == pytest.approx(np.ptp(medians("qwen_vanilla_bf16")))
    assert v["smollm_fp32_vanilla_own_p2c_means"] == pytest.approx(
        [drawn["smollm_vanilla_fp32"][s][("P2C", k)].mean() for s in (0, 1)])
    assert v["qwen_mistill_seed1_minus_seed0"] == pytest.approx(
        np.mean(drawn["qwen_mistill"][1][("P2C", k)] - drawn["qwen_mistill"][0][("P2C", k)]))
    diff = controls["randheads1"][("P2C", k)] - controls["randheads"][("P2C", k)]
    assert v["qwen_randheads_seed1_minus_seed0_p2c"] == pytest.approx(diff.mean())
    assert v["qwen_randheads_seed_diff_lower_notes"] == int((diff < 0).sum())
    assert v["qwen_randheads_seed_diff_p2"] == pytest.approx(
        np.mean(controls["randheads1"][("P2", k)] - controls["randheads"][("P2", k)]))
    assert v["qwen_randheads_seed_task"][0] == 1.0 and v["qwen_randheads_seed_task"][1] < 1.0
    bottom = controls["smolbottom1"][("P2C", k)] - controls["smolbottom"][("P2C", k)]
    assert v["smollm_bottom40_seed_diff_lower_notes"] == int((bottom < 0).sum())
    smol = drawn["smollm_mistill"][1][("P2C", k)] - drawn["smollm_mistill"][0][("P2C", k)]
    from scipy.stats import binomtest
    assert v["smollm_mistill_seed_diff_p"] == pytest.approx(
        binomtest(int((smol > 0).sum()), int((smol != 0).sum())).pvalue)


def test_r_d26_frozen_pool_and_four_randheads_runs_by_hand(tmp_path):
    from mistill.distill.runs import variant_label

    params = _variant_params(tmp_path)
    section = params["evaluate"]["own_heads"]
    k, k8, notes = max(section["bins"]), min(section["bins"]), [f"n{i}" for i in range(9)]
    mistill = _seed_grid_by_hand(tmp_path, params, {"qwen_mistill": (0, 1, 2)}, notes)["qwen_mistill"]
    rng = np.random.default_rng(26)
    runs = {}
    for name in ("randheads", "randheads1", "randheadsp0s1", "randheadsp0s2"):
        entry = params["variants"]["arms"][name]
        runs[name] = {("P2C", kk): rng.uniform(0.2, 0.95, len(notes)) for kk in section["bins"]}
        _own_heads_by_hand({name: (tmp_path / "variants", variant_label(name, entry))}, entry["seed"], notes,
                           {name: runs[name]}, {name: np.ones(len(notes))}, section["bins"], "P2C")
    values, v = _read_by_hand("R-D26", params)
    frozen = runs["randheadsp0s1"][("P2C", k)] - runs["randheads"][("P2C", k)]
    assert v["frozen_pool_seed_diff_k40"] == pytest.approx(frozen.mean())
    assert v["frozen_pool_seed_diff_k40_notes"] == int((frozen > 0).sum())
    assert v["pool_effect_k40_k8"] == pytest.approx(
        [np.mean(runs["randheads1"][("P2C", kk)] - runs["randheadsp0s1"][("P2C", kk)]) for kk in (k, k8)])
    seeds = {"randheads": 0, "randheads1": 1, "randheadsp0s1": 1, "randheadsp0s2": 2}
    # the four pairs' per-note differences averaged per note (the note-clustered mean; the pairs hold one seed each)
    four = np.mean([mistill[s][("P2C", k)] - runs[n][("P2C", k)] for n, s in seeds.items()], axis=0)
    assert v["mistill_minus_randheads_4runs_k40"] == pytest.approx(four.mean())
    low, high = v["mistill_minus_randheads_4runs_k40_interval"]
    assert low <= four.mean() <= high


def test_r_d31_r_d32_matched_selection_by_hand(tmp_path):
    """App. M.2 on hand-made artifacts: two grids' pick files (Mistill's 0.1 trailing 0.03 by 0.0040204, as in the
    paper), the six pick runs' configs, recoveries, lifts and test answers; the picks at both bands, the gaps, the
    note-clustered means over the seed pairs against numpy and the corpus differences against the runs' micro-F1."""
    from mistill.distill.runs import variant_label, variant_run_dir
    from tests.chain.test_readers import GOLD, write_arm

    params = _variant_params(tmp_path, test_notes=True)
    section, arms = params["evaluate"]["own_heads"], params["variants"]["arms"]
    k, k8, notes = max(section["bins"]), min(section["bins"]), [f"n{i}" for i in range(8)]
    params["selection"]["dir"] = str(tmp_path / "select")
    grids = {"mistill": arms["mistillpick"]["lambda_from"], "randheads": arms["randheadspick"]["lambda_from"]}
    cells = {"mistill": [(0.01, 0.148, 0.65), (0.03, 0.1500204, 0.70), (0.1, 0.146, 0.75), (0.3, 0.12, 0.9)],
             "randheads": [(0.03, 0.1308250956, 0.80), (0.1, 0.12, 0.7), (0.3, 0.135, 0.7), (1.0, 0.01, 0.9)]}
    picks = {"mistill": 0.03, "randheads": 0.3}
    for family, grid in grids.items():
        write_json(tmp_path / "select" / "picks" / f"{grid}.json", {
            "cells": [{"lambda": lam, "micro_f1": f1, "m1_p2c": m1} for lam, f1, m1 in cells[family]],
            "selected": {"lambda_p1": picks[family], "lambda_p2": picks[family]}})
    rng = np.random.default_rng(31)
    runs = {"mistill": ("mistillpick", "mistillpick1", "mistillpick2"),
            "randheads": ("randheadspick", "randheadspick1", "randheadspick2")}
    drawn, lifts = {}, {}
    answers = {"mistill": {n: list(g) for n, g in GOLD.items()}, "randheads": {**GOLD, "n2": None, "n3": ["D00.0"]}}
    for family, names in runs.items():
        for name in names:
            entry = arms[name]
            drawn[name] = {(ph, kk): rng.uniform(0.2, 0.95, len(notes)) for ph in ("P1", "P2C") for kk in section["bins"]}
            lifts[name] = rng.uniform(0.5, 3.0, len(notes))
            label = variant_label(name, entry)
            _own_heads_by_hand({name: (tmp_path / "variants", label)}, entry["seed"], notes, {name: drawn[name]},
                               {name: lifts[name]}, section["bins"], "P2C")
            write_json(variant_run_dir(params["variants"]["dir"], name, entry) / "config.json",
                       {"arm": {"lambda_p1": picks[family], "lambda_p2": picks[family]}})
            write_arm(tmp_path / "variants", label, entry["seed"], answers[family])

    values, v = _read_by_hand("R-D31", params)
    assert (v["mistill_pick_lambda"], v["randheads_pool0_pick_lambda"]) == (0.03, 0.3)
    assert v["picks_at_0005_band"] == [0.1, 0.03]        # the paper's sensitivity picks
    assert v["val_gap_mistill_01_behind_003"] == pytest.approx(0.0040204)
    assert v["val_gap_randheads_003_behind_03"] == pytest.approx(0.0041749044)
    assert v["val_microf1_cells_mistill"] == [0.148, 0.1500204, 0.146, 0.12]

    def pair_mean(phase, kk):   # per note, the three seed pairs' differences averaged; then the mean over notes
        return np.mean([drawn[m][(phase, kk)] - drawn[r][(phase, kk)] for m, r in zip(*runs.values())], axis=0)

    k40 = pair_mean("P2C", k)
    assert v["own_p2c_k40_mistill_minus_randheads"] == pytest.approx(k40.mean())
    assert v["own_p2c_k40_higher_notes"] == int((k40 > 0).sum())
    assert v["own_p2c_k8_mistill_minus_randheads"] == pytest.approx(pair_mean("P2C", k8).mean())
    assert v["p1_recovery_diff"] == pytest.approx(pair_mean("P1", k).mean())
    assert v["own_p2c_k40_pairs"] == pytest.approx(
        [np.mean(drawn[m][("P2C", k)] - drawn[r][("P2C", k)]) for m, r in zip(*runs.values())])
    assert v["m2_lift_mistill_minus_randheads"] == pytest.approx(
        np.mean([lifts[m] - lifts[r] for m, r in zip(*runs.values())], axis=0).mean())
    assert v["mean_seed_medians_mistill_vs_randheads"] == pytest.approx(
        [np.mean([np.median(drawn[n][("P2C", k)]) for n in names]) for names in runs.values()])
    low, high = v["own_p2c_k40_mistill_minus_randheads_interval"]
    assert low <= k40.mean() <= high

    values, v = _read_by_hand("R-D32", params)
    f1 = {family: json.loads((tmp_path / "variants" / "DT-eval" / f"{variant_label(names[0], arms[names[0]])}-s0"
                              / "task.json").read_text())["metrics"]["micro_f1"] for family, names in runs.items()}
    assert f1["mistill"] == 1.0 and 0 < f1["randheads"] < 1
    assert v["corpus_microf1_pairs"] == pytest.approx([f1["mistill"] - f1["randheads"]] * 3)
    assert v["corpus_microf1_mistill_minus_randheads"] == pytest.approx(f1["mistill"] - f1["randheads"])
    assert (v["test_microf1_mistill_pick"], v["test_microf1_randheads_pick"]) == pytest.approx((1.0, f1["randheads"]))
    low, high = v["corpus_microf1_mistill_minus_randheads_interval"]
    assert low <= v["corpus_microf1_mistill_minus_randheads"] <= high

    write_json(variant_run_dir(params["variants"]["dir"], "randheadspick1", arms["randheadspick1"]) / "config.json",
               {"arm": {"lambda_p1": 0.1, "lambda_p2": 0.1}})   # a run not trained at its grid's pick is refused
    with pytest.raises(UserError, match="not grid randheadsp0's pick 0.3"):
        reader("R-D32").compute_values(params)


def _write_probe(variants_root: Path, label: str, notes: list[str], bins, rng) -> dict:
    """A rank probe of a variant's seed 0 (stage M6-probe): its probe.json and its probe knock-in recoveries."""
    rec = {("P2C", kk): rng.uniform(0.2, 0.95, len(notes)) for kk in bins}
    write_json(variants_root / "probe" / "HD-S" / f"{label}-s0" / "probe.json",
               {"phase": "P2C", "head": "l1h2", "rank_in_arm": 11, "moved_to": min(bins), "reference_ranks": [3, 3, 3]})
    _own_heads_by_hand({"probe": (variants_root / "probe", label)}, 0, notes, {"probe": rec},
                       {"probe": rng.uniform(1, 2, len(notes))}, bins, "P2C")
    return rec


def test_r_d17_precision_control_by_hand(tmp_path):
    """The precision control on hand-made artifacts: the main arms' and the three fp32 Mistill runs' answers,
    M1, LAS, training logs, own-heads recoveries and lifts at P2C and P1 set by hand; seed means, per-note and
    note-clustered differences against numpy."""
    from mistill.distill.runs import variant_label, variant_run_dir
    from mistill.evaluate.task import task_metrics
    from tests.chain.test_readers import GOLD, TRAIN_GOLD, note_f1, write_arm

    params = _variant_params(tmp_path, test_notes=True)
    params["distill"]["runs_dir"] = str(tmp_path)
    section, arms = params["evaluate"]["own_heads"], params["variants"]["arms"]
    rows = section["arms"]
    k, k8, notes, seeds = max(section["bins"]), min(section["bins"]), [f"n{i}" for i in range(6)], (0, 1, 2)
    rng = np.random.default_rng(17)
    drop = {"n1": ["A00.0"], "n2": None, "n3": GOLD["n3"], "n4": GOLD["n4"]}       # a worse list, one invalid
    preds = {"qwen_vanilla_fp32": GOLD, "qwen_vanilla_bf16": drop, "qwen_mistill": {**drop, "n2": GOLD["n2"]},
             "smollm_vanilla_fp32": GOLD, "smollm_vanilla_bf16": {**GOLD, "n1": None, "n2": None, "n3": None},
             "fp32mistill": {**GOLD, "n3": ["D00.0"]}}
    m1 = {kind: {"pooled": 0.8, "per_note": {}} for kind in PHASES}
    where = {}
    for row in ("qwen_vanilla_fp32", "qwen_vanilla_bf16", "qwen_mistill", "smollm_vanilla_fp32", "smollm_vanilla_bf16"):
        for seed in seeds:
            write_arm(tmp_path, rows[row], seed, preds[row], m1)
        where[row] = (tmp_path, rows[row])
    fp32 = {}
    for i, name in enumerate(("fp32mistill", "fp32mistill1", "fp32mistill2")):
        entry = arms[name]
        write_arm(tmp_path / "variants", variant_label(name, entry), entry["seed"], preds["fp32mistill"],
                  {kind: {**cell, "pooled": 0.75 + 0.01 * i} for kind, cell in m1.items()})
        write_json(variant_run_dir(params["variants"]["dir"], name, entry) / "config.json",
                   {"arm": {"lambda_p1": 0.1, "lambda_p2": 0.1}})
        fp32[entry["seed"]] = (tmp_path / "variants", variant_label(name, entry))
    las = {rows["qwen_vanilla_fp32"]: [0.5, 0.4, 0.3, 0.2], variant_label("fp32mistill", arms["fp32mistill"]): [0.4, 0.4, 0.3, 0.1]}
    for label, per_note in las.items():
        write_json(tmp_path / "LAS" / f"{label}-s0" / "las.json", {"metrics": {"las": float(np.mean(per_note))},
                                                                 "per_note": {"las": dict(zip(GOLD, per_note))}})
    for precision, cot in (("fp32", [0.536, 0.5, 0.419]), ("bf16", [0.532, 0.5, 0.478])):
        write_jsonl(tmp_path / "DT-000" / f"student-qwen-vanilla-{precision}-s0" / "metrics.jsonl",
                    [{"step": i + 1, "loss": c, "cot": c} for i, c in enumerate(cot)])
    rec, lift = {}, {}
    for seed in seeds:
        for arm, (root, label) in [*((f"fp32-{seed}", fp32[seed]),), *((f"{row}-{seed}", where[row]) for row in
                                                                        ("qwen_vanilla_fp32", "qwen_vanilla_bf16", "qwen_mistill"))]:
            rec[arm] = {("P2C", kk): rng.uniform(0.2, 0.95, len(notes)) for kk in section["bins"]}
            lift[arm] = {ph: rng.uniform(0.5, 3.0, len(notes)) for ph in ("P1", "P2C")}
            _own_heads_by_hand({arm: (root, label)}, seed, notes, {arm: rec[arm]}, {arm: lift[arm]["P2C"]},
                               section["bins"], "P2C")
            m6 = arm_dirs(root, label, seed)[1]
            write_json(m6 / "readside.json", {"phases": {ph: {"per_note": {"top": {
                n: {"lift": float(x)} for n, x in zip(notes, lift[arm][ph])}}} for ph in ("P1", "P2C")}})

    probe = _write_probe(tmp_path / "variants", variant_label("fp32mistill", arms["fp32mistill"]), notes,
                         section["bins"], rng)

    values, _ = reader("R-D17").compute_values(params)
    _assert_writes_what_it_lists(reader("R-D17"), params, values)
    unproduced = set(REGISTRY.results["R-D17"].unproduced_keys)
    assert set(REGISTRY.expected("paper").values["R-D17"]) - unproduced <= set(values)
    assert not unproduced & set(values)
    v = {key: x["value"] for key, x in values.items()}
    f1 = {row: task_metrics([p[n] or [] for n in GOLD], [GOLD[n] for n in GOLD], [p[n] is not None for n in GOLD],
                            TRAIN_GOLD)["micro_f1"] for row, p in preds.items()}
    assert v["qwen_bf16_minus_fp32_vanilla_microf1"] == pytest.approx(f1["qwen_vanilla_bf16"] - f1["qwen_vanilla_fp32"])
    assert v["smollm_bf16_minus_fp32_vanilla_microf1"] == pytest.approx(f1["smollm_vanilla_bf16"] - 1.0)
    assert v["qwen_bf16_vanilla_microf1_seeds"] == pytest.approx([f1["qwen_vanilla_bf16"]] * 3)
    assert v["qwen_fp32_mistill_transferred_lambda_microf1"] == pytest.approx(f1["fp32mistill"])
    per_note = [note_f1(preds["fp32mistill"][n] or [], GOLD[n]) - note_f1(GOLD[n], GOLD[n]) for n in GOLD]
    assert v["qwen_fp32_mistill_minus_fp32_vanilla"] == pytest.approx(np.mean(per_note))
    per_note = [note_f1(preds["fp32mistill"][n] or [], GOLD[n]) - note_f1(preds["qwen_mistill"][n] or [], GOLD[n])
                for n in GOLD]
    assert v["qwen_fp32_mistill_minus_bf16_mistill"] == pytest.approx(np.mean(per_note))
    assert v["qwen_fp32_mistill_las_vs_fp32_vanilla"] == pytest.approx(np.mean([-0.1, 0, 0, -0.1]))
    assert v["qwen_fp32_mistill_m1_p2c"] == pytest.approx(0.76)
    assert v["qwen_fp32_mistill_lambda"] == 0.1
    assert v["training_ce_fp32_vanilla_pilot"] == [0.536, 0.419]
    assert v["training_ce_bf16_vanilla_selection"] == [0.532, 0.478]
    assert v["smollm_bf16_vanilla_valid_rate"] == 0.25
    # completed answers of bf16 Vanilla: n1 {A00.0} of {A00.0, B00.0}, n3 and n4 exact; n2 invalid and left out
    assert v["qwen_bf16_vanilla_completed_precision_recall"] == pytest.approx([1.0, 4 / 5])
    assert v["qwen_fp32_mistill_own_p2c_seeds"] == pytest.approx([np.median(rec[f"fp32-{s}"][("P2C", k)]) for s in seeds])
    assert v["qwen_fp32_mistill_own_p2c_k8"] == pytest.approx(
        np.mean([np.median(rec[f"fp32-{s}"][("P2C", k8)]) for s in seeds]))
    for row, key in (("qwen_vanilla_fp32", "qwen_fp32_mistill_vs_fp32_vanilla_own_p2c"),
                     ("qwen_vanilla_bf16", "qwen_fp32_mistill_vs_bf16_vanilla_own_p2c"),
                     ("qwen_mistill", "qwen_fp32_mistill_vs_bf16_mistill_own_p2c")):
        diff = np.mean([rec[f"fp32-{s}"][("P2C", k)] - rec[f"{row}-{s}"][("P2C", k)] for s in seeds], axis=0)
        assert v[key] == pytest.approx(diff.mean()), key
    for phase, key in (("P2C", "qwen_fp32_mistill_m2_p2c_vs_bf16_vanilla"), ("P1", "qwen_fp32_mistill_m2_p1")):
        diff = np.mean([lift[f"fp32-{s}"][phase] - lift[f"qwen_vanilla_bf16-{s}"][phase] for s in seeds], axis=0)
        assert v[key] == pytest.approx(diff.mean()), key
    assert v["qwen_fp32_mistill_k8_probe"] == pytest.approx(np.median(probe[("P2C", k8)]))
    assert "l1h2 (rank 11 in the arm" in values["qwen_fp32_mistill_k8_probe"]["statistic"]

    arms["fp32mistill1"]["lambda_from"] = "bf16"   # an fp32 run at a λ of its own is not the transferred-λ control
    with pytest.raises(UserError, match="transferred lambda"):
        reader("R-D17").compute_values(params)


def test_r_d8_learning_curve_by_hand(tmp_path):
    """The learning curve on hand-made artifacts: the four smaller-size variants and the main arms at three seeds,
    their answers and M1 set by hand; the sizes from the runs' configs, the paired counts against an exact binomial
    test, the M1 leads by hand."""
    from scipy.stats import binomtest

    from mistill.distill.runs import variant_label, variant_run_dir
    from tests.chain.test_readers import GOLD, note_f1, write_arm

    params = _variant_params(tmp_path, test_notes=True)
    params["distill"]["runs_dir"] = str(tmp_path)
    rows, arms = params["evaluate"]["own_heads"]["arms"], params["variants"]["arms"]
    worse = {"n1": ["A00.0"], "n2": None, "n3": GOLD["n3"], "n4": ["X00.0"]}
    preds = {"mistilln100": {**GOLD, "n4": ["X00.0"]}, "vanillan100": worse, "mistilln250": worse, "vanillan250": GOLD,
             "qwen_mistill": {**GOLD, "n1": ["A00.0"]}, "qwen_vanilla_bf16": worse, "qwen_vanilla_fp32": GOLD}
    m1 = {"mistilln100": 0.7, "vanillan100": 0.6, "mistilln250": 0.72, "vanillan250": 0.69, "qwen_mistill": 0.8,
          "qwen_vanilla_bf16": 0.76, "qwen_vanilla_fp32": 0.78}

    def shares(p2c):
        return {kind: {"pooled": p2c if kind == "P2C" else 0.5, "per_note": {}} for kind in PHASES}

    for name in ("mistilln100", "vanillan100", "mistilln250", "vanillan250"):
        entry = arms[name]
        write_arm(tmp_path / "variants", variant_label(name, entry), entry["seed"], preds[name], shares(m1[name]))
        write_json(variant_run_dir(params["variants"]["dir"], name, entry) / "config.json",
                   {"example_ids": [f"t{i}" for i in range(entry["n_train"])]})
    for row in ("qwen_mistill", "qwen_vanilla_bf16", "qwen_vanilla_fp32"):
        for seed in (0, 1, 2):
            write_arm(tmp_path, rows[row], seed, preds[row], shares(m1[row] + 0.01 * seed))
    write_json(tmp_path / "DT-001" / f"{rows['qwen_mistill']}-s0" / "config.json",
               {"example_ids": [f"t{i}" for i in range(493)]})

    _, v = _read_by_hand("R-D8", params)
    assert v["training_sizes"] == [arms["mistilln100"]["n_train"], arms["mistilln250"]["n_train"], 493] == [100, 250, 493]

    def counts(a, b, times=1):
        d = [note_f1(preds[a][n] or [], GOLD[n]) - note_f1(preds[b][n] or [], GOLD[n]) for n in GOLD] * times
        return sum(x > 0 for x in d), sum(x < 0 for x in d)

    for i, (a, b, times, key) in enumerate((("mistilln100", "vanillan100", 1, "n100_mistill_vs_vanilla_notes"),
                                            ("mistilln250", "vanillan250", 1, "n250_mistill_vs_vanilla_notes"),
                                            ("qwen_mistill", "qwen_vanilla_bf16", 3, "n493_mistill_vs_bf16_vanilla_note_pairs"))):
        higher, lower = counts(a, b, times)
        assert (v[key], v["notes_higher_by_size"][i], v["notes_lower_by_size"][i]) == (higher, higher, lower), key
        assert v["sign_p_by_size"][i] == pytest.approx(binomtest(higher, higher + lower, 0.5).pvalue)
    assert (v["n100_mistill_vs_vanilla_notes"], v["n493_mistill_vs_bf16_vanilla_note_pairs"]) == (2, 6)
    assert v["m1_p2c_lead_n100_n250_n493"] == pytest.approx([0.1, 0.03, 0.04])
    assert v["m1_p2c_lead_vs_fp32_vanilla_n493"] == pytest.approx(0.02)
    assert v["n493_fp32_vanilla_seed0_microf1"] == 1.0
    assert v["microf1_vanilla_bf16_by_size"][1] == 1.0 and v["microf1_mistill_by_size"][1] < 1.0

    arms["vanillan250"]["n_train"] = 200   # the two arms of a size must train on the same notes
    with pytest.raises(UserError, match="one student, seed, precision and n_train"):
        reader("R-D8").compute_values(params)


def test_r_d11_extra_cells_by_hand(tmp_path):
    """The three extra cells on hand-made artifacts: answers, M1 and LAS set by hand; per-note differences and
    counts by hand, the replicate's absolute differences, SmolLM3's valid and cap shares."""
    from mistill.distill.runs import variant_label, variant_run_dir
    from tests.chain.test_readers import GOLD, note_f1, write_arm

    params = _variant_params(tmp_path, test_notes=True)
    rows, arms = params["evaluate"]["own_heads"]["arms"], params["variants"]["arms"]

    def shares(p1, p2, p2c):
        return {"P1": {"pooled": p1, "per_note": {}}, "P2": {"pooled": p2, "per_note": {}},
                "P2C": {"pooled": p2c, "per_note": {}}}

    light = {**GOLD, "n1": ["A00.0"]}
    rep, original = {**GOLD, "n3": ["D00.0"]}, {**GOLD, "n2": ["Z00.0"], "n4": ["F00.0", "Q00.0"]}
    alone, both = {"n1": None, "n2": None, "n3": ["D00.0"], "n4": None}, {**GOLD, "n1": None}
    write_arm(tmp_path / "variants", variant_label("lightp1", arms["lightp1"]), 0, light, shares(0.86, 0.71, 0.8))
    write_json(variant_run_dir(params["variants"]["dir"], "lightp1", arms["lightp1"]) / "config.json",
               {"arm": {"lambda_p1": 0.03, "lambda_p2": 0.1}})
    write_arm(tmp_path, rows["qwen_mistill"], 0, GOLD, shares(0.857, 0.712, 0.802))
    write_arm(tmp_path / "variants", variant_label("replicate2", arms["replicate2"]), 2, rep, shares(0.5, 0.5, 0.802))
    write_arm(tmp_path, rows["qwen_mistill"], 2, original, shares(0.5, 0.5, 0.804))
    write_arm(tmp_path / "variants", variant_label("smolattnonly", arms["smolattnonly"]), 0, alone,
              shares(0.844, 0.535, 0.736))
    write_arm(tmp_path, rows["smollm_mistill"], 0, both, shares(0.5, 0.5, 0.5))
    for label, las, adjusted in ((f'{variant_label("replicate2", arms["replicate2"])}-s2', 0.25, 0.2),
                                 (f'{rows["qwen_mistill"]}-s2', 0.23, 0.21),
                                 (f'{variant_label("smolattnonly", arms["smolattnonly"])}-s0', 0.082, 0.05),
                                 (f'{rows["smollm_mistill"]}-s0', 0.081, 0.07)):
        groups = {"leaking": {"notes": 0, "mean_gain": None}, "nonleaking": {"notes": 4, "mean_gain": adjusted}}
        write_json(tmp_path / "LAS" / label / "las.json", {"metrics": {"las": las, "las_leakage_adjusted": adjusted},
                                                           "per_note": {"las": {}},
                                                           "leakage_adjusted": {"value": adjusted, **groups}})

    _, v = _read_by_hand("R-D11", params)
    f1 = {name: [note_f1(p[n] or [], GOLD[n]) for n in GOLD] for name, p in
          (("light", light), ("gold", GOLD), ("rep", rep), ("original", original), ("alone", alone), ("both", both))}
    assert v["qwen_lambda_p1_003_lambdas"] == [0.03, 0.1]
    assert v["qwen_lambda_p1_003_vs_mistill"] == pytest.approx(np.mean(np.subtract(f1["light"], f1["gold"])))
    assert v["qwen_lambda_p1_003_m1_p1_p2_p2c"] == [0.86, 0.71, 0.8]
    assert v["original_seed2_microf1"] < v["replicate_seed2_other_gpu_microf1"] < 1.0
    assert v["t_noise_microf1_m1p2c_las"] == pytest.approx(
        [v["replicate_seed2_other_gpu_microf1"] - v["original_seed2_microf1"], 0.002, 0.02])
    # the replicate is higher on n2 and n4, lower on n3, tied on n1
    assert v["replicate_paired_notes"] == 2 and v["replicate_m1_p2c"] == 0.802
    assert v["smollm_attn_only_valid_cap"] == [0.25, 0.75]
    assert v["smollm_attn_only_m1_p1_p2_p2c"] == [0.844, 0.535, 0.736] and v["smollm_attn_only_las"] == 0.082
    assert v["smollm_attn_only_las_leakage_adjusted"] == 0.05
    assert v["replicate_las_original_las_leakage_adjusted"] == [0.2, 0.21]
    assert v["smollm_attn_only_vs_both_terms_s0"] == sum(a > b for a, b in zip(f1["alone"], f1["both"])) == 0

    arms["replicate2"]["window"] = 0   # a replicate changes nothing of the recipe
    with pytest.raises(UserError, match="changing nothing"):
        reader("R-D11").compute_values(params)


def test_r_d22_fp32_reselection_by_hand(tmp_path):
    """The fp32 re-selection on hand-made artifacts: a pick file, the pick's three runs and the transferred-λ runs
    with answers and own-heads recoveries set by hand; the pick's cells, medians and note-clustered differences
    against numpy."""
    from mistill.distill.runs import variant_label, variant_run_dir
    from tests.chain.test_readers import GOLD, note_f1, write_arm

    params = _variant_params(tmp_path, test_notes=True)
    params["selection"]["dir"] = str(tmp_path / "DT-select")
    section, arms = params["evaluate"]["own_heads"], params["variants"]["arms"]
    rows, bins = section["arms"], section["bins"]
    k, k8, notes, seeds = max(bins), min(bins), [f"n{i}" for i in range(6)], (0, 1, 2)
    rng = np.random.default_rng(22)
    cells = [{"lambda": lam, "micro_f1": f1, "m1_p2c": m1}
             for lam, f1, m1 in ((0.01, 0.183, 0.80), (0.03, 0.181, 0.79), (0.1, 0.17, 0.78), (0.3, 0.15, 0.7))]
    write_json(tmp_path / "DT-select" / "picks" / "fp32.json",
               {"grid": "fp32", "cells": cells, "selected": {"lambda_p1": 0.01, "lambda_p2": 0.01}})
    pick, vanilla = {**GOLD, "n1": ["A00.0"]}, {**GOLD, "n4": None}
    m1 = {kind: {"pooled": 0.8, "per_note": {}} for kind in PHASES}
    rec, where = {}, {}
    for name, lam in (("fp32pick", 0.01), ("fp32pick1", 0.01), ("fp32pick2", 0.01), ("fp32mistill", 0.1),
                      ("fp32mistill1", 0.1), ("fp32mistill2", 0.1)):
        entry = arms[name]
        label = variant_label(name, entry)
        write_arm(tmp_path / "variants", label, entry["seed"], pick if lam == 0.01 else GOLD, m1)
        write_json(variant_run_dir(params["variants"]["dir"], name, entry) / "config.json",
                   {"arm": {"lambda_p1": lam, "lambda_p2": lam}})
        where[name] = ((tmp_path / "variants", label), entry["seed"])
    for row in ("qwen_vanilla_fp32", "qwen_vanilla_bf16", "qwen_mistill"):
        for seed in seeds:
            write_arm(tmp_path, rows[row], seed, vanilla if row == "qwen_vanilla_fp32" else GOLD, m1)
            where[f"{row}-{seed}"] = ((tmp_path, rows[row]), seed)
    for arm, (place, seed) in where.items():
        rec[arm] = {("P2C", kk): rng.uniform(0.2, 0.95, len(notes)) for kk in bins}
        _own_heads_by_hand({arm: place}, seed, notes, {arm: rec[arm]}, {arm: rng.uniform(1, 2, len(notes))}, bins,
                           "P2C")
    # the swept cells: 0.03 on the test notes (EV-cell), 0.3 on its own heads (M6-cell), seed 0
    swept = tmp_path / "DT-select-test"
    params["selection"]["fp32_swept"] = {"out_dir": str(swept), "test": 0.03, "own_heads": 0.3}
    write_json(swept / "DT-eval" / "fp32-l0.03" / "task.json", {"metrics": {"micro_f1": 0.203}})
    rec["cell"] = {("P2C", kk): rng.uniform(0.2, 0.95, len(notes)) for kk in bins}
    _own_heads_by_hand({"cell": (swept, "fp32-l0.3")}, 0, notes, {"cell": rec["cell"]},
                       {"cell": rng.uniform(1, 2, len(notes))}, bins, "P2C")

    probe = _write_probe(tmp_path / "variants", variant_label("fp32pick", arms["fp32pick"]), notes, bins, rng)

    values, _ = reader("R-D22").compute_values(params)
    _assert_writes_what_it_lists(reader("R-D22"), params, values)
    unproduced = set(REGISTRY.results["R-D22"].unproduced_keys)
    assert set(REGISTRY.expected("paper").values["R-D22"]) - unproduced <= set(values)
    assert not unproduced & set(values)
    v = {key: x["value"] for key, x in values.items()}
    assert v["selected_fp32_lambda"] == 0.01 and v["tie_band"] == params["selection"]["grids"]["fp32"]["band"]
    assert v["val_microf1_lambda001_vs_003"] == [0.183, 0.181] and v["val_lambdas_fp32"] == [0.01, 0.03, 0.1, 0.3]
    assert v["own_p2c_k40_lambda001"] == pytest.approx(np.median(rec["fp32pick"][("P2C", k)]))
    assert v["own_p2c_k8_lambda001"] == pytest.approx(np.median(rec["fp32pick"][("P2C", k8)]))
    against = np.mean([rec["fp32pick"][("P2C", k)] - rec[f"qwen_vanilla_fp32-{s}"][("P2C", k)] for s in seeds], axis=0)
    assert v["own_p2c_k40_lambda001_vs_fp32_vanilla"] == pytest.approx(against.mean())
    assert v["lambda001_vs_bf16_mistill_s0_own_p2c"] == pytest.approx(
        np.mean(rec["fp32pick"][("P2C", k)] - rec["qwen_mistill-0"][("P2C", k)]))
    for row, key in (("qwen_vanilla_fp32", "transferred_lambda_vs_fp32_vanilla_own_p2c"),
                     ("qwen_vanilla_bf16", "transferred_lambda_vs_bf16_vanilla_own_p2c")):
        diff = np.mean([rec[n][("P2C", k)] - rec[f"{row}-{s}"][("P2C", k)]
                        for n, s in (("fp32mistill", 0), ("fp32mistill1", 1), ("fp32mistill2", 2))], axis=0)
        assert v[key] == pytest.approx(diff.mean()), key
    per_note = np.mean([note_f1(pick[n] or [], GOLD[n]) - note_f1(vanilla[n] or [], GOLD[n]) for n in GOLD])
    assert v["lambda001_vs_vanilla_seeds_per_note"] == pytest.approx([per_note] * 3)
    assert v["test_microf1_lambda01_seed0"] == 1.0 and v["test_microf1_seed0_lambda001"] < 1.0
    assert v["test_microf1_lambda003_seed0"] == 0.203
    assert v["lambda03_own_p2c"] == pytest.approx(np.median(rec["cell"][("P2C", k)]))
    assert v["own_p2c_k8_probe_l35h26_in_rank8"] == pytest.approx(np.median(probe[("P2C", k8)]))
    assert v["l35h26_rank_fp32_arm"] == 11
    against = np.mean([probe[("P2C", k8)] - rec[f"qwen_vanilla_fp32-{s}"][("P2C", k8)] for s in seeds], axis=0)
    assert v["probe_vs_fp32_vanilla"] == pytest.approx(against.mean())

    params["selection"]["fp32_swept"]["test"] = 0.05    # not a cell of the grid
    with pytest.raises(UserError, match="not a cell"):
        reader("R-D22").compute_values(params)
    params["selection"]["fp32_swept"]["test"] = 0.03

    write_json(variant_run_dir(params["variants"]["dir"], "fp32pick1", arms["fp32pick1"]) / "config.json",
               {"arm": {"lambda_p1": 0.1, "lambda_p2": 0.1}})   # a run that did not train at the pick
    with pytest.raises(UserError, match="not grid fp32's pick"):
        reader("R-D22").compute_values(params)


def test_r_d30_three_seeds_at_the_fp32_pick_by_hand(tmp_path):
    """Three fp32 runs at the fp32 pick against fp32 Vanilla CoT-KD, seed i against seed i: recoveries, lifts,
    answers and trace edits set by hand; the note-clustered means, per-pair means, medians and the corpus
    difference against numpy."""
    from mistill.distill.runs import variant_label, variant_run_dir
    from mistill.evaluate.task import task_metrics
    from tests.chain.test_readers import GOLD, TRAIN_GOLD, write_arm

    params = _variant_params(tmp_path, test_notes=True)
    params["selection"]["dir"] = str(tmp_path / "DT-select")
    section, arms = params["evaluate"]["own_heads"], params["variants"]["arms"]
    label, bins = section["arms"]["qwen_vanilla_fp32"], section["bins"]
    k, k8, notes, seeds = max(bins), min(bins), list(GOLD), (0, 1, 2)
    rng = np.random.default_rng(30)
    write_json(tmp_path / "DT-select" / "picks" / "fp32.json",
               {"grid": "fp32", "cells": [], "selected": {"lambda_p1": 0.01, "lambda_p2": 0.01}})
    preds = {"pick": {**GOLD, "n2": None}, "vanilla": {**GOLD, "n3": ["D00.0"]}}
    m1 = {kind: {"pooled": 0.8, "per_note": {}} for kind in PHASES}
    rec, lift, edit, where = {}, {}, {}, {}
    for seed, name in zip(seeds, ("fp32pick", "fp32pick1", "fp32pick2")):
        entry = arms[name]
        write_arm(tmp_path / "variants", variant_label(name, entry), seed, preds["pick"], m1)
        write_json(variant_run_dir(params["variants"]["dir"], name, entry) / "config.json",
                   {"arm": {"lambda_p1": 0.01, "lambda_p2": 0.01}})
        write_arm(tmp_path, label, seed, preds["vanilla"], m1)
        where[f"pick-{seed}"] = (tmp_path / "variants", variant_label(name, entry))
        where[f"vanilla-{seed}"] = (tmp_path, label)
    for arm, place in where.items():
        seed = int(arm[-1])
        rec[arm] = {("P2C", kk): rng.uniform(0.2, 0.95, len(notes)) for kk in bins}
        lift[arm] = rng.uniform(0.5, 3.0, len(notes))
        edit[arm] = rng.uniform(-0.5, 1.5, len(notes))
        _own_heads_by_hand({arm: place}, seed, notes, {arm: rec[arm]}, {arm: lift[arm]}, bins, "P2C")
        edits = edits_dir(*place, seed)
        write_json(edits / "prefix_edit.json", {"notes": notes})
        for note, effect in zip(notes, edit[arm]):   # one event, identity margin 2, every replacement 2 - effect
            write_jsonl(edits / note / "prefix_edit.jsonl", [{"pos": 7, "margin_identity": 2.0, "margin": {
                "filler": 2.0 - effect, "unrelated": 2.0 - effect, "other_category": None}}])

    # own completed generations: a seeded subset of the notes per run, top and random cells
    from tests.chain.test_own_trace_readers import write_cells

    own = {}
    for arm, (root, lab) in where.items():
        kept = sorted(rng.choice(notes, size=max(2, len(notes) - 2), replace=False))
        own[arm] = {n: {(s, kk): float(rng.uniform(0.2, 0.95)) for s in ("top", "random") for kk in bins} for n in kept}
        write_cells(root / "own-trace" / "M6" / f"{lab}-s{arm[-1]}", own[arm], bins)

    values, _ = reader("R-D30").compute_values(params)
    _assert_writes_what_it_lists(reader("R-D30"), params, values)
    unproduced = set(REGISTRY.results["R-D30"].unproduced_keys)
    assert set(REGISTRY.expected("paper").values["R-D30"]) - unproduced <= set(values)
    v = {key: x["value"] for key, x in values.items()}

    def diff(table, key=None):
        return np.mean([(table[f"pick-{s}"] if key is None else table[f"pick-{s}"][key])
                        - (table[f"vanilla-{s}"] if key is None else table[f"vanilla-{s}"][key]) for s in seeds], axis=0)

    assert v["own_p2c_k40_mistill_minus_fp32_vanilla"] == pytest.approx(diff(rec, ("P2C", k)).mean())
    assert v["own_p2c_k40_higher_notes"] == int((diff(rec, ("P2C", k)) > 0).sum())
    assert v["own_p2c_k8_diff"] == pytest.approx(diff(rec, ("P2C", k8)).mean())
    assert v["m2_lift_diff"] == pytest.approx(diff(lift).mean())
    assert v["prefix_edit_diff"] == pytest.approx(diff(edit).mean())
    assert v["own_p2c_k40_pair_diffs"] == pytest.approx(
        [np.mean(rec[f"pick-{s}"][("P2C", k)] - rec[f"vanilla-{s}"][("P2C", k)]) for s in seeds])
    assert v["mistill_fp32_l001_seed_medians"] == pytest.approx([np.median(rec[f"pick-{s}"][("P2C", k)]) for s in seeds])
    f1 = {arm: task_metrics([p[n] or [] for n in GOLD], [GOLD[n] for n in GOLD], [p[n] is not None for n in GOLD],
                            TRAIN_GOLD)["micro_f1"] for arm, p in preds.items()}
    assert v["three_seed_microf1_mistill_vs_vanilla"] == pytest.approx([f1["pick"], f1["vanilla"]])
    assert v["corpus_microf1_diff"] == pytest.approx(f1["pick"] - f1["vanilla"])
    assert v["fp32_lambda"] == 0.01
    for kk, key in ((k, "owntrace_k40_diff"), (k8, "owntrace_k8_diff")):
        per_note = {}
        for s in seeds:
            mine, theirs = own[f"pick-{s}"], own[f"vanilla-{s}"]
            for n in set(mine) & set(theirs):
                per_note.setdefault(n, []).append(mine[n][("top", kk)] - theirs[n][("top", kk)])
        assert v[key] == pytest.approx(np.mean([np.mean(d) for d in per_note.values()]))
    index = {n: i for i, n in enumerate(notes)}
    assert v["owntrace_seed_values_vs_tf"] == pytest.approx(
        [np.mean([c[("top", k)] for c in own[f"pick-{s}"].values()]) for s in seeds]
        + [np.mean([rec[f"pick-{s}"][("P2C", k)][index[n]] for n in own[f"pick-{s}"]]) for s in seeds])
