"""Fidelity metrics: BLEU-4 against a hand computation and sacrebleu, PPL, LAS (App. K's simulatability gain)."""

import math
from collections import Counter

import pytest
import sacrebleu

from mistill.evaluate import fidelity


def _bleu4_by_hand(hyp: str, ref: str) -> float:
    h, r = hyp.split(), ref.split()
    logs = []
    for n in range(1, 5):
        hn = Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
        rn = Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
        match = sum(min(c, rn[g]) for g, c in hn.items())
        total = max(len(h) - n + 1, 0)
        if match == 0:
            return 0.0
        logs.append(math.log(match / total))
    bp = 1.0 if len(h) > len(r) else math.exp(1 - len(r) / len(h))
    return bp * math.exp(sum(logs) / 4)


@pytest.mark.parametrize("hyp,ref", [
    ("the patient has chronic kidney disease stage 3 , N18.3 fits", "the patient has chronic kidney disease , N18.3 fits best"),
    ("a b c d e f", "a b c d e f"),
    ("a b c d x f g", "a b c d e f g h i"),
])
def test_bleu4_matches_hand_computation(hyp, ref):
    assert fidelity.sentence_bleu4(hyp, ref) == pytest.approx(_bleu4_by_hand(hyp, ref), abs=1e-9)


def test_bleu4_no_smoothing_and_whitespace_tokens():
    # no 4-gram overlap -> exactly zero (sacrebleu's default exp smoothing would not give 0)
    assert fidelity.sentence_bleu4("a b c x d e", "a b c y d e") == 0.0
    assert sacrebleu.sentence_bleu("a b c x d e", ["a b c y d e"]).score > 0
    # newlines and runs of spaces are whitespace; punctuation glued to words is not split off
    assert fidelity.sentence_bleu4("a\nb  c d.", "a b c d.") == pytest.approx(1.0)
    assert fidelity.sentence_bleu4("a b c d.", "a b c d .") == 0.0


def test_bleu4_logs_no_effective_order_advice_per_sentence(caplog):
    """Plain BLEU-4 turns effective_order off on purpose: sacrebleu's advice about it is dropped, its
    other warnings are not."""
    import logging

    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        fidelity.sentence_bleu4("a b c d e", "a b c d e")
        fidelity.sentence_bleu4("a b c d e", "a b c d f")
        logging.getLogger("sacrebleu").warning("another warning")
    assert [r.getMessage() for r in caplog.records] == ["another warning"]


def test_reasoning_block():
    assert fidelity.reasoning_block('<think>\nfirst\n</think>\n\n["A01.1"]') == "first"
    assert fidelity.reasoning_block("<think>\ntruncated reasoning") == "truncated reasoning"


def test_ppl_and_median():
    assert fidelity.ppl_from_nll([math.log(4.0)] * 3) == pytest.approx(4.0)
    assert fidelity.median_ppl([[0.0], [math.log(2)], [math.log(8)]]) == pytest.approx(2.0)


def test_simulatability_gain_hand_worked():
    teacher = [["A", "B"], ["C"]]
    with_r = [["A", "B"], ["D"]]
    note_only = [["A"], ["C"]]
    # note 0: 1 - 2/3 ; note 1: 0 - 1
    assert fidelity.simulatability_gain_per_note(with_r, note_only, teacher) == pytest.approx([1 / 3, -1.0])
    assert fidelity.simulatability_gain(with_r, note_only, teacher) == pytest.approx((1 / 3 - 1) / 2)


def test_teacher_forced_nll_matches_the_models_own_loss():
    import torch

    from mistill.models.architectures import TinyArchitecture, build_model
    from mistill.models.tokenizers import CompactTokenizer, build_remap, qwen3_tokenizer

    base = qwen3_tokenizer()
    prompt, completion = "Code this note.", "<think>\nN18.9 fits.\n</think>\n\n[\"N18.9\"]"
    prefix = base.chat_prompt(prompt)
    tok = CompactTokenizer(base, build_remap(base, [prefix + completion]))
    arch = TinyArchitecture(family="qwen3", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    model = build_model(arch, vocab_size=tok.vocab_size, eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id, seed=0)
    nll = fidelity.teacher_forced_nll(model, tok, prompt, completion)
    ids = torch.tensor([tok.encode(prefix + completion).ids])
    n_prefix = len(tok.encode(prefix).ids)
    labels = ids.clone()
    labels[0, :n_prefix] = -100
    with torch.no_grad():
        loss = model(input_ids=ids, labels=labels).loss
    assert len(nll) == ids.shape[1] - n_prefix
    assert sum(nll) / len(nll) == pytest.approx(float(loss), rel=1e-5)
