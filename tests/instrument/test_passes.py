"""The passes end to end on hand-made traces: artifacts, resumability, corrupt artifacts, bad input."""

from __future__ import annotations

import json

import numpy as np

from mistill.instrument.passes import artifact_state, run_attribution, run_events
from mistill.io import write_jsonl


def test_bad_notes_are_skipped_with_a_reason(world):
    tmp_path, cfg, params, events, *_ = world
    assert set(events["skipped"]) == {"bad_unknown", "bad_empty"}
    assert "Z99.89" in events["skipped"]["bad_unknown"]
    assert "no decision events" in events["skipped"]["bad_empty"]
    assert not (tmp_path / "HD-001" / "bad_unknown" / "events.jsonl").exists()
    assert events["counts"]["P1"] == 4 + 5 + 4  # one P1 per first mention (note2 repeats N18.3)
    assert events["counts"]["P2C"] > 0 and events["counts"]["NULL"] == 18


def test_pass_artifacts_and_head_sets(world):
    tmp_path, cfg, *_ = world
    out = tmp_path / "HD-001"
    for note in ("note0", "note1", "note2"):
        with np.load(out / note / "attr.npz") as attr:
            n_events = len(attr["kinds"])
            exact = attr["exact"][attr["kinds"] == "P1"]
            assert np.isfinite(exact).any(axis=(1, 2)).all()  # every P1 event has exact nominees
            assert np.isnan(attr["exact"][attr["kinds"] == "P2"]).all()
        assert n_events == sum(1 for _ in open(out / note / "events.jsonl"))
    sets = json.loads((out / "head_sets_contrast.json").read_text())
    assert set(sets["phases"]) >= {"P1", "P2"} and sets["n_layers"] == 2 and sets["n_heads"] == 4
    ranked = [r["ic"] for r in sets["phases"]["P1"]]
    assert ranked == sorted(ranked, reverse=True) and len(ranked) == 8
    weights = [r["weight"] for r in sets["phases"]["P1"] if r["weight"] is not None]
    assert len(weights) == 4 and abs(sum(weights) - 1) < 1e-9 and weights == sorted(weights, reverse=True)
    assert "provenance" in sets and "code_version" in sets["provenance"]


def test_knocking_in_all_heads_restores_the_clean_margin_at_every_event(world):
    tmp_path, cfg, params, events, calibration, faithfulness, _ = world
    n_knocked = 0
    for note in ("note0", "note1", "note2"):
        with np.load(tmp_path / "HD-001" / note / "attr.npz") as attr:
            # the attribution pass's clean margins: the same events in other batches, with gradients
            attribution_margin = dict(zip(attr["positions"].tolist(), attr["margin"].tolist()))
        for row in map(json.loads, open(tmp_path / "HD-001" / note / "patch2.jsonl")):
            assert abs(row["margin_clean"] - attribution_margin[row["pos"]]) < 1e-4
            if row.get("margin_all") is not None:
                assert abs(row["margin_all"] - row["margin_clean"]) < 1e-4
                n_knocked += 1
                assert set(row["knockin"]) == {"top", "random", "bottom", "own"}
    assert n_knocked > 5
    assert faithfulness["phases"]["P1"]["all_heads_minus_clean_max_abs"] < 1e-4
    # the exact P2C refinement: every P2C event's nominees (top-3 by |A| + global top-2) patched exactly
    refinement = faithfulness["p2c_exact_refinement"]
    assert refinement["n_events"] == events["counts"]["P2C"]
    assert 3 <= refinement["nominated_heads_mean"] <= 5


def test_passes_resume_and_recompute_a_corrupt_artifact(world, qwen_model, tokenizer, capsys):
    tmp_path, cfg, params, *_ = world
    out = tmp_path / "HD-001"
    before = (out / "note1" / "attr.npz").read_bytes()
    data = (out / "note0" / "attr.npz").read_bytes()
    (out / "note0" / "attr.npz").write_bytes(data[: len(data) // 2])  # a killed run's half file
    leftovers = [out / "note0" / ".attr.npz.k1ll3d.tmp", out / "note0" / ".attr.npz.meta.json.k1ll3d.tmp"]
    for leftover in leftovers:                                          # what a SIGKILLed writer leaves
        leftover.write_bytes(b"partial")
    assert artifact_state(out / "note0" / "attr.npz") == "checksum mismatch"
    run_attribution(cfg, params, model=qwen_model, tokenizer=tokenizer)
    assert not any(leftover.exists() for leftover in leftovers)
    err = capsys.readouterr().err
    assert "note0/attr.npz is corrupt" in err and "1 computed, 2 already done" in err
    assert artifact_state(out / "note0" / "attr.npz") == "valid"
    assert (out / "note1" / "attr.npz").read_bytes() == before
    (out / "note2" / "events.jsonl.meta.json").unlink()  # finished writing, never marked complete
    run_events(cfg, params, model=qwen_model, tokenizer=tokenizer)
    err = capsys.readouterr().err
    assert "note2/events.jsonl is corrupt (unfinished" in err and "1 computed, 2 already done" in err


def test_selftest_reports_fidelity_for_both_hooks(world):
    summary = world[-1]
    assert summary["n_events"] == 2 and summary["n_heads"] == 8
    assert summary["forward_margin_noise_sd"] < 1e-5  # CPU forwards repeat exactly
    for hook in ("intact", "detached"):
        assert -1 <= summary[hook]["pearson"] <= 1
    assert summary["intact"]["pearson"] > 0.5  # first-order with the graph intact tracks exact effects


def test_changed_parameters_make_artifacts_stale(world, qwen_model, tokenizer, capsys):
    import dataclasses

    tmp_path, cfg, params, *_ = world
    changed = dataclasses.replace(cfg, n_null=5)
    run_events(changed, params, model=qwen_model, tokenizer=tokenizer, limit=1)
    err = capsys.readouterr().err
    assert "note0/events.jsonl is stale" in err and "1 computed" in err
    run_events(cfg, params, model=qwen_model, tokenizer=tokenizer, limit=1)  # back as it was


def test_a_changed_trace_makes_its_artifacts_stale(tmp_path, qwen_model, tokenizer, capsys):
    from tests.instrument.conftest import _write_world

    cfg = _write_world(tmp_path)
    params = {"profile": "test"}
    kw = dict(model=qwen_model, tokenizer=tokenizer)
    run_events(cfg, params, **kw)
    run_attribution(cfg, params, **kw)
    rows = [json.loads(line) for line in open(cfg.traces)]
    rows[1]["completion"] = rows[1]["completion"].replace("E11.65", "E11.9")
    write_jsonl(cfg.traces, rows)
    capsys.readouterr()
    run_events(cfg, params, **kw)
    run_attribution(cfg, params, **kw)
    err = capsys.readouterr().err
    assert "note1/events.jsonl is stale (its inputs changed)" in err
    assert "note1/attr.npz is stale (its inputs changed)" in err
    assert "note0/attr.npz" not in err  # notes before the change keep their artifacts


def test_the_intact_rerun_patches_p2_exactly_on_the_first_notes(world, qwen_model, tokenizer):
    """App. C's re-run: graph intact, exact patches at P2 (none at P1), its own directory and calibration."""
    import pytest

    from mistill.errors import UserError
    from mistill.instrument.intact import IntactRerun, run_intact

    tmp_path, cfg, params, *_ = world
    section = {"out_dir": str(tmp_path / "HD-001-intact"), "notes": 2, "nominees_topk": 3,
               "nominees_global_topk": 2, "exact_kinds": ["P2"]}
    summary = run_intact(cfg, {**params, "intact_rerun": section}, model=qwen_model, tokenizer=tokenizer)
    assert set(summary["phases"]) >= {"P1", "P2"}
    done = sorted(p.parent.name for p in (tmp_path / "HD-001-intact").glob("*/attr.npz"))
    assert done == ["note0", "note1"]                       # the first two notes of the corpus, no more
    with np.load(tmp_path / "HD-001-intact" / "note0" / "attr.npz") as intact, \
            np.load(tmp_path / "HD-001" / "note0" / "attr.npz") as detached:
        p2, p1 = intact["kinds"] == "P2", intact["kinds"] == "P1"
        assert p2.any() and np.isnan(intact["exact"][p1]).all()
        patched = np.isfinite(intact["exact"][p2]).reshape(p2.sum(), -1).sum(axis=1)
        assert (patched >= 3).all() and (patched <= 5).all()  # the event's top-3 plus the global top-2
        # the two hooks agree on the last layer's heads (nothing lies downstream of them) and differ before
        last = np.abs(intact["first_order"][:, -1] - detached["first_order"][:, -1]).max()
        earlier = np.abs(intact["first_order"][:, 0] - detached["first_order"][:, 0]).max()
        assert last < 1e-4 < earlier
    meta = json.loads((tmp_path / "HD-001-intact" / "note0" / "attr.npz.meta.json").read_text())
    assert meta["hook"] == "intact" and meta["exact_kinds"] == ["P2"]
    with pytest.raises(UserError, match="nominees_topk: a positive count"):
        IntactRerun.from_params({"intact_rerun": {**section, "nominees_topk": 0}})
    with pytest.raises(UserError, match="exact_kinds: unknown kinds"):
        IntactRerun.from_params({"intact_rerun": {**section, "exact_kinds": ["P3"]}})
    with pytest.raises(UserError, match="intact_rerun: missing"):
        IntactRerun.from_params({})
