"""The isolation pass (App. D): against plain forwards on the demo teacher, its limiting cases, the knock-in
pass's own-ranking necessity on the same events, the aggregation by hand, and R-C3's keys."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from mistill.errors import UserError
from mistill.instrument.events import Event
from mistill.instrument.hook import HeadHook
from mistill.instrument.isolation import (
    IsolationSettings,
    isolation_note,
    load_isolation,
    own_top_masks,
    run_isolation,
    summarize,
)
from mistill.instrument.knockin import head_set_masks
from mistill.io import write_json
from mistill.models.loading import load_model
from mistill.params import load_params
from mistill.repro.reader_module import load_reader
from mistill.repro.text_fields import statistic_problem
from tests.repro.repro_helpers import REPO

torch.set_num_threads(1)
TOL = 1e-4   # nats: a cached, batched forward against a full one in float32


@pytest.fixture(scope="module")
def demo_teacher():
    model, _ = load_model(REPO / "models" / "demo" / "teacher", device="cpu")
    return model


def _note(vocab: int, seed: int = 0, n: int = 72):
    """Random token ids and three P1 events on them: the emitted token against four competitors."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n,), generator=g).tolist()
    events = []
    for pos in (n - 1, 41, 23):
        competitors = [t for t in torch.randint(0, vocab, (6,), generator=g).tolist() if t != ids[pos]][:4]
        events.append(Event("P1", pos, ids[pos], competitors, 0))
    events.insert(1, Event("P2", 30, ids[30], [ids[29]], 0))   # another phase: not isolated
    return ids, events


def _head_outputs(model, ids) -> list[torch.Tensor]:
    """Each layer's o_proj input [T, H, D] over a plain forward of `ids`."""
    cfg = model.config
    seen = []
    handles = [layer.self_attn.o_proj.register_forward_pre_hook(
        lambda module, args: seen.append(args[0][0].reshape(len(ids), cfg.num_attention_heads, cfg.head_dim)))
        for layer in model.model.layers]
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return seen


def _plain_margin(model, ids, event, ablate: torch.Tensor, mu: torch.Tensor) -> float:
    """The event's margin from a full forward of ids[:pos], the heads of `ablate` [L, H] set to their means
    at the last position by hooks of this test's own."""
    cfg = model.config

    def replace(layer):
        def hook(module, args):
            z = args[0].clone().view(1, -1, cfg.num_attention_heads, cfg.head_dim)
            z[0, -1, ablate[layer]] = mu[layer][ablate[layer]]
            return (z.view(args[0].shape),)
        return hook

    handles = [layer.self_attn.o_proj.register_forward_pre_hook(replace(i))
               for i, layer in enumerate(model.model.layers)]
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids[:event.pos]]), use_cache=False).logits[0, -1].double()
    finally:
        for h in handles:
            h.remove()
    return float(logits[event.target_id] - torch.logsumexp(logits[event.competitor_ids], 0))


def test_isolation_and_necessity_equal_plain_forwards_on_the_demo_teacher(demo_teacher):
    model = demo_teacher
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    ids, events = _note(model.config.vocab_size)
    own = np.random.default_rng(0).normal(size=L * H)
    bins = [3, 8, 16]
    hook = HeadHook(model)
    try:
        arrays = isolation_note(model, hook, ids, events, own, bins, max_batch=5)   # forwards mix events
    finally:
        hook.remove()
    mu = torch.stack([z.mean(0) for z in _head_outputs(model, ids)])           # [L, H, D]: the note's means
    p1 = [e for e in events if e.kind == "P1"]
    assert arrays["positions"].tolist() == [e.pos for e in p1]
    order = np.argsort(-own, kind="stable")
    nothing = torch.zeros(L, H, dtype=torch.bool)
    for i, event in enumerate(p1):
        clean = _plain_margin(model, ids, event, nothing, mu)
        assert abs(arrays["margin_clean"][i] - clean) < TOL
        for j, k in enumerate(bins):
            top = torch.zeros(L * H, dtype=torch.bool)
            top[order[:k]] = True
            top = top.view(L, H)
            assert abs(arrays["margin_isolated"][i, j] - _plain_margin(model, ids, event, ~top, mu)) < TOL
            assert abs(arrays["margin_ablated"][i, j] - _plain_margin(model, ids, event, top, mu)) < TOL
    # heads matter on this teacher, so the comparisons could fail
    assert np.abs(arrays["margin_isolated"] - arrays["margin_clean"][:, None]).max() > 1.0
    assert np.abs(arrays["margin_ablated"] - arrays["margin_clean"][:, None]).min() > 1e-3


def test_no_head_and_every_head_are_the_limits(demo_teacher):
    """k = 0: necessity 0 and isolation = every head ablated; k = every head: isolation share 1 and necessity =
    every head ablated.  The two sets of one k are complements, so the limits swap."""
    model = demo_teacher
    n = model.config.num_hidden_layers * model.config.num_attention_heads
    ids, events = _note(model.config.vocab_size, seed=1)
    hook = HeadHook(model)
    try:
        arrays = isolation_note(model, hook, ids, events, np.random.default_rng(1).normal(size=n), [0, n])
    finally:
        hook.remove()
    clean = arrays["margin_clean"]
    assert np.allclose(arrays["margin_ablated"][:, 0], clean, atol=1e-5)      # nothing removed
    assert np.allclose(arrays["margin_isolated"][:, 1], clean, atol=1e-5)     # everything kept: share 1
    assert np.allclose(arrays["margin_isolated"][:, 0], arrays["margin_ablated"][:, 1], atol=1e-5)
    assert np.abs(arrays["margin_isolated"][:, 0] - clean).min() > 1e-2      # ablating every head matters


def test_own_top_sets_are_the_knockin_pass_own_ranking_sets():
    rng = np.random.default_rng(3)
    own = rng.integers(0, 4, size=24).astype(float)          # ties: both passes break them the same way
    masks = head_set_masks(phase="P1", note_id="n", bins=[2, 5, 12], global_scores=rng.normal(size=24),
                           own_scores=own, n_layers=4, n_heads=6, seed=0)
    ours = own_top_masks(own, [2, 5, 12], 4, 6)
    for k in (2, 5, 12):
        assert torch.equal(ours[k], masks[("own", k)])


def test_summary_is_the_median_over_notes_of_per_note_means_by_hand():
    def note(clean, isolated, ablated):
        return {"bins": np.array([2, 5]), "margin_clean": np.array(clean, dtype=float),
                "margin_isolated": np.array(isolated, dtype=float), "margin_ablated": np.array(ablated, dtype=float)}

    notes = {"a": note([4.0, 2.0, 0.0], [[-2.0, 4.0], [1.0, 2.0], [3.0, 3.0]], [[2.0, -4.0], [2.0, 0.0], [1.0, 1.0]]),
             "b": note([5.0], [[5.0, 5.0]], [[0.0, 5.0]]),
             "c": note([-1.0], [[1.0, -1.0]], [[-2.0, -1.0]])}
    out = summarize(notes, [2, 5])
    assert (out["n_notes"], out["n_events"], out["zero_clean_margin_events"]) == (3, 4, 1)
    k2, k5 = out["by_k"]["2"], out["by_k"]["5"]
    # share at k=2: a mean(-0.5, 0.5) = 0, b 1, c -1 -> 0; at k=5: a mean(1, 1) = 1, b 1, c 1 -> 1
    assert k2["isolation_share"]["median"] == 0.0 and k5["isolation_share"]["median"] == 1.0
    # necessity at k=2: a mean(0.5, 0) = 0.25, b 1, c (-1 + 2) / -1 = -1 -> 0.25; at k=5: a mean(2, 1), b 0, c 0
    assert k2["necessity"]["median"] == 0.25 and k5["necessity"]["median"] == 0.0
    with pytest.raises(UserError, match="rerun the isolation pass"):
        summarize(notes, [2, 6])


def test_settings_come_from_params_and_bad_ones_are_named():
    for profile in ("demo", "paper", "rehearsal"):
        settings = IsolationSettings.from_params(load_params(REPO / "params.yaml", profile=profile))
        assert settings.bins == tuple(sorted(set(settings.bins))) and settings.out_dir
    for section, message in (({"out_dir": "x", "bins": [8, 3]}, "increasing"), ({"out_dir": "x", "bins": []}, "bins"),
                             ({"out_dir": "x", "bins": [3], "k": 1}, "unknown keys k"), ({"bins": [3]}, "out_dir")):
        with pytest.raises(UserError, match=message):
            IsolationSettings.from_params({"isolation": section})
    with pytest.raises(UserError, match="isolation: missing"):
        IsolationSettings.from_params({})


def test_the_pass_agrees_with_the_knockin_pass_and_resumes(world, qwen_model, tokenizer, capsys):
    """The necessity of the own top-k is the knock-in pass's own-ranking necessity at the same events."""
    tmp_path, cfg, params, *_ = world
    out = tmp_path / "isolation-of-this-test"   # the world is shared: another test may isolate it too
    params = {**params, "isolation": {"out_dir": str(out), "bins": [2, 4]}}
    summary = run_isolation(cfg, params, model=qwen_model, tokenizer=tokenizer)
    assert summary["n_notes"] == 3 and set(summary["by_k"]) == {"2", "4"}
    assert json.loads((out / "isolation.json").read_text())["bins"] == [2, 4]
    err = capsys.readouterr().err
    assert "note bad_unknown skipped" in err and "3 computed, 0 already done, 2 skipped" in err
    compared = 0
    for note in ("note0", "note1", "note2"):
        arrays = load_isolation(out / note / "isolation.npz")
        rows = [json.loads(line) for line in open(tmp_path / "HD-001" / note / "patch2.jsonl")]
        rows = [r for r in rows if r["kind"] == "P1"]
        assert arrays["positions"].tolist() == [r["pos"] for r in rows]
        for i, row in enumerate(rows):
            assert abs(arrays["margin_clean"][i] - row["margin_clean"]) < TOL
            for j, k in enumerate((2, 4)):
                assert abs(arrays["margin_ablated"][i, j] - row["necessity"]["own"][str(k)]) < TOL
                compared += 1
    assert compared > 10
    run_isolation(cfg, params, model=qwen_model, tokenizer=tokenizer)
    assert "0 computed, 3 already done" in capsys.readouterr().err
    changed = {**params, "isolation": {"out_dir": str(out), "bins": [2, 8]}}
    run_isolation(cfg, changed, model=qwen_model, tokenizer=tokenizer, limit=1)
    err = capsys.readouterr().err
    assert "note0/isolation.npz is stale" in err and "1 computed" in err


def test_r_c3_names_its_isolation_keys_by_the_bins_and_reads_the_summary(tmp_path):
    module = load_reader(REPO / "readers" / "r_c3.py")
    paper = load_params(REPO / "params.yaml", profile="paper")
    assert {"isolation_necessity_bins_k3_to_k100", "isolation_margin_share_bins_k3_to_k100"} <= set(module.keys(paper))
    params = copy.deepcopy(paper)
    params["isolation"] = {"out_dir": str(tmp_path), "bins": [2, 5]}
    notes = {n: {"bins": np.array([2, 5]), "margin_clean": np.array([2.0]), "margin_isolated": np.array([[-1.0, 1.0]]),
                 "margin_ablated": np.array([[1.0, 0.0]])} for n in ("a", "b")}
    write_json(tmp_path / "isolation.json", summarize(notes, [2, 5]))
    values, inputs = module.isolation_values(params)
    assert values["isolation_necessity_bins_k2_to_k5"]["value"] == [0.5, 1.0]
    assert values["isolation_margin_share_bins_k2_to_k5"]["value"] == [-0.5, 0.5]
    assert all(statistic_problem(v["statistic"]) is None for v in values.values())
    assert inputs == [tmp_path / "isolation.json"]
    # params without an isolation pass (R-C15's second teacher's run, read through this reader): no such keys
    bare = {k: v for k, v in params.items() if k != "isolation"}
    assert module.isolation_values(bare) == ({}, [])
    assert not [k for k in module.keys(bare) if k.startswith("isolation_")]
    params["isolation"]["bins"] = [2, 8]
    with pytest.raises(UserError, match="rerun the isolation pass"):
        module.isolation_values(params)
