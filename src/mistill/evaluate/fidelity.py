"""Fidelity metrics (App. K, "Fidelity"): how close an arm's reasoning stays to the teacher's.

* Teacher-trace PPL: the student's perplexity on the teacher's test trace under teacher
  forcing, PPL(note) = exp(mean_t -log p_S(x_t | x_<t)) over the completion tokens;
  reported as the median over notes.
* BLEU-4: sentence level, whitespace tokens, brevity penalty, no smoothing, arm trace
  against teacher trace (the reasoning blocks), mean over notes:
      BLEU = BP * exp(1/4 sum_{n=1..4} log p_n),  BP = min(1, exp(1 - r/c)),
  p_n the clipped n-gram precision, r / c the reference / candidate lengths; any p_n = 0
  gives 0 (no smoothing).
* LAS, which App. K computes as a simulatability gain (one simulator): per note
      gain = F1(sim(note ⊕ r), a_T) - F1(sim(note), a_T),
  r the text inside the arm's reasoning block, a_T the teacher's answer; mean over notes.
  App. K calls it the leakage-adjusted simulatability of Wang et al. (2023b), but nothing in it
  adjusts for leakage: Hase et al. (2020), who named LAS, also split the notes by whether the
  rationale alone gives the answer away and average the two groups
  (`mistill.evaluate.leakage_adjusted`, reported beside it). This module computes the gain from the
  simulator's two predictions per note; the simulator (fine-tuned once on the teacher's training
  traces) supplies them.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence

import numpy as np

from mistill.evaluate.task import note_f1

_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)


def reasoning_block(completion: str) -> str:
    """The text inside <think>...</think> (to the end when the block never closed: a truncated
    reasoning is still "inside the block"); the whole completion when there is no block."""
    match = _THINK.search(completion)
    return match.group(1).strip() if match else completion.strip()


def _without_effective_order_advice(record: logging.LogRecord) -> bool:
    """sacrebleu advises `effective_order` for every sentence it scores; plain BLEU-4 leaves it off on
    purpose, so the advice would only repeat once per note in every evaluation's log."""
    return "effective_order" not in record.getMessage()


def sentence_bleu4(hypothesis: str, reference: str) -> float:
    """BLEU-4 in [0, 1] of one hypothesis against one reference, whitespace tokens, no smoothing."""
    from sacrebleu.metrics import BLEU

    sacrebleu_log = logging.getLogger("sacrebleu")
    if _without_effective_order_advice not in sacrebleu_log.filters:
        sacrebleu_log.addFilter(_without_effective_order_advice)
    hyp = " ".join(hypothesis.split())
    ref = " ".join(reference.split())
    # tokenize="none": sacrebleu then splits on whitespace only; effective_order=False keeps all
    # four orders even for short sentences, as plain BLEU-4 does.
    scorer = BLEU(tokenize="none", smooth_method="none", effective_order=False, max_ngram_order=4)
    return scorer.sentence_score(hyp, [ref]).score / 100.0


def mean_bleu4(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    return float(np.mean([sentence_bleu4(h, r) for h, r in zip(hypotheses, references)])) if hypotheses else 0.0


def ppl_from_nll(token_nll: Sequence[float]) -> float:
    """exp of the mean token negative log-likelihood (nats)."""
    if len(token_nll) == 0:
        raise ValueError("no scored tokens")
    return float(math.exp(float(np.mean(token_nll))))


def median_ppl(per_note_nll: Sequence[Sequence[float]]) -> float:
    """App. K: the median over notes of per-note perplexity."""
    return float(np.median([ppl_from_nll(n) for n in per_note_nll]))


def teacher_forced_nll(model, tokenizer, prompt: str, completion: str) -> list[float]:
    """Per-token NLL of the completion tokens of chat_prompt(prompt) + completion under `model`.

    The input is tokenised once with offsets; a token is scored when it starts at or after the
    completion's first character (its logits are read one position earlier).
    """
    import torch

    prefix = tokenizer.chat_prompt(prompt)
    enc = tokenizer.encode(prefix + completion)
    first = next((i for i, (s, _) in enumerate(enc.offsets) if s >= len(prefix)), None)
    if first is None or first == 0:
        raise ValueError("completion has no tokens of its own")
    ids = torch.tensor([enc.ids], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits[first - 1:-1], dim=-1)
    target = ids[0, first:]
    return (-logp.gather(1, target[:, None])[:, 0]).tolist()


def simulatability_gain_per_note(pred_with_rationale: Sequence[Sequence[str]], pred_note_only: Sequence[Sequence[str]],
                                 teacher_answers: Sequence[Sequence[str]]) -> list[float]:
    """App. K's LAS of each note, a simulatability gain: F1(sim(note ⊕ r), a_T) - F1(sim(note), a_T)."""
    if not (len(pred_with_rationale) == len(pred_note_only) == len(teacher_answers)):
        raise ValueError("simulatability gain inputs differ in length")
    return [note_f1(w, a) - note_f1(n, a) for w, n, a in zip(pred_with_rationale, pred_note_only, teacher_answers)]


def simulatability_gain(pred_with_rationale, pred_note_only, teacher_answers) -> float:
    """App. K's LAS: the mean over notes of the simulatability gain."""
    values = simulatability_gain_per_note(pred_with_rationale, pred_note_only, teacher_answers)
    return float(np.mean(values)) if values else 0.0
