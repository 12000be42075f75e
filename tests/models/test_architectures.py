"""The tiny architectures: each family builds the real transformers class, and tokenizes with its own BPE."""

from __future__ import annotations

import pytest
import torch

from mistill.errors import UserError
from mistill.models.architectures import TinyArchitecture, build_model

SIZES = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8}


@pytest.mark.parametrize(("family", "cls", "tokenizer", "qk_norm", "qkv_bias"), [
    ("qwen3", "Qwen3ForCausalLM", "qwen3", True, False),
    ("qwen2", "Qwen2ForCausalLM", "qwen3", False, True),      # QwQ-32B: Qwen2.5's BPE, which Qwen3 kept
    ("smollm3", "SmolLM3ForCausalLM", "smollm3", False, False),
])
def test_each_family_is_its_real_architecture(family, cls, tokenizer, qk_norm, qkv_bias):
    arch = TinyArchitecture.from_params({"family": family, **SIZES})
    model = build_model(arch, vocab_size=50, eos_token_id=1, pad_token_id=0, seed=0)
    attention = model.model.layers[0].self_attn
    assert type(model).__name__ == cls and arch.tokenizer_family == tokenizer
    assert hasattr(attention, "q_norm") == qk_norm
    assert (attention.q_proj.bias is not None) == qkv_bias
    # what the instrument hooks: o_proj reads num_attention_heads x head_dim
    assert attention.o_proj.in_features == SIZES["num_attention_heads"] * SIZES["head_dim"]
    # a seed fixes the weights
    again = build_model(arch, vocab_size=50, eos_token_id=1, pad_token_id=0, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))


def test_bad_architectures_are_one_line_errors():
    with pytest.raises(UserError, match="family must be one of qwen3, smollm3, qwen2"):
        TinyArchitecture.from_params({"family": "llama", **SIZES})
    arch = TinyArchitecture.from_params({"family": "qwen2", **{**SIZES, "head_dim": 16}})
    with pytest.raises(UserError, match="Qwen2 derives head_dim"):
        build_model(arch, vocab_size=50, eos_token_id=1, pad_token_id=0, seed=0)
