"""The paper's encoder path (a frozen HF encoder loaded by id or dir), on a tiny model the test saves."""

from __future__ import annotations

import numpy as np
import pytest

from mistill.errors import UserError
from mistill.world.shortlist import TfidfEncoder, TransformerEncoder, make_encoder


@pytest.fixture(scope="module")
def tiny_encoder_dir(tmp_path_factory):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-encoder")
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "chronic", "kidney", "disease", "asthma", "mild"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]").save_pretrained(path)
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    BertModel(config).eval().save_pretrained(path)
    return path


def test_transformer_encoder_mean_pools_and_normalises(tiny_encoder_dir):
    import torch
    from transformers import AutoModel

    encoder = make_encoder(str(tiny_encoder_dir))
    assert isinstance(encoder, TransformerEncoder) and encoder._model is None      # loaded only when used
    rows = encoder.encode(["chronic kidney disease", "mild asthma"])
    assert rows.shape == (2, 16)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0)
    model = AutoModel.from_pretrained(tiny_encoder_dir).eval()
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([[6, 5]])).last_hidden_state[0]    # "mild asthma" alone
    expected = hidden.mean(0).numpy()
    np.testing.assert_allclose(rows[1], expected / np.linalg.norm(expected), atol=1e-5)


def test_missing_encoder_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="cannot load"):
        TransformerEncoder(str(tmp_path / "no-such-model")).encode(["x"])


def test_tfidf_is_the_demo_encoder():
    assert isinstance(make_encoder("tfidf"), TfidfEncoder)
