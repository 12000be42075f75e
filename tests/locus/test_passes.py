"""The locus passes end to end on a tiny random teacher: probe, calibrate, ablate, follow and swap resume per note."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mistill.instrument.passes import artifact_state
from mistill.io import read_json, write_json
from mistill.locus.passes import (
    LocusSettings,
    run_ablate,
    run_calibrate,
    run_follow,
    run_probe,
    run_swap,
)


@pytest.fixture(scope="module")
def locus_run(prompt_world, qwen_model, tokenizer, tmp_path_factory):
    tmp_path, cfg, params = prompt_world
    out = tmp_path_factory.mktemp("locus")
    # theta -1.5: this random teacher's forced margins sit near -1.4; at -1.5 the walk-back meets every outcome,
    # and one note holds window-decided mentions of two chapters (a swap's target and donor)
    settings = LocusSettings(out_dir=str(out / "HD-001-locus"), shortlist_out_dir=str(out / "HD-002-locus"),
                             follow_out_dir=str(out / "HD-001-follow"), min_forced_drop=0.0,
                             suffix="\nSo the code here is", letter_prefix=" ", theta=-1.5, step=8, max_back=64,
                             extra_steps=2, window=12, k=(2, 4), overlap_k=(2, 4), layers=(0, 1), pool_k=4,
                             max_batch=8, attribution_batch=4, suffix_leader="l1h0")
    params = {**params, "locus": {**dataclasses.asdict(settings),
                                  "swap": {"out_dir": str(out / "HD-001-swap"), "layers": [0, 1], "tail": 4}}}
    kw = dict(model=qwen_model, tokenizer=tokenizer)
    counts = {"probe": run_probe(cfg, settings, params, **kw)}
    run_calibrate(cfg, settings, params)
    counts.update(ablate=run_ablate(cfg, settings, params, **kw), follow=run_follow(cfg, settings, params, **kw),
                  swap=run_swap(cfg, settings, params, **kw))
    return cfg, settings, params, out, counts


def test_every_pass_writes_every_note(locus_run):
    cfg, settings, params, out, counts = locus_run
    assert counts == {"probe": 3, "ablate": 3, "follow": 3, "swap": 3}
    outcomes = {m["outcome"] for n in ("note0", "note1", "note2")
                for m in read_json(out / "HD-001-locus" / n / "locus.json", "locus")["mentions"]}
    assert {"window", "inherited", "never"} <= outcomes
    assert sum(len(read_json(out / "HD-001-swap" / n / "swap.json", "swap")["mentions"]) for n in ("note0", "note1",
                                                                                                  "note2")) >= 2
    for note in ("note0", "note1", "note2"):
        locus = read_json(out / "HD-001-locus" / note / "locus.json", "locus")
        assert locus["n_layers"] == 2 and locus["mentions"]
        swap = read_json(out / "HD-001-swap" / note / "swap.json", "swap")
        assert swap["layers"] == [0, 1] and swap["tail"] == 4
        window = {m["event"] for m in locus["mentions"] if m["outcome"] == "window"}
        assert {r["event"] for r in swap["mentions"]} <= window
        for row in swap["mentions"]:
            assert len(row["forced"]["tail"]) == len(row["natural"]["code"]) == 2
            # after the last layer the tail's residual reaches nothing the forced margin reads
            assert row["forced"]["tail"][1][0] == pytest.approx(row["forced"]["clean"][0], abs=1e-4)
    sets = read_json(out / "HD-001-locus" / "head_sets_locus.json", "sets")
    assert set(sets["phases"]) == {"prose", "suffix"}


def test_passes_resume_and_a_new_calibration_file_alone_redoes_nothing(locus_run, qwen_model, tokenizer, capsys):
    cfg, settings, params, out, _ = locus_run
    kw = dict(model=qwen_model, tokenizer=tokenizer)
    # the same rankings written again with other provenance (a later commit): the ablations and follow-through stay
    path = out / "HD-001-locus" / "head_sets_locus.json"
    body = json.loads(path.read_text())
    write_json(path, {**body, "provenance": {"code_version": "another commit"}})
    assert run_ablate(cfg, settings, params, **kw) == 0 and run_follow(cfg, settings, params, **kw) == 0
    assert run_probe(cfg, settings, params, **kw) == 0 and run_swap(cfg, settings, params, **kw) == 0
    # a killed swap pass's half file is recomputed, alone
    swap = out / "HD-001-swap" / "note1" / "swap.json"
    swap.write_bytes(swap.read_bytes()[:20])
    assert artifact_state(swap) == "checksum mismatch"
    capsys.readouterr()
    assert run_swap(cfg, settings, params, **kw) == 1
    assert artifact_state(swap) == "valid"
    # another grid is another swap: every note again
    params = {**params, "locus": {**params["locus"], "swap": {**params["locus"]["swap"], "layers": [1]}}}
    assert run_swap(cfg, settings, params, **kw) == 3
