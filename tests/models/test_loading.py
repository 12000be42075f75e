"""Tiny real architectures and `load_model` on models the tests save to disk."""

from __future__ import annotations

import shutil

import pytest
import torch

from mistill.errors import UserError
from mistill.models.architectures import TinyArchitecture, build_model
from mistill.models.loading import ModelSpec, apply_rope_scaling, is_local_spec, load_model
from mistill.models.tokenizers import (
    CompactTokenizer,
    build_remap,
    qwen3_files,
    qwen3_tokenizer,
    smollm3_tokenizer,
)

QWEN = {"family": "qwen3", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8}
SMOL = {"family": "smollm3", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "no_rope_layer_interval": 4}


def save_tiny(tmp_path, arch_params, base):
    tokenizer = CompactTokenizer(base, build_remap(base, ["N18.3 chronic kidney disease", "</think> [\"N18.3\"]"]))
    arch = TinyArchitecture.from_params(arch_params)
    model = build_model(arch, vocab_size=tokenizer.vocab_size, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id, seed=0)
    model.save_pretrained(tmp_path)
    tokenizer.save(tmp_path)
    return model, tokenizer


def test_qwen3_tiny_round_trip(tmp_path):
    model, _tokenizer = save_tiny(tmp_path, QWEN, qwen3_tokenizer())
    loaded, loaded_tok = load_model(str(tmp_path))
    assert type(loaded).__name__ == "Qwen3ForCausalLM"
    assert loaded.config.num_key_value_heads == 2 and loaded.config.head_dim == 8  # GQA
    assert loaded.config._attn_implementation == "eager"
    ids = torch.tensor([loaded_tok.encode("N18.3 chronic").ids])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    # eager attention returns probabilities (the read side needs them)
    with torch.no_grad():
        attn = loaded(ids, output_attentions=True).attentions
    assert attn[0].shape == (1, 4, ids.shape[1], ids.shape[1])
    torch.testing.assert_close(attn[0].sum(-1), torch.ones(1, 4, ids.shape[1]))


def test_smollm3_tiny_keeps_the_nope_pattern(tmp_path):
    save_tiny(tmp_path, SMOL, smollm3_tokenizer())
    loaded, tok = load_model(str(tmp_path))
    assert type(loaded).__name__ == "SmolLM3ForCausalLM"
    # every 4th layer has no rotary embedding (SmolLM3's NoPE layers)
    assert loaded.config.no_rope_layers == [1, 1, 1, 0, 1, 1, 1, 0]
    assert [layer.self_attn.use_rope for layer in loaded.model.layers] == [1, 1, 1, 0, 1, 1, 1, 0]
    assert tok.family == "smollm3"


def test_same_seed_same_weights():
    arch = TinyArchitecture.from_params(QWEN)
    a = build_model(arch, vocab_size=50, eos_token_id=1, pad_token_id=2, seed=3)
    b = build_model(arch, vocab_size=50, eos_token_id=1, pad_token_id=2, seed=3)
    c = build_model(arch, vocab_size=50, eos_token_id=1, pad_token_id=2, seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def test_local_dir_with_hf_tokenizer_files_uses_autotokenizer(tmp_path):
    # the paper profile's path: a checkpoint directory with the tokenizer files transformers reads
    base = qwen3_tokenizer()
    arch = TinyArchitecture.from_params(QWEN)
    model = build_model(arch, vocab_size=base.vocab_size, eos_token_id=base.eos_token_id,
                        pad_token_id=base.pad_token_id, seed=0)
    model.save_pretrained(tmp_path)
    for path in qwen3_files():
        shutil.copy(path, tmp_path / path.name)
    _, tok = load_model(str(tmp_path))
    assert type(tok).__name__ == "HFTextTokenizer"
    text = " N18.9 chronic kidney disease"
    assert tok.encode(text) == base.encode(text)
    assert tok.chat_prompt("code this") == base.chat_prompt("code this")


def test_yarn_from_params(tmp_path):
    save_tiny(tmp_path, QWEN, qwen3_tokenizer())
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 40960}
    model, _ = load_model(ModelSpec(str(tmp_path), rope_scaling=yarn))
    assert model.config.rope_parameters["rope_type"] == "yarn"
    assert model.config.rope_parameters["factor"] == 4.0
    assert model.config.max_position_embeddings == 163840  # App. B: 40,960 x 4
    with pytest.raises(UserError, match="factor"):
        apply_rope_scaling(model.config, {"rope_type": "yarn"})


def test_unknown_model_id_is_a_user_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(UserError, match="unknown model id 'nobody-here/no-such-model'"):
        load_model("nobody-here/no-such-model")


def test_missing_local_weights_is_a_user_error(tmp_path):
    save_tiny(tmp_path, QWEN, qwen3_tokenizer())
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(UserError, match="missing model weights"):
        load_model(str(tmp_path))
    with pytest.raises(UserError, match="no such model directory"):
        load_model(str(tmp_path / "models" / "demo" / "nothing"))
    assert is_local_spec("models/demo/teacher") and not is_local_spec("Qwen/Qwen3-14B")


def test_bad_architecture_params():
    with pytest.raises(UserError, match="family"):
        TinyArchitecture.from_params({**QWEN, "family": "llama"})
    with pytest.raises(UserError, match="multiple"):
        TinyArchitecture.from_params({**QWEN, "num_key_value_heads": 3})
    with pytest.raises(UserError, match="unknown architecture keys"):
        TinyArchitecture.from_params({**QWEN, "layers": 3})


def test_threads_come_from_params_and_a_flag_overrides_them():
    import torch

    from mistill.models.loading import set_threads

    before = torch.get_num_threads()
    try:
        set_threads({"threads": 1})
        assert torch.get_num_threads() == 1
        set_threads({"threads": 1}, override=2)
        assert torch.get_num_threads() == 2
        set_threads({"threads": None})          # null: torch's default stays as it is
        assert torch.get_num_threads() == 2
        set_threads({})
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
