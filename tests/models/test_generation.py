"""Sampled generation: per-note seeds, the cap, validity through App. K's parser, bad settings."""

from __future__ import annotations

import pytest

from mistill.errors import UserError
from mistill.models.architectures import TinyArchitecture, build_model
from mistill.models.decoding import Decoding
from mistill.models.generation import generate
from mistill.models.tokenizers import CompactTokenizer, build_remap, qwen3_tokenizer
from mistill.world.answers import parse_answer
from mistill.world.inventory import Inventory
from mistill.world.types import Code

ARCH = {"family": "qwen3", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8}


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    base = qwen3_tokenizer()
    tokenizer = CompactTokenizer(base, build_remap(base, ["code N18.3 chronic kidney disease", "</think> [\"N18.3\"]"]))
    model = build_model(TinyArchitecture.from_params(ARCH), vocab_size=tokenizer.vocab_size,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, seed=0)
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    tokenizer.save(path)
    return str(path)


def test_seeded_sampling_is_per_note(saved_model):
    prompts = ["code N18.3", "code chronic kidney disease"]
    a = generate(saved_model, prompts, seeds=[0, 1], max_new_tokens=12)
    b = generate(saved_model, prompts[::-1], seeds=[1, 0], max_new_tokens=12)
    # a note's completion depends on its seed, not on its place in the list
    assert a[0].completion == b[1].completion and a[1].completion == b[0].completion
    c = generate(saved_model, prompts[:1], seeds=[2], max_new_tokens=12)
    assert c[0].completion != a[0].completion  # another seed, another sample (random tiny model)


def test_cap_makes_the_generation_invalid(saved_model):
    gen = generate(saved_model, ["code N18.3"], seeds=[0], max_new_tokens=5)[0]
    # a random model does not close its turn within 5 tokens
    assert gen.hit_cap and gen.n_new_tokens == 5
    inventory = Inventory([Code("N18.3", "chronic kidney disease stage 3")])
    parsed = parse_answer(gen.completion + '</think>\n\n["N18.3"]', inventory, hit_cap=gen.hit_cap)
    assert not parsed.valid and parsed.answer == ()  # App. K: capped -> invalid, scored empty


def test_bad_settings_are_user_errors(saved_model):
    with pytest.raises(UserError, match="greedy"):
        Decoding.from_params({"temperature": 0})
    with pytest.raises(UserError, match="seeds"):
        generate(saved_model, ["a", "b"], seeds=[0])
    with pytest.raises(UserError, match="backend"):
        generate(saved_model, ["a"], seeds=[0], backend="tgi")
    with pytest.raises(UserError, match="no such model directory"):
        generate("models/demo/no-such-model", ["a"], seeds=[0])
