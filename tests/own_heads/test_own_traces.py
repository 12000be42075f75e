"""The own-trace chain (App. L.4) on tiny random Qwen3 and SmolLM3 students: completed generations only, App. C's
events in the student's text, the realisation step as the identity for a student of the teacher's tokenizer and
App. I.1's anchor rule for SmolLM3's, the knock-in against its invariant, and the property that a student whose
own traces are the teacher's traces reproduces its teacher-forced cells."""

from __future__ import annotations

import json

import pytest
from own_heads_world import INVENTORY, completion, tiny_qwen3, tiny_smollm3, traces, write_world

from mistill.errors import UserError
from mistill.evaluate.compare import knockin_rows, note_recovery
from mistill.evaluate.own_heads import realize_note_events, run_chain
from mistill.evaluate.own_traces import OwnTraceRun, completed_generations, run_own_traces
from mistill.instrument.events import extract_events
from mistill.instrument.passes import Trace, load_events, model_input
from mistill.io import read_jsonl, write_jsonl


def generations(rows: list[dict], invalid: set[str] = frozenset(), cap: set[str] = frozenset()) -> list[dict]:
    """`mistill evaluate arm` rows: a note in `invalid` never closes its reasoning, one in `cap` hit the cap."""
    return [{**r, "valid": r["note_id"] not in invalid | cap, "hit_cap": r["note_id"] in cap, "answer": []}
            for r in rows]


@pytest.fixture(scope="module")
def world(tmp_path_factory, teacher_tokenizer):
    root = tmp_path_factory.mktemp("own_traces")
    params = write_world(root, teacher_tokenizer)
    params["instrument"]["knockin"]["min_range"] = 1e-3   # a random tiny model: hardly an event clears 1 nat
    model = tiny_qwen3(teacher_tokenizer.vocab_size, seed=3)
    run_chain("unused", "qwen", 0, params, stages=["attribute", "knockin"], model=model,
              tokenizer=teacher_tokenizer, teacher_tokenizer=teacher_tokenizer)
    # the student's own generations: other code orders than the teacher's, one unfinished, one at the cap
    own = []
    for i, r in enumerate(traces()):
        picks = [INVENTORY[j] for j in ([5, 4, 3, 2, 1, 0] if i % 2 else [7, 0, 1, 6])]
        own.append({**r, "completion": completion(picks)})
    write_jsonl(root / "gen" / "generations.jsonl", generations(own, invalid={"note1"}, cap={"note3"}))
    coverage = run_own_traces("unused", "qwen", 0, params, generations=root / "gen" / "generations.jsonl",
                              heads_from=root / "HD-S" / "qwen-s0", root=root / "own-trace", model=model,
                              tokenizer=teacher_tokenizer, teacher_tokenizer=teacher_tokenizer)
    return root, params, model, coverage


def test_only_completed_generations_become_traces(world):
    root, _, _, coverage = world
    run = OwnTraceRun(root / "own-trace", "qwen", 0)
    assert (coverage["generated"], coverage["completed"]) == (4, 2)
    assert [t["note_id"] for t in read_jsonl(run.traces)] == ["note0", "note2"]
    saved = json.loads(run.coverage.read_text())
    assert saved["completed_notes"] == ["note0", "note2"] and saved["with_events"] == 2


def test_events_are_the_students_own_and_survive_realisation_unchanged(world, teacher_tokenizer):
    root, _, _, _ = world
    run = OwnTraceRun(root / "own-trace", "qwen", 0)
    codes = [c for c, _ in INVENTORY]
    for row in read_jsonl(run.traces):
        trace = Trace(row["note_id"], row["prompt"], row["completion"])
        text, ids, offsets, start = model_input(teacher_tokenizer, trace)
        expected, _ = extract_events(note_id=trace.note_id, text=text, ids=ids, offsets=offsets,
                                     completion_start=start, codes=codes, tokenizer=teacher_tokenizer, n_null=6, seed=0)
        own = load_events(run.events_dir / trace.note_id / "events.jsonl")
        assert [(e.kind, e.pos, e.target_id) for e in own] == [(e.kind, e.pos, e.target_id) for e in expected]
        # the student's tokenizer on both sides of App. I.1's realisation: every event stays where it is
        _, realised = realize_note_events(read_jsonl(run.events_dir / trace.note_id / "events.jsonl"),
                                          teacher_tokenizer, teacher_tokenizer, trace)
        key = sorted((e.kind, e.pos, e.target_id, tuple(sorted(e.competitor_ids))) for e in own)
        assert sorted((e.kind, e.pos, e.target_id, tuple(sorted(e.competitor_ids))) for e in realised) == key
        assert (run.m6_dir / trace.note_id / "patch2.jsonl").exists()


def test_own_trace_knock_in_keeps_its_invariant_and_takes_the_next_own_trace_as_donor(world):
    root, _, _, _ = world
    run = OwnTraceRun(root / "own-trace", "qwen", 0)
    rows = [r for note in ("note0", "note2") for r in read_jsonl(run.m6_dir / note / "patch2.jsonl")]
    assert len(rows) > 5
    for r in rows:   # knocking in every head returns the clean margin
        assert r["margin_all"] == pytest.approx(r["margin_clean"], abs=1e-4)
    donors = {n: json.loads((run.m6_dir / n / "patch2.jsonl.meta.json").read_text())["donor"]
              for n in ("note0", "note2")}
    assert donors == {"note0": "note2", "note2": "note0"}
    assert json.loads((run.m6_dir / "faithfulness2.json").read_text())["heads_from"].endswith(
        "HD-S/qwen-s0/head_sets_contrast.json")


def test_a_student_reasoning_as_the_teacher_reproduces_its_teacher_forced_cells(world, teacher_tokenizer):
    """Own traces equal to the teacher's, one tokenizer: the own-trace readout is the teacher-forced one."""
    root, params, model, _ = world
    write_jsonl(root / "same" / "generations.jsonl", generations(traces()))
    run_own_traces("unused", "qwen", 0, params, generations=root / "same" / "generations.jsonl",
                   heads_from=root / "HD-S" / "qwen-s0", root=root / "same", model=model, tokenizer=teacher_tokenizer,
                   teacher_tokenizer=teacher_tokenizer)
    own = knockin_rows(root / "same" / "M6" / "qwen-s0")
    forced = knockin_rows(root / "M6" / "qwen-s0")
    assert set(own) == set(forced) == {"note0", "note1", "note2", "note3"}
    assert len(note_recovery(own, phase="P2C", set_kind="top", k=4, min_range=1e-3)) >= 3
    for k in (2, 4):
        for phase in ("P1", "P2", "P2C"):
            got = note_recovery(own, phase=phase, set_kind="top", k=k, min_range=1e-3)
            assert got == pytest.approx(note_recovery(forced, phase=phase, set_kind="top", k=k, min_range=1e-3),
                                        abs=1e-6)


def test_a_rerun_on_fewer_completions_drops_the_earlier_notes(world, teacher_tokenizer):
    root, params, model, _ = world
    write_jsonl(root / "fewer" / "generations.jsonl", generations(traces(), invalid={"note0"}))
    kw = dict(heads_from=root / "HD-S" / "qwen-s0", root=root / "fewer", model=model, tokenizer=teacher_tokenizer,
              teacher_tokenizer=teacher_tokenizer)
    run_own_traces("unused", "qwen", 0, params, generations=root / "fewer" / "generations.jsonl", **kw)
    write_jsonl(root / "fewer" / "generations.jsonl", generations(traces(), invalid={"note0", "note1", "note2"}))
    coverage = run_own_traces("unused", "qwen", 0, params, generations=root / "fewer" / "generations.jsonl", **kw)
    run = OwnTraceRun(root / "fewer", "qwen", 0)
    assert coverage["completed"] == 1
    # one note cannot be knocked in (no donor): an empty readout, and no directory of the earlier notes
    assert json.loads((run.m6_dir / "faithfulness2.json").read_text())["notes"] == []
    assert sorted(p.name for p in run.events_dir.iterdir() if p.is_dir()) == ["note3"]
    assert not any(p.is_dir() and p.name != "note3" for p in run.m6_dir.iterdir())


def test_bad_inputs_are_user_errors(world, tmp_path):
    root, params, model, _ = world
    write_jsonl(tmp_path / "g.jsonl", [{"note_id": "note0", "completion": "x"}])
    with pytest.raises(UserError, match="not the output of `mistill evaluate arm`"):
        completed_generations(tmp_path / "g.jsonl")
    with pytest.raises(UserError, match="head_sets_contrast.json"):
        run_own_traces("unused", "qwen", 0, params, generations=root / "gen" / "generations.jsonl",
                       heads_from=tmp_path, root=tmp_path / "out", model=model, tokenizer=None)


def test_smollm3_own_traces_keep_the_decisions_its_tokens_begin_at(world, teacher_tokenizer, smol_tokenizer):
    """SmolLM3 merges digit runs: App. C's rules in its own tokenization find no P2 or P2C decision, while the
    events located in the teacher's tokenization and realised by App. I.1's anchor rule keep the P2C decisions
    at which a SmolLM3 token begins (the knock-in reads exactly those)."""
    root, params, _, _ = world
    model = tiny_smollm3(smol_tokenizer.vocab_size, seed=4)
    run_chain("unused", "smol", 0, params, stages=["attribute"], model=model, tokenizer=smol_tokenizer,
              teacher_tokenizer=teacher_tokenizer)
    write_jsonl(root / "smol" / "generations.jsonl", generations(traces()))
    coverage = run_own_traces("unused", "smol", 0, params, generations=root / "smol" / "generations.jsonl",
                              heads_from=root / "HD-S" / "smol-s0", root=root / "smol", model=model,
                              tokenizer=smol_tokenizer, teacher_tokenizer=teacher_tokenizer)
    run, codes = OwnTraceRun(root / "smol", "smol", 0), [c for c, _ in INVENTORY]
    assert coverage["with_events"] == 4
    realised_p2c = 0
    for row in read_jsonl(run.traces):
        trace = Trace(row["note_id"], row["prompt"], row["completion"])
        text, ids, offsets, start = model_input(smol_tokenizer, trace)
        own_rules, _ = extract_events(note_id=trace.note_id, text=text, ids=ids, offsets=offsets,
                                      completion_start=start, codes=codes, tokenizer=smol_tokenizer, n_null=6, seed=0)
        assert not [e for e in own_rules if e.kind in ("P2", "P2C")]
        _, expected = realize_note_events(read_jsonl(run.events_dir / trace.note_id / "events.jsonl"),
                                          teacher_tokenizer, smol_tokenizer, trace)
        realised = load_events(run.m6_dir / trace.note_id / "events.jsonl")
        assert [(e.kind, e.pos, e.target_id) for e in realised] == [(e.kind, e.pos, e.target_id) for e in expected]
        for e in realised:   # each kept decision's token begins at the decided character
            assert offsets[e.pos][0] <= start + e.anchor < offsets[e.pos][1]
            assert text[offsets[e.pos][0]:start + e.anchor].strip() == ""
        realised_p2c += sum(e.kind == "P2C" for e in realised)
    assert realised_p2c > 0
