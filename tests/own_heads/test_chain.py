"""The own-heads chain on tiny random Qwen3 / SmolLM3 students: realised events, the student's own ranking,
knock-in against brute force, the all-heads check, the random floor and resumability."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from own_heads_world import tiny_qwen3, tiny_smollm3, write_world

from mistill.errors import UserError
from mistill.evaluate.own_heads import OwnHeadsConfig, readside_panels, realize_note_events, run_chain
from mistill.instrument.hook import HeadHook
from mistill.instrument.margin import margin
from mistill.instrument.passes import Trace, load_events, model_input
from mistill.instrument.patching import brute_force_logits, forward_variants_chunked, prefill
from mistill.io import read_jsonl


@pytest.fixture(scope="module")
def chain(tmp_path_factory, teacher_tokenizer, smol_tokenizer):
    root = tmp_path_factory.mktemp("own_heads")
    params = write_world(root, teacher_tokenizer)
    # random tiny models barely tell one note's context from another's: hardly an event clears 1 nat
    params["instrument"]["knockin"]["min_range"] = 1e-3
    students = {"qwen": (tiny_qwen3(teacher_tokenizer.vocab_size, seed=3), teacher_tokenizer),
                "smol": (tiny_smollm3(smol_tokenizer.vocab_size, seed=4), smol_tokenizer)}
    timings = {arm: run_chain("unused", arm, 0, params, model=m, tokenizer=t, teacher_tokenizer=teacher_tokenizer)
               for arm, (m, t) in students.items()}
    return root, params, students, timings


def test_chain_writes_every_artifact(chain):
    root, _, students, timings = chain
    for arm, (model, _) in students.items():
        assert set(timings[arm]) == {"attribute", "knockin", "readside", "edits"}
        sets = json.loads((root / "HD-S" / f"{arm}-s0" / "head_sets_contrast.json").read_text())
        assert (sets["n_layers"], sets["n_heads"]) == (model.config.num_hidden_layers,
                                                       model.config.num_attention_heads)
        assert set(sets["phases"]) >= {"P1", "P2C"}
        m6 = root / "M6" / f"{arm}-s0"
        faith = json.loads((m6 / "faithfulness2.json").read_text())
        assert faith["bins"] == [2, 4, 8] and len(faith["notes"]) == 4
        assert json.loads((m6 / "readside.json").read_text())["k"] == 3
        # wall time lies beside each output directory, out of its hashed bytes
        assert not (m6 / "timing.json").exists() and not (root / "HD-S" / f"{arm}-s0" / "timing.json").exists()
        assert set(json.loads((root / "timing" / f"M6-{arm}-s0.json").read_text())["seconds"]) == {"knockin",
                                                                                                   "readside"}
        assert set(json.loads((root / "timing" / f"M6-edits-{arm}-s0.json").read_text())["seconds"]) == {"edits"}
        assert set(json.loads((root / "timing" / f"HD-S-{arm}-s0.json").read_text())["seconds"]) == {"attribute"}
        for note in faith["notes"]:
            assert (m6 / note / "patch2.jsonl").exists() and (m6 / note / "readside.jsonl").exists()
            # the edits in their own directory, beside the realised events they were read at
            assert (root / "M6-edits" / f"{arm}-s0" / note / "prefix_edit.jsonl").exists()
            assert not (m6 / note / "prefix_edit.jsonl").exists()


def test_student_edits_equal_a_brute_force_forward_and_use_the_own_top2(chain):
    """The edits on a student: the identity re-feed is the clean teacher-forced margin, a replacement's margin
    a full forward of the edited input, the mediation heads the arm's own P2C top-2."""
    from mistill.instrument.edits import NoteInput, with_near_miss_spans
    from mistill.instrument.global_sets import load_head_sets, phase_scores

    root, _, students, _ = chain
    checked = 0
    for arm, (model, tok) in students.items():
        m6 = root / "M6-edits" / f"{arm}-s0"
        sets = load_head_sets(root / "HD-S" / f"{arm}-s0" / "head_sets_contrast.json")
        top2 = np.argsort(-phase_scores(sets, "P2C"), kind="stable")[:2]
        summary = json.loads((m6 / "prefix_edit.json").read_text())
        assert summary["mediation_heads"] == [f"l{h // sets['n_heads']}h{h % sets['n_heads']}" for h in top2]
        hook = HeadHook(model)
        try:
            for note in summary["notes"]:
                trace = Trace(**{k: v for k, v in json.loads(
                    next(line for line in (root / "TR-008" / "traces.jsonl").read_text().splitlines()
                         if f'"{note}"' in line)).items()})
                info = NoteInput.from_trace(tok, trace)
                events = {e.pos: e for e in with_near_miss_spans(info, load_events(m6 / note / "events.jsonl"))}
                for row in read_jsonl(m6 / note / "prefix_edit.jsonl"):
                    e, q = events[row["pos"]], row["pos"] - 1
                    clean = brute_force_logits(model, hook, info.ids[:q], info.ids[q], None, None)
                    assert row["margin_identity"] == pytest.approx(float(margin(clean, e.target_id, e.competitor_ids)),
                                                                   abs=1e-4)
                    s, t = row["edit_start"], row["edit_end"]
                    assert [s, t] == e.n_pos[-1]
                    filler = [tok.encode(" .").ids[0]] * (t - s)
                    edited = [*info.ids[:s], *filler, *info.ids[t:q]]
                    logits = brute_force_logits(model, hook, edited, info.ids[q], None, None)
                    assert row["margin"]["filler"] == pytest.approx(
                        float(margin(logits, e.target_id, e.competitor_ids)), abs=1e-4)
                    checked += 1
        finally:
            hook.remove()
    assert checked > 0


def test_smollm3_drops_events_inside_merged_digit_runs(chain, teacher_tokenizer, smol_tokenizer):
    """App. I.1: an event is kept only where the student's next token begins at the anchor."""
    root, *_ = chain
    teacher = read_jsonl(root / "TR-008" / "events" / "note0" / "events.jsonl")
    trace = Trace(**read_jsonl(root / "TR-008" / "traces.jsonl")[0])
    for tok, fewer in ((teacher_tokenizer, False), (smol_tokenizer, True)):
        text, ids, offsets, at = model_input(tok, trace)
        _, events = realize_note_events(teacher, teacher_tokenizer, tok, trace)
        kept = [e for e in events if e.kind != "NULL"]
        decided = [(e.anchor, e.kind) for e in kept]
        assert (len(kept) < sum(e["kind"] != "NULL" for e in teacher)) == fewer
        for e in events:
            s, end = offsets[e.pos]
            assert text[s:end].strip() and s <= at + e.anchor < end  # the decided token begins at the anchor
            assert text[s:at + e.anchor].strip() == ""
            assert ids[e.pos] == e.target_id or e.kind == "NULL"
        assert len(set(decided)) == len(decided)


def test_all_heads_knock_in_returns_the_clean_margin_at_every_event(chain):
    root, _, students, _ = chain
    for arm in students:
        rows = [r for p in (root / "M6" / f"{arm}-s0").glob("*/patch2.jsonl") for r in read_jsonl(p)]
        assert len(rows) > 20
        for r in rows:
            assert r["margin_all"] == pytest.approx(r["margin_clean"], abs=1e-4)
        faith = json.loads((root / "M6" / f"{arm}-s0" / "faithfulness2.json").read_text())
        for phase in faith["phases"].values():
            assert phase["all_heads_minus_clean_max_abs"] < 1e-4


def test_knock_in_margins_equal_a_brute_force_forward(chain):
    """Own top-k knocked into the donor's context: the batched cached path against a full forward."""
    root, _, students, _ = chain
    model, tok = students["smol"]
    hook = HeadHook(model)
    try:
        traces = {t["note_id"]: Trace(**t) for t in read_jsonl(root / "TR-008" / "traces.jsonl")}
        sets = json.loads((root / "HD-S" / "smol-s0" / "head_sets_contrast.json").read_text())
        top = [(r["layer"], r["head"]) for r in sets["phases"]["P2C"][:4]]
        rows = read_jsonl(root / "M6" / "smol-s0" / "note0" / "patch2.jsonl")
        row = next(r for r in rows if r["kind"] == "P2C" and r["donor_pos"] is not None)
        _, ids, _, _ = model_input(tok, traces["note0"])
        _, donor_ids, _, _ = model_input(tok, traces[row["donor_note"]])
        ev = next(e for e in load_events(root / "M6" / "smol-s0" / "note0" / "events.jsonl") if e.pos == row["pos"])
        q, qd = ev.pos - 1, row["donor_pos"] - 1
        with torch.no_grad(), hook.recording() as rec:
            model(input_ids=torch.tensor([ids[: q + 1]]), use_cache=False)
        recorded = torch.stack([r[0, q] for r in rec])
        mask = torch.zeros(hook.n_layers, hook.n_heads, dtype=torch.bool)
        for layer, head in top:
            mask[layer, head] = True
        logits = brute_force_logits(model, hook, donor_ids[:qd], ids[q], mask, recorded)
        assert float(margin(logits, ev.target_id, ev.competitor_ids)) == pytest.approx(row["knockin"]["top"]["4"],
                                                                                        abs=1e-4)
        corr = brute_force_logits(model, hook, donor_ids[:qd], ids[q], None, None)
        assert float(margin(corr, ev.target_id, ev.competitor_ids)) == pytest.approx(row["margin_corr"], abs=1e-4)
    finally:
        hook.remove()


def test_random_sets_rise_from_the_empty_floor_to_all_heads(chain):
    """Every subset of the 8 heads knocked in at one event: the empty set is the corrupted margin
    (recovery 0, the floor), all heads the clean one (1), and the mean over count-matched random
    sets rises with the count between them."""
    root, _, students, _ = chain
    model, tok = students["qwen"]
    hook = HeadHook(model)
    try:
        traces = {t["note_id"]: Trace(**t) for t in read_jsonl(root / "TR-008" / "traces.jsonl")}
        rows = read_jsonl(root / "M6" / "qwen-s0" / "note1" / "patch2.jsonl")
        events = {e.pos: e for e in load_events(root / "M6" / "qwen-s0" / "note1" / "events.jsonl")}
        _, ids, _, _ = model_input(tok, traces["note1"])
        means = []
        for row in [r for r in rows if r["donor_pos"] is not None][:4]:
            ev = events[row["pos"]]
            q = ev.pos - 1
            clean = prefill(model, hook, ids)
            with torch.no_grad(), hook.recording() as rec:
                forward_variants_chunked(model, hook, clean.cache, q, ids[q],
                                         torch.zeros(hook.n_layers, 1, hook.n_heads, dtype=torch.bool), clean.mu, 1)
            recorded = torch.stack([r[0, 0] for r in rec])
            _, donor_ids, _, _ = model_input(tok, traces[row["donor_note"]])
            donor = prefill(model, hook, donor_ids)
            n = hook.n_layers * hook.n_heads
            subsets = [s for k in range(n + 1) for s in itertools.combinations(range(n), k)]
            mask = torch.zeros(hook.n_layers, len(subsets), hook.n_heads, dtype=torch.bool)
            for b, s in enumerate(subsets):
                for h in s:
                    mask[h // hook.n_heads, b, h % hook.n_heads] = True
            with torch.no_grad():
                logits = forward_variants_chunked(model, hook, donor.cache, row["donor_pos"] - 1, ids[q], mask,
                                                  recorded, 64)
            m = margin(logits, ev.target_id, ev.competitor_ids).numpy()
            assert m[0] == pytest.approx(row["margin_corr"], abs=1e-4)
            assert m[-1] == pytest.approx(row["margin_clean"], abs=1e-4)
            recovery = (m - m[0]) / (m[-1] - m[0])
            sizes = np.array([len(s) for s in subsets])
            means.append([recovery[sizes == k].mean() for k in range(n + 1)])
        curve = np.mean(means, axis=0)
        assert curve[0] == 0.0 and curve[-1] == pytest.approx(1.0)
        assert np.all(np.diff(curve) > 0)
    finally:
        hook.remove()


def test_second_run_recomputes_nothing(chain):
    root, params, students, _ = chain
    model, tok = students["qwen"]
    m6 = root / "M6" / "qwen-s0"
    before = {p: p.stat().st_mtime_ns for p in m6.glob("*/*.jsonl")}
    run_chain("unused", "qwen", 0, params, stages=("knockin", "readside"), model=model, tokenizer=tok,
              teacher_tokenizer=tok)
    assert {p: p.stat().st_mtime_ns for p in m6.glob("*/*.jsonl")} == before


def test_changed_weights_or_head_sets_are_recomputed(chain):
    root, params, students, _ = chain
    model, tok = students["smol"]
    m6, hd = root / "M6" / "smol-s0", root / "HD-S" / "smol-s0"
    before = {p: p.stat().st_mtime_ns for p in m6.glob("*/patch2.jsonl")}
    sets = json.loads((hd / "head_sets_contrast.json").read_text())
    for row in sets["phases"]["P2C"]:  # another ranking (the key reads the scores, not the file's bytes)
        row["ic"] = -row["ic"]
    (hd / "head_sets_contrast.json").write_text(json.dumps(sets))
    run_chain("unused", "smol", 0, params, stages=("knockin",), model=model, tokenizer=tok,
              teacher_tokenizer=students["qwen"][1])
    after = {p: p.stat().st_mtime_ns for p in m6.glob("*/patch2.jsonl")}
    assert set(after) == set(before) and all(after[p] != before[p] for p in before)
    rs_before = {p: p.stat().st_mtime_ns for p in m6.glob("*/readside.jsonl")}
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.mul_(1.01)
    try:
        run_chain("unused", "smol", 0, params, stages=("readside",), model=model, tokenizer=tok,
                  teacher_tokenizer=students["qwen"][1])
    finally:
        with torch.no_grad():
            model.model.layers[0].self_attn.q_proj.weight.div_(1.01)
    assert all(p.stat().st_mtime_ns != t for p, t in rs_before.items())


def test_readside_panels_are_the_own_top_k_and_a_seeded_random_draw():
    scores = {"P2C": np.array([0.1, 0.9, -0.2, 0.5, 0.3, 0.0])}
    panels = readside_panels(scores, 3, 2, 3, seed=0, phases=("P1", "P2C"))
    assert list(panels) == ["P2C"] and panels["P2C"]["top"] == [1, 3, 4]
    assert len(set(panels["P2C"]["random"])) == 3
    assert readside_panels(scores, 3, 2, 3, seed=0, phases=("P2C",)) == panels


def test_bad_stage_and_missing_params_are_user_errors(chain):
    _, params, students, _ = chain
    with pytest.raises(UserError, match="unknown own-heads stage"):
        run_chain("unused", "qwen", 0, params, stages=("attribute", "nope"), model=students["qwen"][0],
                  tokenizer=students["qwen"][1], teacher_tokenizer=students["qwen"][1])
    with pytest.raises(UserError, match="own_heads"):
        OwnHeadsConfig.from_params({"evaluate": {}})


def test_m1_at_null_events_is_the_plain_forwards_margin_and_leaves_the_decisions_alone(chain, teacher_tokenizer):
    """M1's NULL control: each realised NULL event's margin from a plain forward of the student's own
    tokenization (the own-heads realisation, an independent path); the decisions' numbers are unchanged."""
    from mistill.evaluate.m1 import m1

    root, params, students, _ = chain
    traces = read_jsonl(root / "TR-008" / "traces.jsonl")
    events_dir = root / "TR-008" / "events"
    for arm, (model, tok) in students.items():
        plain = m1(model, tok, traces, events_dir, teacher_tokenizer)
        with_null = m1(model, tok, traces, events_dir, teacher_tokenizer, null_control=True)
        assert {k: with_null[k] for k in plain} == plain
        by_hand = []
        for row in traces:
            trace = Trace(**row)
            _, ids, _, _ = model_input(tok, trace)
            _, events = realize_note_events(read_jsonl(events_dir / trace.note_id / "events.jsonl"),
                                            teacher_tokenizer, tok, trace)
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids])).logits[0].float()
            by_hand += [float(margin(logits[e.pos - 1], e.target_id, e.competitor_ids))
                        for e in events if e.kind == "NULL"]
        assert with_null["NULL"]["events"] == len(by_hand) > 0
        assert with_null["NULL"]["p_margin_positive"] == pytest.approx(np.mean(np.asarray(by_hand) > 0))
        assert with_null["NULL"]["median_margin"] == pytest.approx(float(np.median(by_hand)), abs=1e-4)
