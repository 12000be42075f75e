"""Every model is loaded as the profile runs it: its YaRN factor where params give one, its revision, its
dtype through `from_pretrained`, and RoPE's `inv_freq` in fp32 in every prepared model."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from mistill.errors import UserError
from mistill.models.loading import ModelSpec, cast_weights, load_model, rope_buffers
from mistill.params import load_params

KEYS = ("teacher", "student_qwen", "student_smol")


def assert_rope_fp32(model):
    buffers = rope_buffers(model)
    assert buffers and all(buf.dtype == torch.float32 for buf in buffers.values()), \
        {name: buf.dtype for name, buf in buffers.items()}


def test_spec_names_a_model_by_key_id_or_trained_checkpoint():
    models = load_params(profile="paper")["models"]
    by_key = ModelSpec.from_params(models, "student_qwen")
    assert by_key == ModelSpec.from_params(models, "Qwen/Qwen3-4B")  # the id it names is the same model
    assert by_key.rope_scaling["factor"] == 2.0 and by_key.dtype == "bfloat16"
    assert by_key.revision == models["revision"]["student_qwen"] and by_key.name == "student_qwen"
    trained = ModelSpec.from_params(models, "artifacts/DT-001/qwen-mistill/model", base="student_qwen")
    # a trained student keeps its base's YaRN; a local directory has no hub revision
    assert trained.rope_scaling == by_key.rope_scaling and trained.revision is None
    assert ModelSpec.from_params(models, "some/dir/model").rope_scaling is None  # as its config.json says
    assert ModelSpec.from_params(models, "teacher", attn_implementation="sdpa").attn_implementation == "sdpa"
    forgot = {**models, "student_new": "org/new-model"}
    with pytest.raises(UserError, match="no entry for 'student_new'"):
        ModelSpec.from_params(forgot, "student_new")
    with pytest.raises(UserError, match="factor"):
        ModelSpec("x", rope_scaling={"rope_type": "yarn"})
    with pytest.raises(UserError, match="unknown dtype"):
        ModelSpec("x", dtype="bf16")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_demo_models_keep_rope_in_fp32(dtype):
    models = load_params(profile="demo")["models"]
    for key in KEYS:
        model, _ = load_model(ModelSpec.from_params(models, key, dtype=dtype))
        assert model.dtype == getattr(torch, dtype)
        assert_rope_fp32(model)
        assert model.config.rope_parameters["rope_type"] == "default"  # demo: rope_scaling null


def test_paper_models_load_as_the_paper_ran_them(hub_cache):
    windows = {"teacher": 163_840, "student_qwen": 81_920, "student_smol": 65_536}  # App. B, J.1
    for key in KEYS:
        spec = ModelSpec.from_params(hub_cache, key)
        model, _ = load_model(spec)
        assert model.name_or_path.endswith(f"snapshots/{hub_cache['revision'][key]}")  # the pinned commit
        assert model.dtype == torch.bfloat16
        assert_rope_fp32(model)
        assert model.config.max_position_embeddings == windows[key]
        rope = model.config.rope_parameters
        scaling = hub_cache["rope_scaling"][key]
        if scaling is None:  # SmolLM3-3B: its native window, no YaRN (App. J.1)
            assert rope["rope_type"] == "default"
            continue
        assert rope["rope_type"] == "yarn" and rope["factor"] == scaling["factor"]
        assert rope["original_max_position_embeddings"] == 40960 and rope["rope_theta"] == 1_000_000.0
        expected, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](model.config, torch.device("cpu"))
        torch.testing.assert_close(model.model.rotary_emb.inv_freq, expected.float(), rtol=0, atol=0)
        assert model.model.rotary_emb.attention_scaling == pytest.approx(0.1 * math.log(scaling["factor"]) + 1)


def test_a_revision_not_in_the_cache_is_not_resolved_to_another(hub_cache):
    spec = ModelSpec.from_params(hub_cache, "teacher").replace(revision="0" * 40)
    with pytest.raises(UserError, match="at revision 0000.*not in the local Hugging Face cache"):
        load_model(spec)


def test_casting_a_built_model_would_round_rope_and_cast_weights_does_not():
    # a Qwen3 head (head_dim 128, theta 1e6): inv_freq rounded to bf16 is off by radians at 30k tokens
    inv_freq = 1.0 / (1_000_000.0 ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128))
    position = 30_000.0
    error = (position * inv_freq - position * inv_freq.to(torch.bfloat16).float()).abs().max()
    assert error > 1.0
    models = load_params(profile="demo")["models"]
    model, _ = load_model(ModelSpec.from_params(models, "student_qwen"))
    assert model.to(torch.bfloat16).model.rotary_emb.inv_freq.dtype == torch.bfloat16  # what must not happen
    model, _ = load_model(ModelSpec.from_params(models, "student_qwen"))
    fp32 = model.model.rotary_emb.inv_freq.clone()
    cast_weights(model, torch.bfloat16)
    assert model.dtype == torch.bfloat16 and model.lm_head.weight.dtype == torch.bfloat16
    assert_rope_fp32(model)
    torch.testing.assert_close(model.model.rotary_emb.inv_freq, fp32, rtol=0, atol=0)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_training_arms_keep_rope_in_fp32(hub_cache, precision):
    from mistill.distill.trainer import TrainConfig, precision_dtype, prepare_model

    cfg = TrainConfig(precision=precision, gradient_checkpointing=False)
    loaded, _ = load_model(ModelSpec.from_params(hub_cache, "student_qwen", dtype=precision_dtype(precision)))
    built, _ = load_model(ModelSpec.from_params(hub_cache, "student_qwen", dtype="float32"))
    for model in (loaded, built):  # loaded in the arm's dtype, or cast by the trainer
        model = prepare_model(model, cfg)
        assert model.dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
        assert_rope_fp32(model)
        assert model.config.rope_parameters["factor"] == 2.0  # Qwen3-4B trains under YaRN x2 (App. J.1)


def test_passes_load_the_profiles_models(hub_cache):
    """The instrument's teacher and the own-heads students come through the profile's specs."""
    from mistill.evaluate.own_heads import load_student
    from mistill.instrument.passes import InstrumentConfig, load_teacher

    params = {**load_params(profile="paper"), "models": {**hub_cache, "device": "cpu"}}
    teacher, _ = load_teacher(InstrumentConfig.from_params(params), params)
    assert teacher.config.rope_parameters["factor"] == 4.0 and teacher.config.max_position_embeddings == 163_840
    assert teacher.name_or_path.endswith(hub_cache["revision"]["teacher"])
    assert_rope_fp32(teacher)
    qwen, _ = load_student("Qwen/Qwen3-4B", params, "student_qwen")
    smol, _ = load_student("HuggingFaceTB/SmolLM3-3B", params, "student_smol")
    assert qwen.config.rope_parameters["factor"] == 2.0 and smol.config.rope_parameters["rope_type"] == "default"
    assert_rope_fp32(qwen)
    assert_rope_fp32(smol)
