"""The teacher's read-side passes (HD-001-read) and their readers (R-C5, R-C10, R-C11) on a tiny world.

Hand-made shortlist traces in the App. B prompt go through the instrument's events, attribution and
calibration with a tiny random Qwen3, then through the three read passes.  Their numbers are checked
against quantities computed another way: the key pass's whole-head effect E against the attribution
pass's exact mean-ablation importance, the identity re-feed against the teacher-forced margin, and the
readers' values against direct computations from the rows.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from own_heads_world import INVENTORY, tiny_qwen3, traces

from mistill.instrument.passes import (
    InstrumentConfig,
    load_attr,
    load_events,
    run_attribution,
    run_calibration,
    run_events,
)
from mistill.instrument.read_passes import ReadSide, run_edits, run_keys, run_readside, teacher_panel
from mistill.instrument.readside import CAT, REGION_CATEGORIES
from mistill.io import read_jsonl, write_jsonl
from mistill.repro.reader_module import load_reader

REPO = Path(__file__).resolve().parents[2]
NAMED = {"region_readers": ["l0h1", "l1h2"], "prose_readers": ["l1h0", "l0h3"], "contrastive_readers": ["l1h3", "l0h2"]}


def reader(result_id: str):
    return load_reader(REPO / "readers" / f"r_{result_id[2:].lower()}.py")


@pytest.fixture(scope="module")
def read_world(tmp_path_factory, teacher_tokenizer):
    root = tmp_path_factory.mktemp("read_world")
    write_jsonl(root / "inventory.jsonl", [{"code": c, "description": d} for c, d in INVENTORY])
    write_jsonl(root / "traces.jsonl", traces())
    cfg = InstrumentConfig(traces=str(root / "traces.jsonl"), inventory=str(root / "inventory.jsonl"),
                           out_dir=str(root / "HD-001"), teacher="unused", n_null=4, nominees_topk=3,
                           nominees_global_topk=2, pool_k=4, summary_top_k=2, recurrence_top_k=2)
    params = {"profile": "test", "instrument": cfg.as_dict(),
              "read_side": {"out_dir": str(root / "HD-001-read"), "panel_k": 2, "seed": 0,
                            "key_block_min_effect": 0.01, "edits": {"max_events_per_note": 3}},
              "readers": {"necessity_k": 2, "knockin_k": 2, "named_heads": NAMED}, "stats": {"bootstrap_resamples": 200}}
    model = tiny_qwen3(teacher_tokenizer.vocab_size, seed=3)
    kw = dict(model=model, tokenizer=teacher_tokenizer)
    run_events(cfg, params, **kw)
    run_attribution(cfg, params, exact_kinds=("P1", "P2C"), **kw)
    run_calibration(cfg, params)
    run_readside(cfg, params, **kw)
    run_keys(cfg, params, **kw)
    run_edits(cfg, params, **kw)
    return root, cfg, params, kw


def _notes(root: Path) -> list[str]:
    return [t["note_id"] for t in traces() if (root / "HD-001" / t["note_id"] / "events.jsonl").exists()]


def test_read_rows_sum_to_one_and_carry_the_attribution_importance(read_world):
    root, _, _, _ = read_world
    for note in _notes(root):
        attr = load_attr(root / "HD-001" / note / "attr.npz")
        importance = {(str(k), int(p)): row.reshape(-1)
                      for k, p, row in zip(attr["kinds"], attr["positions"], attr["importance"])}
        rows = read_jsonl(root / "HD-001-read" / "readside" / note / "read.jsonl")
        assert rows
        for row in rows:
            np.testing.assert_allclose(np.sum(row["shares"], axis=1), 1.0, atol=1e-6)
            expected = importance[(row["kind"], row["pos"])][row["heads"]]
            np.testing.assert_allclose(row["importance"], expected, rtol=1e-6)


def test_panel_follows_app_e(read_world):
    root, _, _, _ = read_world
    sets = json.loads((root / "HD-001" / "head_sets_contrast.json").read_text())
    panel = teacher_panel(sets, 2, seed=0, named=[1])
    p1 = [row["layer"] * sets["n_heads"] + row["head"] for row in sets["phases"]["P1"]]
    assert panel.top["P1"] == p1[:2] and panel.bottom["P1"] == p1[::-1][:2]
    assert "P2" not in panel.bottom and len(panel.random) == 2
    assert set(panel.heads()) == {*p1[:2], *p1[-2:], *panel.top["P2"], *panel.top["P2C"], *panel.bottom["P2C"],
                                  *panel.random, 1}
    assert panel == teacher_panel(sets, 2, seed=0, named=[1])          # seeded
    ranked = {*p1[:2], *p1[-2:], *panel.top["P2"], *panel.top["P2C"], *panel.bottom["P2C"], *panel.random}
    assert panel.size() == len(ranked)                                  # the named head aside


def test_whole_head_effect_equals_the_exact_importance_of_the_attribution_pass(read_world):
    """E (clean minus the head mean-ablated, key pass) is the attribution pass's exact I_h where it patched."""
    root, _, _, _ = read_world
    checked = 0
    for note in _notes(root):
        attr = load_attr(root / "HD-001" / note / "attr.npz")
        exact = {(str(k), int(p)): row.reshape(-1) for k, p, row in zip(attr["kinds"], attr["positions"], attr["exact"])}
        for row in read_jsonl(root / "HD-001-read" / "keys" / note / "key_intervene.jsonl"):
            if len(row["heads"]) != 1:
                continue
            value = exact[(row["kind"], row["pos"])][row["heads"][0]]
            if not np.isnan(value):
                assert row["E"] == pytest.approx(float(value), abs=1e-4)
                checked += 1
    assert checked > 0


def test_identity_re_feed_reproduces_the_teacher_forced_margin(read_world):
    root, _, _, _ = read_world
    rows = 0
    for note in _notes(root):
        margins = {e.pos: e.margin for e in load_events(root / "HD-001" / note / "events.jsonl")}
        for row in read_jsonl(root / "HD-001-read" / "edits" / note / "prefix_edit.jsonl"):
            assert row["margin_identity"] == pytest.approx(margins[row["pos"]], abs=1e-4)
            rows += 1
    assert rows > 0


def test_passes_resume_per_note(read_world):
    root, cfg, params, kw = read_world
    files = [p for p in (root / "HD-001-read").rglob("*.jsonl")]
    before = {p: p.stat().st_mtime_ns for p in files}
    run_readside(cfg, params, **kw)
    run_keys(cfg, params, **kw)
    run_edits(cfg, params, **kw)
    assert {p: p.stat().st_mtime_ns for p in files} == before
    # a changed setting of one pass recomputes that pass only
    changed = copy.deepcopy(params)
    changed["read_side"]["edits"]["max_events_per_note"] = 2
    run_edits(cfg, changed, **kw)
    after = {p: p.stat().st_mtime_ns for p in files}
    assert all(after[p] != before[p] for p in files if p.parent.parent.name == "edits" and
               p.name == "prefix_edit.jsonl")
    assert all(after[p] == before[p] for p in files if p.parent.parent.name != "edits")
    run_edits(cfg, params, **kw)


def test_a_truncated_evidence_file_is_recomputed(read_world):
    root, cfg, params, kw = read_world
    note = _notes(root)[0]
    path = root / "HD-001-read" / "edits" / note / "evidence_edit.jsonl"
    good = path.read_text()
    path.write_text(good[: len(good) // 2])
    run_edits(cfg, params, **kw)
    assert path.read_text() == good


def test_r_c5_values_by_direct_computation(read_world, monkeypatch):
    root, _, params, _ = read_world
    module = reader("R-C5")
    values, _ = module.compute_values(params)
    assert set(values) <= set(module.keys(params))
    head = 1   # l0h1, the first region reader (4 heads per layer)
    per_note = []
    for note in _notes(root):
        rows = [r for r in read_jsonl(root / "HD-001-read" / "readside" / note / "read.jsonl") if r["kind"] == "P1"]
        shares = [sum(r["shares"][r["heads"].index(head)][CAT[c]] for c in REGION_CATEGORIES) for r in rows]
        if shares:
            per_note.append(np.mean(shares))
    assert values["l0h1_region_share"]["value"] == pytest.approx(float(np.median(per_note)))
    assert values["read_panel_size"]["value"] == json.loads(
        (root / "HD-001-read" / "readside" / "read_panel.json").read_text())["panel_size"]


def test_r_c10_share_of_effect_by_direct_computation(read_world):
    root, _, params, _ = read_world
    module = reader("R-C10")
    values, _ = module.compute_values(params)
    assert set(values) <= set(module.keys(params))
    rows = [r for note in _notes(root) for r in read_jsonl(root / "HD-001-read" / "keys" / note / "key_intervene.jsonl")
            if r["role"] == "l1h3:near_miss"]
    ratios = [r["D_named"] / r["E"] for r in rows if r["E"] > ReadSide.from_params(params).key_block_min_effect]
    assert values["l1h3_key_block_share_of_effect"]["value"] == pytest.approx(float(np.median(ratios)))
    assert values["contrastive_events_with_earlier_sibling"]["value"] == len(rows)


def test_r_c11_neutral_effect_by_direct_computation(read_world):
    root, _, params, _ = read_world
    module = reader("R-C11")
    values, _ = module.compute_values(params)
    assert set(values) <= set(module.keys(params))
    rows = [r for note in _notes(root) for r in read_jsonl(root / "HD-001-read" / "edits" / note / "prefix_edit.jsonl")]
    effects = [r["margin_identity"] - r["margin"]["filler"] for r in rows]
    assert values["neutral_edit_mean_effect"]["value"] == pytest.approx(float(np.mean(effects)))
    assert values["neutral_edit_positive_events"]["value"] == sum(e > 0 for e in effects)
