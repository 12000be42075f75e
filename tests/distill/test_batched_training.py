"""Several notes in one forward (distill.train.notes_per_forward) give each note the loss, the gradient and the
optimiser steps of one-note forwards, to fp32 rounding: right padding is invisible under causal attention."""

import numpy as np
import pytest
import torch

from mistill.distill import arms
from mistill.distill import pools as pl
from mistill.distill import targets as tg
from mistill.distill.trainer import TrainConfig, Trainer
from mistill.errors import UserError
from mistill.models.tokenizers import CompactTokenizer, build_remap, smollm3_tokenizer
from tests.distill.conftest import NOTE_TEXT
from tests.distill.test_training import _head_sets, _model, targets_world

torch.set_num_threads(1)

# three notes of three lengths: the same trace after notes of 70, 40 and 95 words
NOTES = {"short": " ".join(NOTE_TEXT.split()[:40]), "mid": NOTE_TEXT,
         "long": NOTE_TEXT + " " + " ".join(f"more{i}" for i in range(25))}


@pytest.fixture(scope="module")
def world(tmp_path_factory, completion, events):
    tmp_path = tmp_path_factory.mktemp("batched")
    tok, _, prompts, manifest = targets_world(tmp_path, NOTES, completion, events, layers=3,
                                              head_sets=_head_sets(3, 4, 0), k=6)
    smol_base = smollm3_tokenizer()
    smol_tok = CompactTokenizer(smol_base, build_remap(smol_base, [smol_base.chat_prompt(p) + completion
                                                                   for p in prompts.values()]))
    return {"tok": tok, "smol_tok": smol_tok, "dir": tmp_path / "targets", "notes": manifest["notes"]}


def _notes(world, student_tok, arm):
    out = []
    for note_id in world["notes"]:
        meta, arrays = tg.read_note_targets(world["dir"] / f"{note_id}.npz")
        out.append(arms.prepare_note(meta, arrays, student_tok, world["tok"], arm))
    return out


def _student(world, family):
    if family == "smollm3":
        return world["smol_tok"], _model(world["smol_tok"], seed=4, layers=2, family="smollm3")
    return world["tok"], _model(world["tok"], seed=3, layers=2)


ARMS = {"vanilla": arms.ArmConfig(arm="vanilla"),
        "mistill": arms.ArmConfig(arm="mistill", lambda_p1=1.0, lambda_p2=1.0, row_chunk=4)}


def _grads(model, arm, pools, hook, groups):
    """Each note's log and the gradient of the notes' summed loss, one forward per group."""
    model.zero_grad(set_to_none=True)
    logs = []
    for group in groups:
        losses = arms.notes_loss(model, group, arm, pools, hook)
        sum(loss for loss, _ in losses).backward()
        logs += [log for _, log in losses]
    return logs, torch.cat([p.grad.flatten().double() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("family", ["qwen3", "smollm3"])
@pytest.mark.parametrize("arm_name", ["vanilla", "mistill"])
def test_one_forward_of_three_notes_gives_each_its_own_loss_and_gradient(world, family, arm_name):
    """Against the notes one forward each: in float64 the losses and gradients agree to 1e-7 (what is left is
    the pooled rows' and the losses' own float32 steps); in float32 to within the float32 model's own error
    (its distance from the float64 forward), the same size as a change of thread count."""
    arm = ARMS[arm_name]
    tok, model = _student(world, family)
    notes = _notes(world, tok, arm)
    assert len({len(n.ids) for n in notes}) == 3   # three lengths: two of the rows are padded
    pools = pl.build_pools(_head_sets(2, 4, 5), 5) if arm.arm == "mistill" else None
    hook = None
    if pools:
        from mistill.distill.mechanism import supervised_layers
        from mistill.distill.pooled_attention import SupervisedRows

        hook = SupervisedRows(model, supervised_layers(pools, pools["P1"]), row_chunk=arm.row_chunk)

    alone32, grad_alone32 = _grads(model, arm, pools, hook, [[n] for n in notes])
    together32, grad_together32 = _grads(model, arm, pools, hook, [notes])
    model.double()
    alone64, grad_alone64 = _grads(model, arm, pools, hook, [[n] for n in notes])
    together64, grad_together64 = _grads(model, arm, pools, hook, [notes])
    assert len(together64) == 3 and grad_alone64.abs().max() > 0.1
    assert (grad_together64 - grad_alone64).abs().max() < 1e-7
    for a, b in zip(alone64, together64):
        assert set(a) == set(b)
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-7, abs=1e-9), key
    float32_error = (grad_alone32 - grad_alone64).abs().max()
    assert (grad_together32 - grad_alone32).abs().max() <= 4 * float32_error
    for a, b in zip(alone32, together32):
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
    if arm.arm == "mistill":
        assert {"P1_attn", "P2_attn", "P2C_inter"} <= set(together64[0])


def test_a_batched_run_takes_the_steps_of_a_one_note_run(world, tmp_path, monkeypatch):
    """Two epochs of two optimiser steps (a batch of two notes, then one) in float32 (autocast off, so only
    float32 rounding differs): the first step's losses and gradient norm equal the one-note run's to 1e-6;
    later steps to 1e-3, since AdamW normalises each coordinate's step and a coordinate whose gradient is at
    rounding level moves by up to the learning rate either way."""
    import contextlib

    monkeypatch.setattr(Trainer, "autocast", lambda self: contextlib.nullcontext())
    arm = ARMS["mistill"]
    pools = pl.build_pools(_head_sets(2, 4, 5), 5)
    runs = {}
    for per_forward in (1, 2):
        cfg = TrainConfig(epochs=2, batch=2, lr=3e-3, precision="fp32", seed=0, gradient_checkpointing=False,
                          save_every=100, notes_per_forward=per_forward)
        model = _model(world["tok"], seed=3, layers=2)
        runs[per_forward] = Trainer(model, _notes(world, world["tok"], arm), arm, cfg, tmp_path / str(per_forward),
                                    pools=pools).run()
    rows1, rows2 = runs[1], runs[2]
    assert [r["notes"] for r in rows1] == [r["notes"] for r in rows2] == [2, 1, 2, 1]
    for step, (a, b) in enumerate(zip(rows1, rows2)):
        for key in ("loss", "cot", "attn", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-6 if step == 0 else 1e-3), (step, key)


def test_one_note_per_forward_keeps_the_recorded_recipe_and_a_bad_count_is_refused():
    assert "notes_per_forward" not in TrainConfig().as_dict()   # runs trained before the setting keep their identity
    assert TrainConfig(notes_per_forward=4).as_dict()["notes_per_forward"] == 4
    with pytest.raises(UserError, match="notes_per_forward"):
        TrainConfig(notes_per_forward=0)


def test_a_batch_of_one_is_the_note_alone_bit_for_bit(world):
    """notes_per_forward 1 is the one-note forward exactly: the demo's runs before the setting are unchanged."""
    arm = ARMS["mistill"]
    tok, model = _student(world, "qwen3")
    note = _notes(world, tok, arm)[0]
    ids = note.ids[None]
    with torch.no_grad():
        padded = arms.padded_ids([note], 0, "cpu")
        assert torch.equal(padded, ids)
        assert np.array_equal(model.model(input_ids=padded).last_hidden_state.numpy(),
                              model.model(input_ids=ids).last_hidden_state.numpy())
