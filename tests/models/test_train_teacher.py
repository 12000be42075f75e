"""Teacher training: example boundaries, the shared-prefix batch equals full forwards, learning."""

from __future__ import annotations

import math
import random

import pytest
import torch

from mistill.models.architectures import TinyArchitecture, build_model
from mistill.models.tokenizers import CompactTokenizer, build_remap, qwen3_tokenizer
from mistill.models.train_teacher import (
    IGNORE,
    TeacherExample,
    batch_loss,
    common_prefix_length,
    lr_at,
    make_batches,
    make_example,
    sampled_shortlist,
    train,
)
from mistill.world.inventory import Inventory
from mistill.world.types import Code, Note

ARCH = {"family": "qwen3", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8}
INVENTORY_LINES = "\n".join(f"N18.{i} chronic kidney disease stage {i}" for i in range(1, 7))
COMPLETIONS = ["<think>\nthe findings point to chapter N.\nN18.4 rejected.\nN18.3 accepted.\n</think>\n\n[\"N18.3\"]",
               "<think>\nN18.5 accepted.\n</think>\n\n[\"N18.5\"]",
               "<think>\nN18.2 rejected.\nN18.1 accepted.\n</think>\n\n[\"N18.1\"]"]


@pytest.fixture(scope="module")
def tokenizer():
    base = qwen3_tokenizer()
    notes = ["stage 3 kidney disease", "stage 5 kidney disease noted", "stage 1 only"]
    texts = [base.chat_prompt(f"{INVENTORY_LINES}\n\n{n}") for n in notes] + COMPLETIONS
    return CompactTokenizer(base, build_remap(base, texts))


@pytest.fixture(scope="module")
def examples(tokenizer):
    notes = ["stage 3 kidney disease", "stage 5 kidney disease noted", "stage 1 only"]
    return [make_example(tokenizer, f"n{i}", "full", f"{INVENTORY_LINES}\n\n{note}", completion)
            for i, (note, completion) in enumerate(zip(notes, COMPLETIONS))]


def tiny_model(tokenizer, seed=0):
    return build_model(TinyArchitecture.from_params(ARCH), vocab_size=tokenizer.vocab_size,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, seed=seed,
                       attn_implementation="sdpa")


def test_example_boundary_is_the_completion(tokenizer, examples):
    ex = examples[0]
    assert ex.ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(list(ex.ids[ex.n_prompt:-1])) == COMPLETIONS[0]
    assert tokenizer.decode(list(ex.ids[:ex.n_prompt])).endswith("<|im_start|>assistant\n")


def reference_loss(model, batch):
    """The obvious computation: each example in full, mean over all completion tokens of the batch."""
    total, count = 0.0, 0
    for ex in batch:
        ids = torch.tensor([ex.ids])
        labels = ids.clone()
        labels[0, :ex.n_prompt] = IGNORE
        logits = model(ids).logits[0, :-1]
        target = labels[0, 1:]
        keep = target != IGNORE
        total = total + torch.nn.functional.cross_entropy(logits[keep], target[keep], reduction="sum")
        count += int(keep.sum())
    return total / count


def test_shared_prefix_batch_equals_full_forwards(tokenizer, examples):
    shared = common_prefix_length([ex.ids for ex in examples])
    assert shared > 40  # the inventory block is shared
    model = tiny_model(tokenizer).double()
    loss, n_tokens = batch_loss(model, examples, min_shared=8)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = reference_loss(model, examples)
    expected.backward()
    assert n_tokens == sum(len(ex.ids) - ex.n_prompt for ex in examples)
    torch.testing.assert_close(loss, expected)
    for got, want in zip(grads, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, want)
    # and the unshared (padded) path gives the same number
    model.zero_grad()
    torch.testing.assert_close(batch_loss(model, examples, min_shared=10 ** 6)[0], expected)


def test_training_learns_the_traces(tokenizer, examples):
    torch.set_num_threads(1)
    model = tiny_model(tokenizer)
    with torch.no_grad():
        before = float(batch_loss(model, examples)[0])
    log = train(model, examples, {"seed": 0, "epochs": 40, "batch_size": 3, "lr": 1e-2, "warmup_share": 0.1},
                progress=False)
    with torch.no_grad():
        after = float(batch_loss(model, examples)[0])
    assert len(log) == 40 and after < before / 3
    # seeded: the same run twice gives the same weights
    again = tiny_model(tokenizer)
    train(again, examples, {"seed": 0, "epochs": 2, "batch_size": 2, "lr": 3e-3}, progress=False)
    third = tiny_model(tokenizer)
    train(third, examples, {"seed": 0, "epochs": 2, "batch_size": 2, "lr": 3e-3}, progress=False)
    assert all(torch.equal(p, q) for p, q in zip(again.parameters(), third.parameters()))


def test_lr_schedule():
    # App. J.2: linear warm-up, then cosine decay to zero
    assert lr_at(0, 100, 1.0, 0.05) == pytest.approx(0.2)
    assert lr_at(4, 100, 1.0, 0.05) == pytest.approx(1.0)
    assert lr_at(5 + 95 // 2, 100, 1.0, 0.05) == pytest.approx(0.5 * (1 + math.cos(math.pi * 47 / 95)))
    assert lr_at(99, 100, 1.0, 0.05) < 0.01


def test_batches_are_one_kind_each():
    exs = [TeacherExample(str(i), "full" if i % 3 else "shortlist", (1, 2, 3), 1) for i in range(20)]
    batches = make_batches(exs, 4, random.Random(0))
    assert all(len({ex.kind for ex in b}) == 1 for b in batches)
    assert sorted(ex.note_id for b in batches for ex in b) == sorted(ex.note_id for ex in exs)


def test_sampled_shortlist_keeps_order_and_siblings():
    codes = [Code(c, c) for c in ("N18.3", "A01.1", "N18.4", "B02.2", "A01.2", "C03.3", "D04.4", "N18.5")]
    inventory = Inventory(codes)
    note = Note("n", "p", "text", ("N18.3", "A01.1"))
    shortlist = sampled_shortlist(note, inventory, 6, random.Random(0), recall=1.0)
    chosen = [c.code for c in shortlist]
    assert {"N18.3", "N18.4", "N18.5", "A01.1", "A01.2"} <= set(chosen) and len(chosen) == 6
    assert chosen == [c.code for c in codes if c.code in chosen]  # the shared order
