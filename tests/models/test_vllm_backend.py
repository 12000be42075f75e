"""The vLLM backend against a fake `vllm` (tests/fakes/vllm): the engine gets the profile's arguments and
the model's YaRN, each request its note's seed, the decoding settings, the cap and the end-of-turn stop."""

from __future__ import annotations

import json
import sys

import pytest

from mistill.errors import UserError
from mistill.models.decoding import Decoding
from mistill.models.generation import generate
from mistill.models.loading import ModelSpec, checkpoint_directory, load_model, load_tokenizer
from mistill.models.vllm_backend import EngineSettings, VLLMGenerator, engine_arguments

PROMPTS = ["code N18.3 chronic kidney disease", "code N18.3", "chronic kidney disease", "code"]
SEEDS = [11, 12, 13, 14]
DECODING = Decoding(temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=6)


def run(models, key, prompts=PROMPTS, seeds=SEEDS):
    spec = ModelSpec.from_params(models, key)
    return spec, generate(spec, prompts, seeds=seeds, decoding=DECODING, backend="vllm",
                          engine=EngineSettings.from_params(models, key))


def test_engine_gets_the_profiles_arguments_and_the_teachers_yarn(hub_cache, fake_vllm):
    spec, _ = run(hub_cache, "teacher")
    (engine,) = fake_vllm.ENGINES
    assert engine.model == str(checkpoint_directory(spec))  # the cached snapshot of the pinned commit
    assert engine.model.endswith(f"snapshots/{hub_cache['revision']['teacher']}")
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 40960}
    assert engine.kwargs == {
        "skip_tokenizer_init": True, "dtype": "bfloat16", "seed": 0, "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.9, "max_model_len": 163_840,
        "hf_overrides": {"rope_scaling": scaling, "rope_parameters": {"rope_theta": 1_000_000.0, **scaling},
                         "max_position_embeddings": 163_840}}


def test_students_get_their_own_windows(hub_cache, fake_vllm):
    run(hub_cache, "student_qwen")
    run(hub_cache, "student_smol")
    qwen, smol = fake_vllm.ENGINES
    assert qwen.kwargs["hf_overrides"]["rope_scaling"]["factor"] == 2.0  # Qwen3-4B: YaRN x2 in generation too
    assert qwen.kwargs["hf_overrides"]["max_position_embeddings"] == qwen.kwargs["max_model_len"] == 81_920
    assert "hf_overrides" not in smol.kwargs and smol.kwargs["max_model_len"] == 65_536  # native, no YaRN


def test_each_request_has_its_seed_the_decoding_the_cap_and_the_stop_rule(hub_cache, fake_vllm):
    spec, _ = run(hub_cache, "teacher")
    tokenizer = load_tokenizer(spec)
    (engine,) = fake_vllm.ENGINES
    assert [params.seed for _, params in engine.requests] == SEEDS
    for (prompt_ids, params), prompt in zip(engine.requests, PROMPTS):
        assert prompt_ids == tokenizer.encode(tokenizer.chat_prompt(prompt)).ids  # the transformers path's ids
        assert (params.temperature, params.top_p, params.top_k) == (0.6, 0.95, 20)
        assert params.max_tokens == DECODING.max_new_tokens and params.n == 1
        assert params.stop_token_ids == [tokenizer.eos_token_id] and params.ignore_eos


def test_completions_follow_the_transformers_paths_contract(hub_cache, fake_vllm):
    spec, generations = run(hub_cache, "teacher")
    tokenizer = load_tokenizer(spec)
    (engine,) = fake_vllm.ENGINES
    closed = capped = 0
    for generation, seed in zip(generations, SEEDS):
        tokens, _ = engine._sample(next(p for _, p in engine.requests if p.seed == seed))
        ends = tokens[-1] == tokenizer.eos_token_id
        assert generation.seed == seed and generation.n_new_tokens == len(tokens) <= DECODING.max_new_tokens
        assert generation.hit_cap == (not ends)
        assert generation.completion == tokenizer.decode(tokens[:-1] if ends else tokens)  # end token not decoded
        closed, capped = closed + ends, capped + (not ends)
    assert closed and capped  # both outcomes exercised
    # a note's completion depends on its seed, not on its place in the batch
    _, reordered = run(hub_cache, "teacher", PROMPTS[::-1], SEEDS[::-1])
    assert [g.completion for g in reordered] == [g.completion for g in generations][::-1]


def test_a_trained_checkpoint_keeps_the_yarn_it_was_trained_under(hub_cache, fake_vllm, tmp_path):
    model, tokenizer = load_model(ModelSpec.from_params(hub_cache, "student_qwen"))
    model.save_pretrained(tmp_path / "model")  # what the trainer writes: config.json carries YaRN x2
    tokenizer.save(tmp_path / "model")
    arguments = engine_arguments(ModelSpec(str(tmp_path / "model"), dtype="bfloat16"), EngineSettings())
    overrides = arguments["hf_overrides"]
    assert overrides["rope_scaling"]["factor"] == 2.0 and overrides["max_position_embeddings"] == 81_920
    assert overrides["rope_parameters"]["rope_theta"] == 1_000_000.0
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert saved["rope_parameters"]["rope_type"] == "yarn"


def test_engine_settings_from_params():
    models = {"vllm": {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.8,
                       "max_model_len": {"teacher": 163_840}}}
    assert EngineSettings.from_params(models, "teacher") == EngineSettings(
        tensor_parallel_size=2, data_parallel_size=1, gpu_memory_utilization=0.8, max_model_len=163_840)
    assert EngineSettings.from_params(models, None).max_model_len is None  # a trained checkpoint: its window
    assert EngineSettings.from_params({"vllm": {"max_model_len": 4096}}, "x").max_model_len == 4096
    with pytest.raises(UserError, match="unknown keys swap_space"):
        EngineSettings.from_params({"vllm": {"swap_space": 4}}, "teacher")
    with pytest.raises(UserError, match="invalid settings"):
        EngineSettings.from_params({"vllm": {"gpu_memory_utilization": 1.5}}, "teacher")


def test_stop_at_another_token_is_refused(hub_cache, fake_vllm, monkeypatch):
    original = VLLMGenerator.sampling_params

    def stop_elsewhere(self, seed, decoding):  # a stop rule that is not the end-of-turn token
        params = original(self, seed, decoding)
        params.stop_token_ids, params.ignore_eos = [], False
        params.max_tokens = 100
        return params

    monkeypatch.setattr(VLLMGenerator, "sampling_params", stop_elsewhere)
    spec = ModelSpec.from_params(hub_cache, "teacher")
    generator = VLLMGenerator(spec, EngineSettings())
    generator.llm.end_token = 1 if generator.tokenizer.eos_token_id != 1 else 2  # the model ends on another id
    with pytest.raises(UserError, match="stop rule was not applied"):
        generator.generate(PROMPTS[:1], SEEDS[:1], DECODING)


def test_without_vllm_the_backend_says_how_to_install_it(hub_cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails
    with pytest.raises(UserError, match=r"needs vLLM \(pip install -e '.\[paper\]'\)"):
        run(hub_cache, "teacher")
    with pytest.raises(UserError, match="not a loaded model"):
        generate((object(), object()), ["a"], seeds=[0], backend="vllm")


def test_paper_profile_generation_commands_rehearsed(hub_cache, fake_vllm, tmp_path, monkeypatch):
    """`mistill models traces` (the teacher) and `mistill evaluate generate` (a student) both sample in vLLM
    under the paper profile: the teacher with one fixed seed and YaRN x4, a student per note with YaRN x2."""
    from mistill.cli import main
    from mistill.evaluate.generate_commands import note_seed
    from mistill.io import read_jsonl
    from mistill.params import load_params
    from tests.chain.test_resume import NOTES
    from tests.models.conftest import write_paper_world

    write_paper_world(tmp_path, hub_cache, test_notes=slice(2, 4))
    paper = load_params(profile="paper")
    monkeypatch.chdir(tmp_path)

    assert main(["models", "traces", "--set", "TR-007"]) == 0
    assert main(["evaluate", "generate", "--model", "student_qwen", "--out", "eval/generations.jsonl"]) == 0
    teacher, student = fake_vllm.ENGINES
    assert teacher.kwargs["hf_overrides"]["rope_scaling"]["factor"] == 4.0
    assert [p.seed for _, p in teacher.requests] == [paper["seeds"]["decoding"]] * len(NOTES)  # App. B
    assert {p.max_tokens for _, p in teacher.requests} == {paper["decoding"]["max_new_tokens"]}
    assert student.kwargs["hf_overrides"]["rope_scaling"]["factor"] == 2.0
    assert student.kwargs["max_model_len"] == 81_920
    test_ids = [n["note_id"] for n in NOTES[2:4]]
    assert [p.seed for _, p in student.requests] == [note_seed(paper["seeds"]["decoding"], n) for n in test_ids]
    rows = read_jsonl(tmp_path / "eval" / "generations.jsonl")
    assert [r["note_id"] for r in rows] == test_ids and {r["decoding"]["backend"] for r in rows} == {"vllm"}
    traces = read_jsonl(tmp_path / "artifacts" / "TR-007" / "traces.jsonl")
    assert len(traces) == len(NOTES) and {r["decoding"]["backend"] for r in traces} == {"vllm"}
