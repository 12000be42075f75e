"""`mistill models ...` end to end on a tiny world written to tmp_path."""

from __future__ import annotations

import json

import pytest
import yaml

from mistill.cli import main
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
    assert [r["note_id"] for r in records] == ["n2", "n3"]
    keys = {"note_id", "prompt", "completion", "valid", "hit_cap", "degenerate", "answer", "n_new_tokens", "seed",
            "decoding", "model"}
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


def test_bad_input(world, capsys):
    assert main(["models", "traces", "--set", "TR-999"]) == 2
    assert "unknown trace set" in capsys.readouterr().err
    assert main(["models", "traces", "--set", "TR-006", "--model", str(world / "nothing" / "here")]) == 2
    assert "no such model directory" in capsys.readouterr().err
    assert main(["models", "traces", "--set", "TR-006", "--model", "nobody-here/no-such-model"]) == 2
    assert "unknown model id" in capsys.readouterr().err
    assert not (world / "artifacts" / "TR-006").exists()  # nothing half-written
    # the paper profile's teacher is loaded by id, not trained
    assert main(["models", "train-teacher"]) == 2
    assert "teacher_training" in capsys.readouterr().err


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
