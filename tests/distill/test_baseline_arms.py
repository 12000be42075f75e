"""The baseline arms on the shared trainer (App. J.3): Feature-KD and DistiLLM-2 with the teacher online.

The hooked quantities are checked against a brute-force eager forward, the chunked DistiLLM-2 loss
against the loss module on full logits, and one training step against the properties a step must
have (finite loss, the student and the adapters move, the teacher does not, resume is exact)."""

import json

import numpy as np
import pytest
import torch

from mistill.baselines import arms as ba
from mistill.baselines import distillm2 as d2
from mistill.baselines import feature_kd as fkd
from mistill.distill import buckets as bk
from mistill.distill import pools as pl
from mistill.distill import targets as tg
from mistill.distill.mechanism import note_view
from mistill.distill.trainer import TrainConfig
from mistill.errors import UserError
from mistill.io import write_jsonl
from mistill.models.tokenizers import qwen3_tokenizer, smollm3_tokenizer
from tests.distill.test_training import _model, _tok

torch.set_num_threads(1)


def _head_sets(n_layers, n_heads, seed):
    rng = np.random.default_rng(seed)
    phases = {}
    for phase in ("P1", "P2", "P2C", "prose"):
        order = rng.permutation(n_layers * n_heads)
        phases[phase] = [{"layer": int(o // n_heads), "head": int(o % n_heads), "ic": float(-i), "weight": 0.0}
                         for i, o in enumerate(order)]
    return {"n_layers": n_layers, "n_heads": n_heads, "phases": phases, "tau": {}, "provenance": {}}


STUDENT_ANSWER = '<think>\nKidney disease, N18.3.\n</think>\n\n["N18.3"]'


@pytest.fixture(scope="module")
def world(tmp_path_factory, note_prompt, completion, events):
    tmp_path = tmp_path_factory.mktemp("baselines")
    tok = _tok(qwen3_tokenizer(), note_prompt, completion + STUDENT_ANSWER)
    smol_tok = _tok(smollm3_tokenizer(), note_prompt, completion + STUDENT_ANSWER)
    teacher = _model(tok, seed=1, layers=4, hidden=64, heads=8)
    for note_id in ("n1", "n2"):
        write_jsonl(tmp_path / "events" / note_id / "events.jsonl", events)
    traces = [{"note_id": n, "prompt": note_prompt, "completion": completion, "valid": True} for n in ("n1", "n2")]
    pools = pl.build_pools(_head_sets(4, 8, 0), 6)
    tg.compute_targets(teacher, tok, traces, tmp_path / "events", tmp_path / "targets", pools, None, window=0, topk=8,
                       teacher_id="tiny-teacher", provenance={})
    notes = [tg.read_note_targets(tmp_path / "targets" / f"{n}.npz") for n in ("n1", "n2")]
    return {"tok": tok, "smol_tok": smol_tok, "teacher": teacher, "notes": notes, "traces": traces,
            "prompt": note_prompt, "completion": completion}


# ---- Feature-KD -----------------------------------------------------------------------------------------

def test_positions_pair_every_token_under_one_tokenizer(world):
    axis = bk.build_axis(world["prompt"], world["completion"])
    view = note_view(world["tok"], axis, [], [])
    s_pos, t_pos = ba.paired_trace_positions(view, view)
    assert s_pos.tolist() == t_pos.tolist() == list(range(view.completion_token, len(view.ids)))


def test_positions_across_tokenizers_end_at_the_same_character(world):
    axis = bk.build_axis(world["prompt"], world["completion"])
    s_view, t_view = note_view(world["smol_tok"], axis, [], []), note_view(world["tok"], axis, [], [])
    s_pos, t_pos = ba.paired_trace_positions(s_view, t_view)
    assert len(s_pos) > 0 and np.all(np.diff(s_pos) > 0) and np.all(np.diff(t_pos) > 0)
    # brute force: every pair of trace tokens, one from each view, ending at the same completion character
    s_ends = {s_view.offsets[i][1] - s_view.completion_at: i for i in range(s_view.completion_token, len(s_view.ids))}
    t_ends = {t_view.offsets[i][1] - t_view.completion_at: i for i in range(t_view.completion_token, len(t_view.ids))}
    expected = sorted((s_ends[c], t_ends[c]) for c in set(s_ends) & set(t_ends) if c > 0)
    assert list(zip(s_pos.tolist(), t_pos.tolist())) == expected
    # the last token of the trace ends both tokenizations
    assert s_pos[-1] == len(s_view.ids) - 1 and t_pos[-1] == len(t_view.ids) - 1


def test_feature_reader_equals_eager_attention_and_hidden_states(world):
    """The hooked head-averaged bucket rows equal eager full attention averaged and pooled by brute force; the
    residual streams equal transformers' hidden_states (after block l = entry l + 1, the last before the norm)."""
    meta, arrays = world["notes"][0]
    note = ba.prepare_featurekd_note(meta, arrays, world["tok"], world["tok"], ba.FeatureKDConfig(positions=5),
                                     seed=0, index=0)
    teacher = world["teacher"]
    layers = [0, 2, 3]
    reader = ba._FeatureReader(teacher, layers)
    with torch.no_grad():
        _, rows, streams = reader.forward(note.teacher_ids, note.teacher_rows, note.teacher_buckets, note.n_buckets,
                                          note.teacher_pos)
        teacher.set_attn_implementation("eager")
        try:
            out = teacher(input_ids=note.teacher_ids[None], output_attentions=True, output_hidden_states=True)
        finally:
            teacher.set_attn_implementation("sdpa")
    index = note.teacher_buckets.numpy()
    for layer, got in zip(layers, rows):
        attn = out.attentions[layer][0].mean(0).numpy()[note.teacher_rows.numpy()]        # [R, T]
        expected = np.stack([bk.pool_rows_numpy(row, index, note.n_buckets) for row in attn])
        np.testing.assert_allclose(got.numpy(), expected, atol=1e-5)
        np.testing.assert_allclose(got.sum(-1).numpy(), 1.0, atol=1e-5)
    np.testing.assert_allclose(streams[0].numpy(), out.hidden_states[1][0][note.teacher_pos].numpy(), atol=1e-6)
    np.testing.assert_allclose(streams[1].numpy(), out.hidden_states[3][0][note.teacher_pos].numpy(), atol=1e-6)
    assert not np.allclose(streams[2].numpy(), out.hidden_states[4][0][note.teacher_pos].numpy())  # normed there


def test_featurekd_rows_are_drawn_by_seed(world):
    meta, arrays = world["notes"][0]
    draw = lambda seed, index: ba.prepare_featurekd_note(meta, arrays, world["tok"], world["tok"],  # noqa: E731
                                                         ba.FeatureKDConfig(positions=6), seed, index).student_rows
    assert torch.equal(draw(0, 0), draw(0, 0))
    assert not torch.equal(draw(0, 0), draw(1, 0)) and not torch.equal(draw(0, 0), draw(0, 1))
    assert len(draw(0, 0)) == 6


def _featurekd_trainer(world, student_tok, family, out, seed=0, epochs=1):
    config = ba.FeatureKDConfig(positions=8)
    notes = [ba.prepare_featurekd_note(meta, arrays, student_tok, world["tok"], config, seed, i)
             for i, (meta, arrays) in enumerate(world["notes"])]
    student = _model(student_tok, seed=5, layers=4, family=family, hidden=32, heads=4)
    cfg = TrainConfig(epochs=epochs, batch=1, lr=3e-3, precision="fp32", seed=seed, gradient_checkpointing=False)
    return ba.FeatureKDTrainer(student, world["teacher"], notes, config, cfg, out)


@pytest.mark.parametrize("family", ["qwen3", "smollm3"])
def test_featurekd_step_moves_student_and_adapters_not_teacher(world, family, tmp_path):
    student_tok = world["tok"] if family == "qwen3" else world["smol_tok"]
    trainer = _featurekd_trainer(world, student_tok, family, tmp_path)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    adapter_before = {k: v.clone() for k, v in trainer.extra.state_dict().items()}
    teacher_before = {k: v.clone() for k, v in world["teacher"].state_dict().items()}
    rows = trainer.run(max_steps=1)
    row = rows[0]
    assert all(np.isfinite(row[k]) for k in ("loss", "cot", "attn", "hidden"))
    assert row["loss"] == pytest.approx(row["cot"] + row["attn"] + row["hidden"], rel=1e-5)
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    assert all(not torch.equal(adapter_before[k], v) for k, v in trainer.extra.state_dict().items())
    assert all(torch.equal(teacher_before[k], v) for k, v in world["teacher"].state_dict().items())
    assert trainer.run_config["layer_pairs"] == [[0, 0], [1, 1], [2, 2], [3, 3]]


def test_featurekd_resumes_exactly_with_its_adapters(world, tmp_path):
    full = _featurekd_trainer(world, world["tok"], "qwen3", tmp_path / "a", epochs=2)
    full_rows = full.run()
    assert len(full_rows) == 4 and (tmp_path / "a" / "extra.pt").exists()
    _featurekd_trainer(world, world["tok"], "qwen3", tmp_path / "b", epochs=2).run(max_steps=2)
    resumed = _featurekd_trainer(world, world["tok"], "qwen3", tmp_path / "b", epochs=2)
    rows = resumed.run()
    assert [r["loss"] for r in rows] == pytest.approx([r["loss"] for r in full_rows[2:]], rel=1e-6)
    for key, value in full.extra.state_dict().items():
        torch.testing.assert_close(resumed.extra.state_dict()[key], value)
    assert json.loads((tmp_path / "b" / "config.json").read_text())["arm"]["arm"] == "featurekd"


def test_adapters_are_fixed_by_the_seed(world, tmp_path):
    """App. J.3's caveat, fixed: the trainer seeds before it builds the adapters."""
    torch.manual_seed(123)
    a = _featurekd_trainer(world, world["tok"], "qwen3", tmp_path / "a").extra.state_dict()
    torch.manual_seed(456)
    b = _featurekd_trainer(world, world["tok"], "qwen3", tmp_path / "b").extra.state_dict()
    c = _featurekd_trainer(world, world["tok"], "qwen3", tmp_path / "c", seed=1).extra.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a) and not all(torch.equal(a[k], c[k]) for k in a)


# ---- DistiLLM-2 -----------------------------------------------------------------------------------------

def _distillm2_notes(world):
    responses = {t["note_id"]: {"prompt": t["prompt"], "completion": STUDENT_ANSWER} for t in world["traces"]}
    return [ba.prepare_distillm2_note(t, responses[t["note_id"]], world["tok"]) for t in world["traces"]]


def test_response_mask_marks_the_rows_that_predict_the_response(world):
    ids, mask = ba.response_ids(world["tok"], world["prompt"], STUDENT_ANSWER)
    prefix = world["tok"].chat_prompt(world["prompt"])
    n_prompt = len(world["tok"].encode(prefix).ids)
    assert mask.sum() == len(ids) - n_prompt and mask[n_prompt - 1] and not mask[n_prompt - 2] and not mask[-1]
    assert world["tok"].decode(ids[1:][mask[:-1]].tolist()) == STUDENT_ANSWER


def test_distillm2_chunked_loss_equals_the_loss_module_on_full_logits(world, tmp_path):
    notes = _distillm2_notes(world)
    student = _model(world["tok"], seed=5, layers=2, hidden=32)
    cfg = TrainConfig(epochs=1, batch=2, lr=1e-3, precision="fp32", seed=0, gradient_checkpointing=False)
    trainer = ba.DistiLLM2Trainer(student, world["teacher"], notes, ba.DistiLLM2Config(logit_chunk=3), cfg, tmp_path)
    note = notes[0]
    with torch.no_grad():
        loss, log = trainer.note_loss(note)

        def response(ids, mask):
            return d2.Response(world["teacher"](input_ids=ids[None]).logits, trainer.model(input_ids=ids[None]).logits,
                               mask[None])

        expected = d2.distillm2_loss(response(note.preferred, note.preferred_mask),
                                     response(note.dispreferred, note.dispreferred_mask), alpha=0.1, beta=1.0)
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    assert log["tokens"] == int(note.preferred_mask.sum()) and log["srkl"] > 0 and log["skl"] > 0


def test_distillm2_step_moves_the_student(world, tmp_path):
    student = _model(world["tok"], seed=5, layers=2, hidden=32)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    cfg = TrainConfig(epochs=1, batch=2, lr=1e-3, precision="fp32", seed=0, gradient_checkpointing=False)
    trainer = ba.DistiLLM2Trainer(student, world["teacher"], _distillm2_notes(world), ba.DistiLLM2Config(), cfg,
                                  tmp_path)
    rows = trainer.run()
    assert len(rows) == 1 and np.isfinite(rows[0]["loss"])
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    assert (tmp_path / "model").is_dir() and not (tmp_path / "extra.pt").exists()


def test_distillm2_refuses_another_vocabulary_and_another_prompt(world):
    smol = _model(world["smol_tok"], seed=5, layers=2, family="smollm3", hidden=32)
    with pytest.raises(UserError, match="teacher's vocabulary"):
        ba.check_shared_vocabulary(smol, world["teacher"], world["smol_tok"], world["tok"], world["completion"])
    ba.check_shared_vocabulary(_model(world["tok"], seed=5, layers=2, hidden=32), world["teacher"], world["tok"],
                               world["tok"], world["completion"])
    with pytest.raises(UserError, match="another prompt"):
        ba.prepare_distillm2_note(world["traces"][0], {"prompt": "other", "completion": STUDENT_ANSWER}, world["tok"])


def test_uniform_layer_pairs_of_the_demo_and_paper_shapes():
    assert fkd.uniform_layer_pairs(4, 4) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert fkd.uniform_layer_pairs(36, 40) == [(8, 9), (17, 19), (26, 29), (35, 39)]
