"""`mistill models ...` end to end on a tiny world written to tmp_path."""

from __future__ import annotations

import json

import pytest
import yaml

from mistill.cli import main
from mistill.errors import UserError
from mistill.io import read_jsonl, write_jsonl
from mistill.models import commands, generation
from mistill.models.architectures import TinyArchitecture, build_model
from mistill.models.tokenizers import CompactTokenizer, build_remap, qwen3_tokenizer

CODES = [{"code": "N18.3", "description": "chronic kidney disease stage 3"},
         {"code": "N18.4", "description": "chronic kidney disease stage 4"},
         {"code": "E11.9", "description": "type 2 diabetes mellitus without complications"}]
NOTES = [{"note_id": f"n{i}", "patient_id": f"p{i}", "text": f"note {i} chronic kidney disease stage 3",
          "gold_codes": ["N18.3"], "split": split} for i, split in enumerate(["char", "char", "train", "test"])]


@pytest.fixture
def world(tmp_path, monkeypatch):
    data = tmp_path / "artifacts" / "data"
    write_jsonl(data / "inventory.jsonl", CODES)
    write_jsonl(data / "corpus_char.jsonl", NOTES[:2])
    write_jsonl(data / "dt_train.jsonl", NOTES[2:3])
    write_jsonl(data / "dt_test.jsonl", NOTES[3:])
    write_jsonl(data / "shortlists.jsonl", [{"note_id": n["note_id"], "codes": ["N18.3", "N18.4"]} for n in NOTES])
    base = qwen3_tokenizer()
    tokenizer = CompactTokenizer(base, build_remap(base, [json.dumps(CODES), json.dumps(NOTES)]))
    arch = TinyArchitecture.from_params({"family": "qwen3", "hidden_size": 32, "intermediate_size": 64,
                                             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                             "head_dim": 8})
    model = build_model(arch, vocab_size=tokenizer.vocab_size, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id, seed=0)
    commands.save_model_dir(model, tokenizer, tmp_path / "teacher", {"note.json": {"tiny": True}})
    params = {"profile": "demo", "demo": {
        "paths": {"artifacts": "artifacts", "results": "results"},
        "seeds": {"decoding": 0},
        "models": {"teacher": str(tmp_path / "teacher"), "threads": 1, "device": "cpu",
                   "generation_backend": "transformers", "attn_implementation": "eager",
                   "teacher_training": None},
        "decoding": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 6}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_traces_records_contract_and_resumes(world, monkeypatch):
    assert main(["models", "traces", "--set", "TR-008"]) == 0
    records = read_jsonl(world / "artifacts" / "TR-008" / "traces.jsonl")
    assert [r["note_id"] for r in records] == ["n3", "n2"]  # test notes first
    keys = {"note_id", "prompt", "completion", "valid", "hit_cap", "degenerate", "answer", "n_new_tokens", "seed",
            "decoding", "model", "model_sha256", "input_sha256"}
    assert all(set(r) == keys for r in records)
    # a random tiny model hits the 6-token cap: invalid, scored empty (App. K)
    assert all(r["hit_cap"] and not r["valid"] and r["answer"] == [] for r in records)
    assert records[0]["decoding"]["top_k"] == 20 and records[0]["seed"] == 0
    assert "N18.4 chronic kidney disease stage 4" in records[0]["prompt"]  # the shortlist lines
    assert "E11.9" not in records[0]["prompt"]
    summary = json.loads((world / "artifacts" / "TR-008" / "summary.json").read_text())
    assert set(summary) >= {"overall", "train", "test", "per_note", "mention_totals", "provenance"}
    assert summary["overall"]["single_code_baseline"]["code"] == "N18.3"

    # resumable per note: a second run generates nothing
    calls = []
    real = generation.generate
    monkeypatch.setattr(generation, "generate", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert main(["models", "traces", "--set", "TR-008"]) == 0
    assert calls == []
    assert read_jsonl(world / "artifacts" / "TR-008" / "traces.jsonl") == records


def test_traces_full_inventory_set(world):
    assert main(["models", "traces", "--set", "TR-006", "--limit", "1"]) == 0
    records = read_jsonl(world / "artifacts" / "TR-006" / "traces.jsonl")
    assert len(records) == 1 and "E11.9 type 2 diabetes" in records[0]["prompt"]


def test_instruction_control_set_drops_only_the_narrow_sentence_on_a_seeded_draw(world):
    from mistill.models.traces import control_draw
    from mistill.world.prompt import NARROW_SENTENCE

    params = yaml.safe_load((world / "params.yaml").read_text())
    params["demo"]["instruction_control"] = {"notes": 2, "seed": 0}
    (world / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["models", "traces", "--set", "TR-006"]) == 0
    assert main(["models", "traces", "--set", "TR-A"]) == 0
    original = {r["note_id"]: r for r in read_jsonl(world / "artifacts" / "TR-006" / "traces.jsonl")}
    control = read_jsonl(world / "artifacts" / "TR-A" / "traces.jsonl")
    assert [r["note_id"] for r in control] == ["n0", "n1"]            # both characterization notes, in order
    for record in control:
        before = original[record["note_id"]]["prompt"]
        assert NARROW_SENTENCE in before and NARROW_SENTENCE not in record["prompt"]
        assert record["prompt"] == before.replace(" " + NARROW_SENTENCE, "")
    summary = json.loads((world / "artifacts" / "TR-A" / "summary.json").read_text())
    assert summary["provenance"]["narrow_instruction"] is False and summary["overall"]["notes"] == 2
    # the draw: seeded, in corpus order, a size between 2 and the notes
    ids = [f"n{i:02d}" for i in range(30)]
    drawn = control_draw(ids, {"instruction_control": {"notes": 9, "seed": 0}})
    assert len(drawn) == 9 and drawn == sorted(drawn)
    assert drawn == control_draw(ids, {"instruction_control": {"notes": 9, "seed": 0}})
    assert drawn != control_draw(ids, {"instruction_control": {"notes": 9, "seed": 1}})
    for bad in ({"notes": 1, "seed": 0}, {"notes": 31, "seed": 0}, {"seed": 0}):
        with pytest.raises(UserError, match="instruction_control"):
            control_draw(ids, {"instruction_control": bad})


def test_bad_input(world, capsys):
    assert main(["models", "traces", "--set", "TR-999"]) == 2
    assert "unknown trace set" in capsys.readouterr().err
    assert main(["models", "traces", "--set", "TR-006", "--model", str(world / "nothing" / "here")]) == 2
    assert "no such model directory" in capsys.readouterr().err
    assert main(["models", "traces", "--set", "TR-006", "--model", "nobody-here/no-such-model"]) == 2
    assert "unknown model id" in capsys.readouterr().err
    assert not (world / "artifacts" / "TR-006").exists()  # nothing half-written
    # no training recipe for a local teacher directory: nothing could make it
    assert main(["models", "train-teacher"]) == 2
    assert "teacher_training" in capsys.readouterr().err
    assert main(["models", "pretrain-students", "--students", "teacher"]) == 2
    assert "student_pretraining" in capsys.readouterr().err


def test_paper_profile_models_are_loaded_by_id_so_training_stages_only_pin_them(world, capsys):
    params = yaml.safe_load((world / "params.yaml").read_text())
    params["demo"]["models"].update({"dir": "models/paper", "teacher": "Qwen/Qwen3-14B", "teacher_qwq": "Qwen/QwQ-32B",
                                     "student_qwen": "Qwen/Qwen3-4B", "student_smol": "HuggingFaceTB/SmolLM3-3B",
                                     "revision": {"teacher": "abc", "teacher_qwq": None, "student_qwen": None,
                                                  "student_smol": "def"},
                                     "student_pretraining": None})
    (world / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["models", "train-teacher"]) == 0
    assert "Qwen/Qwen3-14B is loaded by id" in capsys.readouterr().out
    assert main(["models", "pretrain-students"]) == 0
    assert "HuggingFaceTB/SmolLM3-3B is loaded by id" in capsys.readouterr().out
    pins = {d: json.loads((world / "models" / "paper" / d / "pin.json").read_text())
            for d in ("teacher", "student-qwen", "student-smol")}
    assert pins["teacher"] == {"model": "teacher", "id": "Qwen/Qwen3-14B", "revision": "abc"}
    assert pins["student-qwen"] == {"model": "student_qwen", "id": "Qwen/Qwen3-4B", "revision": None}
    assert pins["student-smol"]["revision"] == "def"
    # the second teacher (R-C15) likewise: its stage pins QwQ-32B beside the first teacher's pin
    assert main(["models", "train-teacher", "--role", "teacher_qwq"]) == 0
    assert json.loads((world / "models" / "paper" / "teacher-qwq" / "pin.json").read_text()) == {
        "model": "teacher_qwq", "id": "Qwen/QwQ-32B", "revision": None}
    assert main(["models", "train-teacher", "--role", "teacher_llama"]) == 2
    assert "models.teacher_llama is not set" in capsys.readouterr().err


def test_save_model_dir_replaces_atomically(world):
    target = world / "teacher"
    assert (target / "model.safetensors").exists() and (target / "note.json").exists()
    with pytest.raises(RuntimeError):
        class Broken:
            def save_pretrained(self, path, **_):
                (path / "model.safetensors").write_text("partial")
                raise RuntimeError("disk full")
        commands.save_model_dir(Broken(), None, target, {})
    # the old model is intact and no staging directory is left behind
    assert (target / "note.json").exists() and (target / "model.safetensors").stat().st_size > 100
    assert [p.name for p in world.iterdir() if p.name.startswith(".teacher")] == []


def test_teacher_notes_hold_out_corpus_patients_and_add_generator_notes(tmp_path, monkeypatch):
    from mistill.models.commands import extra_teacher_notes, teacher_notes
    from mistill.models.world_files import load_world

    data = tmp_path / "artifacts" / "data"
    write_jsonl(data / "inventory.jsonl", CODES)
    pool = [{"note_id": f"n{i}", "patient_id": f"p{i % 4}", "split": "train" if i < 6 else "test",
             "text": f"chief complaint x{i} discharge diagnosis chronic kidney disease stage 3 "
                     f"discharge condition stable", "gold_codes": ["N18.3"]} for i in range(8)]
    write_jsonl(data / "notes.jsonl", pool)
    write_jsonl(data / "dt_test.jsonl", [pool[1]])          # patient p1 is held out
    write_jsonl(data / "corpus_char.jsonl", [pool[6]])      # a test-split patient (p2)
    params = {"paths": {"artifacts": str(tmp_path / "artifacts")},
              "world": {"notes": {"source": "synthetic", "min_gold": 1, "max_gold": 2}},
              "models": {"teacher_training": {"source_split": "train", "exclude": ["corpus_char.jsonl", "dt_test.jsonl"],
                                              "extra_patients": 3, "extra_seed": 1}}}
    world = load_world(params)
    notes = teacher_notes(params, world)
    pool_ids = [n.note_id for n in notes if not n.note_id.startswith("teacher-")]
    assert pool_ids == ["n0", "n3", "n4"]   # train split, minus patients p1 (dt_test) and p2 (char)
    assert all("discharge diagnosis" not in n.text for n in notes)  # App. A's cut
    extra = extra_teacher_notes(params, world)
    assert len(extra) == 3 and all(n.patient_id.startswith("teacher-") for n in extra)
    assert [n.note_id for n in extra] == [n.note_id for n in extra_teacher_notes(params, world)]  # seeded
    assert {n.note_id for n in notes} >= {n.note_id for n in extra}


def test_student_pretraining_notes_are_their_own_and_seeded(tmp_path):
    from mistill.models.commands import extra_teacher_notes, pretraining_notes
    from mistill.models.world_files import load_world

    write_jsonl(tmp_path / "artifacts" / "data" / "inventory.jsonl", CODES)
    params = {"paths": {"artifacts": str(tmp_path / "artifacts")},
              "world": {"notes": {"source": "synthetic", "min_gold": 1, "max_gold": 2}},
              "models": {"student_pretraining": {"patients": 4, "notes_seed": 2},
                         "teacher_training": {"extra_patients": 4, "extra_seed": 1}}}
    world = load_world(params)
    notes = pretraining_notes(params, world)
    assert len(notes) == 4 and all(n.patient_id.startswith("pretrain-") for n in notes)
    assert [n.text for n in notes] == [n.text for n in pretraining_notes(params, world)]  # seeded
    # another seed than the teacher's extra notes: the students never see a teacher training note
    assert not {n.text for n in notes} & {n.text for n in extra_teacher_notes(params, world)}
    params["world"]["notes"]["source"] = "mimiciv"
    with pytest.raises(Exception, match="synthetic"):
        pretraining_notes(params, world)


def test_student_pretraining_near_misses_must_be_a_boolean(world, capsys):
    """A string such as "no" would read as true: the switch is refused before any training starts."""
    params = yaml.safe_load((world / "params.yaml").read_text())
    params["demo"]["models"]["student_pretraining"] = {"epochs": {"student_qwen": 1}, "near_misses": "no"}
    (world / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["models", "pretrain-students", "--students", "student_qwen"]) == 2
    assert "near_misses must be true or false" in capsys.readouterr().err
