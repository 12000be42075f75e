"""Stand-ins for the paper profile's machinery: tiny models under the paper's model ids in a local
Hugging Face cache, and a fake `vllm` module (tests/fakes/vllm) that records what it was asked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mistill.models.architectures import TinyArchitecture, build_model
from mistill.models.tokenizers import CompactTokenizer, build_remap, qwen3_tokenizer, smollm3_tokenizer
from mistill.rehearsal.build import cache_checkpoint
from mistill.world.prompt import build_prompt
from tests.distill.conftest import COMPLETION, LINES, NOTE_TEXT

FAKES = Path(__file__).resolve().parents[1] / "fakes"

QWEN = {"family": "qwen3", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 40960}  # the released Qwen3 configs' window, App. B's YaRN base
SMOL = {"family": "smollm3", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "no_rope_layer_interval": 4,
        "max_position_embeddings": 65536, "rope_theta": 5_000_000.0}  # SmolLM3-3B's native window


def covered_text(base) -> list[str]:
    """What the tiny models' vocabulary covers: the distill tests' templated prompt and completion."""
    return [base.chat_prompt(build_prompt(NOTE_TEXT, LINES)) + COMPLETION, "code N18.3 chronic kidney disease"]


def save_tiny(directory: Path, arch: dict, seed: int = 0) -> Path:
    """A tiny model of the architecture with its compact tokenizer, saved as a checkpoint directory."""
    base = qwen3_tokenizer() if arch["family"] == "qwen3" else smollm3_tokenizer()
    tokenizer = CompactTokenizer(base, build_remap(base, covered_text(base)))
    model = build_model(TinyArchitecture.from_params(arch), vocab_size=tokenizer.vocab_size,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, seed=seed)
    model.save_pretrained(directory)
    tokenizer.save(directory)
    return directory


@pytest.fixture(scope="session")
def paper_models(tmp_path_factory):
    """The paper profile's three model ids as tiny checkpoints in a local cache, at the pinned revisions."""
    from mistill.params import load_params

    models = load_params(profile="paper")["models"]
    root = tmp_path_factory.mktemp("hub")
    cache = root / "cache"
    archs = {"teacher": QWEN, "student_qwen": QWEN, "student_smol": SMOL}
    for seed, (key, arch) in enumerate(archs.items()):
        directory = save_tiny(root / key, arch, seed=seed)
        cache_checkpoint(cache, models[key], models["revision"][key], directory)
    return cache, models


@pytest.fixture
def hub_cache(paper_models, monkeypatch):
    """The paper's models section, its ids served offline from the tiny cache."""
    import huggingface_hub.constants

    cache, models = paper_models
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return models


@pytest.fixture
def fake_vllm(monkeypatch):
    """`import vllm` finds the fake; its engine list starts empty."""
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    import vllm

    vllm.ENGINES.clear()
    yield vllm
    sys.modules.pop("vllm", None)


def write_paper_world(root: Path, models: dict, test_notes: slice, vllm: dict | None = None) -> Path:
    """A paper-profile project at `root`: tests/chain/test_resume's notes (all of them characterization
    notes, the first two training notes, `test_notes` the test notes) on two-code shortlists, and the
    paper's paths, seeds and decoding with `models` (its `vllm` section updated by `vllm`)."""
    import json

    from mistill.io import write_jsonl
    from mistill.params import load_params
    from tests.chain.test_resume import CODES, NOTES

    data = root / "artifacts" / "data"
    write_jsonl(data / "inventory.jsonl", CODES)
    write_jsonl(data / "corpus_char.jsonl", NOTES)
    write_jsonl(data / "dt_train.jsonl", NOTES[:2])
    write_jsonl(data / "dt_test.jsonl", NOTES[test_notes])
    write_jsonl(data / "shortlists.jsonl", [{"note_id": n["note_id"], "codes": ["N18.3", "N18.4"]} for n in NOTES])
    paper = load_params(profile="paper")
    profile = {key: paper[key] for key in ("paths", "seeds", "decoding")}
    profile.update(world={"inventory": {"source": "icd10cm"}},
                   models={**models, "device": "cpu", "vllm": {**models["vllm"], **(vllm or {})}},
                   evaluate={"test_notes": "artifacts/data/dt_test.jsonl"})
    (root / "params.yaml").write_text(json.dumps({"profile": "paper", "paper": profile}))
    return root
