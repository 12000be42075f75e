"""A model is named by its files (and how it is loaded), never by loading its weights: a training run
checks its targets' teacher without the teacher in memory."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
import yaml

from mistill.errors import UserError
from mistill.models import fingerprint as fp
from mistill.models.loading import ModelSpec, checkpoint_directory
from mistill.params import load_params
from tests.models.conftest import QWEN, save_tiny


def test_a_local_checkpoint_is_named_by_its_files(tmp_path):
    directory = save_tiny(tmp_path / "teacher", QWEN)
    before = fp.weights_fingerprint(directory)
    (directory / "pretraining_log.json").write_text("{\"seconds\": 12}")  # wall time is not the model
    (directory / "README.md").write_text("a card")
    assert fp.weights_fingerprint(directory) == before
    weights = directory / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    assert fp.weights_fingerprint(directory) != before


def test_a_cached_hub_checkpoint_is_named_by_its_blobs_without_reading_them(hub_cache, monkeypatch):
    monkeypatch.setattr(fp, "FULL_HASH_BYTES", 0)  # every file counts as large, as 14B shards are
    monkeypatch.setattr(fp, "file_sha256", lambda path: pytest.fail(f"read {path} in full"))
    spec = ModelSpec.from_params(hub_cache, "teacher")
    snapshot = checkpoint_directory(spec)
    expected = hashlib.sha256()
    for path in fp.identity_files(snapshot):
        expected.update(f"{path.name}\0sha256:{path.resolve().name}\0".encode())  # the hub's sha256 of its bytes
    assert fp.weights_fingerprint(spec) == expected.hexdigest()


def test_a_large_local_shard_is_named_by_its_header_and_size(tmp_path, monkeypatch):
    monkeypatch.setattr(fp, "FULL_HASH_BYTES", 0)
    directory = save_tiny(tmp_path / "a", QWEN)
    before = fp.weights_fingerprint(directory)
    other = save_tiny(tmp_path / "b", {**QWEN, "intermediate_size": 48})  # other shapes: another header
    assert fp.weights_fingerprint(other) != before
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(UserError, match="truncated safetensors header"):
        fp.weights_fingerprint(directory)


def test_the_model_fingerprint_includes_dtype_and_yarn_not_attention_kernel(tmp_path):
    directory = str(save_tiny(tmp_path / "m", QWEN))
    yarn = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 40960}
    base = fp.model_fingerprint(ModelSpec(directory, dtype="bfloat16", rope_scaling=yarn))
    assert fp.model_fingerprint(ModelSpec(directory, dtype="float32", rope_scaling=yarn)) != base
    assert fp.model_fingerprint(ModelSpec(directory, dtype="bfloat16")) != base
    assert fp.model_fingerprint(ModelSpec(directory, dtype="bfloat16", rope_scaling=yarn,
                                          attn_implementation="sdpa")) == base


def write_head_sets(path, *, n_layers, n_heads):
    """Teacher head sets of a tiny model: every head ranked, by a fixed permutation, in every phase."""
    order = np.random.default_rng(0).permutation(n_layers * n_heads)
    ics = np.linspace(1, -1, n_layers * n_heads)
    phases = {phase: [{"layer": int(i // n_heads), "head": int(i % n_heads), "ic": float(ic), "weight": None}
                      for i, ic in zip(order, ics)] for phase in ("P1", "P2", "P2C", "prose")}
    path.write_text(json.dumps({"n_layers": n_layers, "n_heads": n_heads, "phases": phases, "tau": {},
                                "provenance": {}}))


def test_paper_profile_targets_and_training_rehearsed(hub_cache, tmp_path, monkeypatch):
    """`distill targets` loads the teacher as it ran (bf16, YaRN x4, pinned revision) and names it by its
    files; `distill train` checks that name without loading the teacher and loads the student in its arm's
    dtype with YaRN x2."""
    from mistill.cli import main
    from mistill.io import write_jsonl
    from mistill.models import loading
    from mistill.world.prompt import build_prompt
    from tests.distill.conftest import COMPLETION, LINES, NOTE_TEXT, make_events

    prompt = build_prompt(NOTE_TEXT, LINES)
    notes = [{"note_id": n, "patient_id": n, "text": "word", "gold_codes": ["N18.9"], "split": "train"}
             for n in ("a", "b")]
    write_jsonl(tmp_path / "train.jsonl", notes)
    write_jsonl(tmp_path / "traces.jsonl", [{"note_id": n, "prompt": prompt, "completion": COMPLETION,
                                             "valid": True} for n in ("a", "b")])
    for n in ("a", "b"):
        write_jsonl(tmp_path / "events" / n / "events.jsonl", make_events())
    write_head_sets(tmp_path / "t_sets.json", n_layers=2, n_heads=4)
    paper = load_params(profile="paper")
    distill = {"traces": "traces.jsonl", "train_notes": "train.jsonl", "events_dir": "events",
               "teacher_head_sets": "t_sets.json", "teacher_prose_sets": "t_sets.json", "student_head_sets": {},
               "targets_dir": "targets",
               "runs_dir": "runs", "pool_k": {"teacher": 3, "student": 3}, "window": 8, "topk": 8,
               "lambda_p1": 0.1, "lambda_p2": 0.1, "terms": ["attn", "inter"], "write_norm": False,
               "heads": "top", "pool_seed": 0, "precision": paper["distill"]["precision"], "seeds": [0],
               "train": {"epochs": 1, "batch": 2, "lr": 1e-5, "warmup_frac": 0.05, "clip": 1.0,
                         "gradient_checkpointing": False}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        {"profile": "paper", "paper": {"models": paper["models"], "distill": distill}}))
    monkeypatch.chdir(tmp_path)
    loads = []
    real_load = loading.load_model

    def spy(spec, **kwargs):
        model, tokenizer = real_load(spec, **kwargs)
        loads.append((spec, model))
        return model, tokenizer

    monkeypatch.setattr(loading, "load_model", spy)
    assert main(["distill", "targets"]) == 0
    (teacher_spec, teacher), = loads
    assert teacher_spec.source == "Qwen/Qwen3-14B" and teacher.config.rope_parameters["factor"] == 4.0
    assert teacher.dtype == torch.bfloat16
    manifest = json.loads((tmp_path / "targets" / "manifest.json").read_text())
    assert manifest["teacher_hash"] == fp.model_fingerprint(ModelSpec.from_params(paper["models"], "teacher"))
    for precision, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        loads.clear()
        assert main(["distill", "train", "--arm", "vanilla", "--precision", precision]) == 0
        (student_spec, student), = loads  # the student only: the teacher is named by its files
        assert student_spec.source == "Qwen/Qwen3-4B" and student.dtype == dtype
        assert student.config.rope_parameters["factor"] == 2.0
        assert student.model.rotary_emb.inv_freq.dtype == torch.float32
