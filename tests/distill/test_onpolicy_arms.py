"""The on-policy baseline arms through TRL (App. J.3): OPD (`DistillationTrainer`) and GOLD (`GOLDTrainer`).

The tokenizer adapter is checked against our tokenizer on a real shortlist prompt (ids, decode, chat
template, GOLD's byte spans); one tiny run of each trainer against the properties a step must have
(finite loss, the student moves, the teacher does not, the run directory evaluation reads), and OPD's
rerun against resuming TRL's last checkpoint."""

import importlib.metadata
import json

import pytest
import torch

from mistill.baselines import onpolicy
from mistill.baselines.hf_tokenizer import UNKNOWN_TEXT, TRLTokenizer
from mistill.errors import UserError
from mistill.models.architectures import TinyArchitecture, build_model
from mistill.models.loading import cast_weights
from mistill.models.tokenizers import CompactTokenizer, build_remap, qwen3_tokenizer, smollm3_tokenizer

torch.set_num_threads(1)


def _tok(base, note_prompt, completion):
    return CompactTokenizer(base, build_remap(base, [base.chat_prompt(note_prompt) + completion]))


def _model(tok, seed, family="qwen3", hidden=32, dtype=torch.float32):
    arch = TinyArchitecture(family=family, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4)
    model = build_model(arch, vocab_size=tok.vocab_size, eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id, seed=seed, attn_implementation="sdpa")
    return cast_weights(model, dtype) if dtype != torch.float32 else model


def _config(arm, **changes):
    settings = dict(arm=arm, epochs=1, lr=1e-2, batch=1, per_device_batch=1, warmup_frac=0.05, clip=1.0,
                    gradient_checkpointing=False, save_every=1, max_completion_length=6, temperature=1.0,
                    top_p=1.0, top_k=0, use_vllm=False, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3)
    settings.update(changes)
    return onpolicy.OnPolicyConfig(**settings)


@pytest.fixture(scope="module")
def qwen_tok(note_prompt, completion):
    return _tok(qwen3_tokenizer(), note_prompt, completion)


@pytest.fixture(scope="module")
def smol_tok(note_prompt, completion):
    return _tok(smollm3_tokenizer(), note_prompt, completion)


def test_trl_is_pinned():
    assert importlib.metadata.version("trl") == "1.16.0"


# ---- the tokenizer adapter ---------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["qwen_tok", "smol_tok"])
def test_adapter_tokenizes_decodes_and_templates_as_ours(which, request, note_prompt, completion):
    tok = request.getfixturevalue(which)
    hf = TRLTokenizer(tok)
    prompt = tok.chat_prompt(note_prompt)
    assert hf(prompt)["input_ids"] == tok.encode(prompt).ids
    assert hf([prompt, completion])["input_ids"] == [tok.encode(prompt).ids, tok.encode(completion).ids]
    ids = tok.encode(prompt + completion).ids
    assert hf.decode(ids) == tok.decode(ids) == prompt + completion
    rendered = hf.apply_chat_template([{"role": "user", "content": note_prompt}], tokenize=False,
                                      add_generation_prompt=True)
    assert rendered == prompt
    # how TRL's DistillationTrainer tokenizes a batch of conversational prompts
    batch = hf.apply_chat_template([[{"role": "user", "content": note_prompt}]], tokenize=True,
                                   add_generation_prompt=True, return_dict=True)
    assert batch["input_ids"] == [tok.encode(prompt).ids]
    assert (hf.eos_token_id, hf.pad_token_id, len(hf)) == (tok.eos_token_id, tok.pad_token_id, tok.vocab_size)


def test_adapter_byte_spans_are_the_real_tokens(smol_tok, completion):
    from trl.experimental.utils import encode_with_byte_offsets, piece_byte_len

    hf = TRLTokenizer(smol_tok)
    [(ids, spans)] = encode_with_byte_offsets(hf.backend_tokenizer, [completion])
    assert ids == smol_tok.encode(completion).ids
    assert spans[-1][1] == len(completion.encode("utf-8"))
    # GOLD places on-policy tokens by their pieces' byte counts: they must add up to the decoded text
    assert sum(piece_byte_len(p) for p in hf.convert_ids_to_tokens(ids)) == len(completion.encode("utf-8"))
    assert piece_byte_len(hf.convert_ids_to_tokens([0])[0]) == len(UNKNOWN_TEXT.encode("utf-8"))
    assert hf.decode([0]) == UNKNOWN_TEXT


def test_adapter_refuses_other_conversations(qwen_tok):
    hf = TRLTokenizer(qwen_tok)
    with pytest.raises(Exception, match="one user turn"):
        hf.apply_chat_template([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                               tokenize=False, add_generation_prompt=True)


# ---- the trainers -------------------------------------------------------------------------------------------

def _traces(note_prompt, completion, n=2):
    return [{"note_id": f"n{i}", "prompt": note_prompt, "completion": completion} for i in range(n)]


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _moved(before, model):
    return any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def _check_run(out, teacher, teacher_before, student, student_before):
    assert _moved(student_before, student), "the student's weights did not change"
    assert not _moved(teacher_before, teacher), "the teacher's weights changed"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert all({"step", "loss", "lr", "notes", "step_time_s", "peak_memory_bytes"} <= set(r) for r in rows)
    config = json.loads((out / "config.json").read_text())
    assert config["trl_version"] == "1.16.0" and config["torch_version"] == torch.__version__
    assert config["example_ids"] == [f"n{i}" for i in range(len(config["example_ids"]))]
    assert (out / "model" / "config.json").exists()
    return rows, config


def test_opd_trains_the_student_on_its_own_samples_and_resumes(tmp_path, qwen_tok, note_prompt, completion):
    teacher = _model(qwen_tok, seed=1, hidden=48)
    student = _model(qwen_tok, seed=2, dtype=torch.bfloat16)
    teacher_before, student_before = _weights(teacher), _weights(student)
    out = tmp_path / "opd"
    config = _config("opd", beta=1.0)
    traces = _traces(note_prompt, completion)
    onpolicy.train(config, student, teacher, qwen_tok, qwen_tok, traces, out, 0, student_name="s",
                   teacher_name="t", max_steps=1)
    assert (out / "checkpoint-1").is_dir() and not (out / "model").exists()
    # the rerun in the same directory continues from TRL's last checkpoint to the end of the schedule
    run = onpolicy.train(config, student, teacher, qwen_tok, qwen_tok, traces, out, 0, student_name="s",
                         teacher_name="t")
    assert run["resumed_from"] == "checkpoint-1"
    rows, saved = _check_run(out, teacher, teacher_before, student, student_before)
    assert [r["step"] for r in rows] == [1, 2] and saved["total_steps"] == 2
    assert next(student.parameters()).dtype == torch.bfloat16


def test_opd_refuses_another_vocabulary(tmp_path, qwen_tok, smol_tok, note_prompt, completion):
    teacher = _model(qwen_tok, seed=1)
    student = _model(smol_tok, seed=2, family="smollm3", dtype=torch.bfloat16)
    with pytest.raises(UserError, match="GOLD is the cross-tokenizer arm"):
        onpolicy.train(_config("opd"), student, teacher, smol_tok, qwen_tok, _traces(note_prompt, completion),
                       tmp_path / "opd", 0, student_name="s", teacher_name="t")


def test_gold_trains_a_cross_tokenizer_student(tmp_path, qwen_tok, smol_tok, note_prompt, completion):
    teacher = _model(qwen_tok, seed=1, hidden=48)
    student = _model(smol_tok, seed=2, family="smollm3", dtype=torch.bfloat16)
    teacher_before, student_before = _weights(teacher), _weights(student)
    out = tmp_path / "gold"
    config = _config("gold", batch=4, lmbda=0.5, use_extended_uld=True, uld_use_hybrid_loss=True)
    run = onpolicy.train(config, student, teacher, smol_tok, qwen_tok, _traces(note_prompt, completion, 4), out, 0,
                         student_name="s", teacher_name="t")
    rows, _ = _check_run(out, teacher, teacher_before, student, student_before)
    assert len(rows) == 1 and run["trainer"] == "GOLDTrainer"
    # at seed 0 the four micro-batches of the step draw both halves: the student's samples and the traces
    assert {"on_policy_loss", "off_policy_loss"} <= set(rows[0])
    assert run["completions_cut"] == 4   # the teacher's trace is cut to the rollout cap


def test_cut_completion_keeps_the_start_within_the_cap(smol_tok, completion):
    cut, was_cut = onpolicy.cut_completion(smol_tok, completion, 6)
    assert was_cut and completion.startswith(cut) and len(smol_tok.encode(cut).ids) == 5
    assert onpolicy.cut_completion(smol_tok, completion, 10_000) == (completion, False)
