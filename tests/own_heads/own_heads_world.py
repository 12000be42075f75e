"""Helpers of the own-heads tests (a uniquely named module: conftest names collide across folders).

A tiny own-heads world: hand-made shortlist traces, the teacher's events in Qwen3's tokenizer, and
randomly initialised tiny Qwen3 / SmolLM3 students over compact remaps of the real tokenizers."""

from __future__ import annotations

import json

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, SmolLM3Config, SmolLM3ForCausalLM

from mistill.instrument.events import extract_events
from mistill.io import write_jsonl
from mistill.world.prompt import build_prompt

torch.set_num_threads(1)

INVENTORY = [("N18.3", "chronic kidney disease stage 3"), ("N18.4", "chronic kidney disease stage 4"),
             ("E11.9", "type 2 diabetes"), ("E11.65", "type 2 diabetes with hyperglycemia"),
             ("I10", "essential hypertension"), ("J44.1", "copd with exacerbation"), ("K21.9", "reflux"),
             ("N17.9", "acute kidney failure")]
PROSE = "the summary was read again and the findings were weighed with care before any choice"
PICKS = [[0, 1, 2, 3, 4], [2, 3, 5, 0, 1], [6, 4, 0, 1, 3], [1, 0, 3, 2, 5]]


def completion(codes) -> str:
    lines = [f"{c} {d}, considered." for c, d in codes]
    return ("<think>\n" + PROSE + ".\n" + "\n".join(lines) + "\n" + PROSE + " " + PROSE + ".\n</think>\n\n"
            + json.dumps([c for c, _ in codes]))


def traces() -> list[dict]:
    lines = [f"{c} {d}" for c, d in INVENTORY]
    out = []
    for i, pick in enumerate(PICKS):
        note = f"patient note {i} with kidney disease and diabetes and reflux " * 3
        out.append({"note_id": f"note{i}", "prompt": build_prompt(note, lines),
                    "completion": completion([INVENTORY[j] for j in pick])})
    return out


def corpus_texts(tokenizer_base) -> list[str]:
    return [tokenizer_base.chat_prompt(t["prompt"]) + t["completion"] for t in traces()]


def _scale(model):
    # larger weights than the default init, so heads have effects well above float noise
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.mul_(8.0)
    return model.eval().requires_grad_(False)


def tiny_qwen3(vocab_size: int, *, seed: int = 0, attn: str = "sdpa", layers: int = 2, heads: int = 4):
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=2, head_dim=8, max_position_embeddings=4096,
                      tie_word_embeddings=True, attn_implementation=attn)
    return _scale(Qwen3ForCausalLM(cfg))


def tiny_smollm3(vocab_size: int, *, seed: int = 0, attn: str = "sdpa"):
    torch.manual_seed(seed)
    cfg = SmolLM3Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                        no_rope_layer_interval=2, tie_word_embeddings=True, attn_implementation=attn,
                        pad_token_id=None, bos_token_id=None, eos_token_id=None)
    return _scale(SmolLM3ForCausalLM(cfg))


def write_world(root, teacher_tokenizer) -> dict:
    """Inventory, notes, teacher traces and the teacher's events; returns the params of a test profile."""
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data"
    write_jsonl(data / "inventory.jsonl", [{"code": c, "description": d} for c, d in INVENTORY])
    rows = traces()
    write_jsonl(root / "TR-007" / "traces.jsonl", rows)
    write_jsonl(root / "TR-008" / "traces.jsonl", rows)
    write_jsonl(data / "dt_test.jsonl", [{"note_id": r["note_id"], "patient_id": f"p{i}", "text": "x",
                                          "gold_codes": ["N18.3"], "split": "test"} for i, r in enumerate(rows)])
    codes = [c for c, _ in INVENTORY]
    for events_dir in (root / "HD-002", root / "TR-008" / "events"):
        for r in rows:
            text = teacher_tokenizer.chat_prompt(r["prompt"]) + r["completion"]
            enc = teacher_tokenizer.encode(text)
            events, _ = extract_events(note_id=r["note_id"], text=text, ids=enc.ids, offsets=enc.offsets,
                                       completion_start=len(teacher_tokenizer.chat_prompt(r["prompt"])),
                                       codes=codes, tokenizer=teacher_tokenizer, n_null=6, seed=0)
            write_jsonl(events_dir / r["note_id"] / "events.jsonl", [e.to_json() for e in events])
    return {
        "profile": "test",
        "paths": {"artifacts": str(root)},
        "models": {"teacher": "unused", "dtype": None, "device": "cpu"},
        "instrument": {"traces": str(root / "TR-007" / "traces.jsonl"), "inventory": str(data / "inventory.jsonl"),
                       "out_dir": str(root / "unused"), "seed": 0,
                       "events": {"n_null": 6, "null_min_distance": 8, "p2c_cap": 2, "unknown_codes": "skip_note"},
                       "attribution": {"hook": "detached", "attn_implementation": "sdpa", "nominees_topk": 3,
                                       "nominees_global_topk": 2, "null_exact_share": 0.5, "max_batch": 64},
                       "calibration": {"fdr": 0.05, "pool_k": 4, "summary_top_k": 2, "recurrence_top_k": 2},
                       "knockin": {"bins": [2, 4], "min_range": 1.0, "donor_match": "first"}},
        "evaluate": {"test_notes": str(data / "dt_test.jsonl"), "teacher_traces": str(root / "TR-008" / "traces.jsonl"),
                     "events_dir": str(root / "TR-008" / "events"),
                     "own_heads": {"validation_traces": str(root / "TR-007" / "traces.jsonl"),
                                   "validation_events_dir": str(root / "HD-002"), "bins": [2, 4, 8],
                                   "readside_k": 3, "readside_phases": ["P1", "P2", "P2C"], "seed": 0}},
        "read_side": {"out_dir": str(root / "HD-001-read"), "panel_k": 2,
                      "edits": {"max_events_per_note": 3, "filler": " .", "mediation_min_effect": 0.5}},
        "stats": {"bootstrap_resamples": 200, "bootstrap_seed": 0, "confidence": 0.95},
    }
