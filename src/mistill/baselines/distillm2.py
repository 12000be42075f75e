r"""DistiLLM-2's contrastive loss (CALD), the DistiLLM-2 arm of Table 2 (App. J.3).

Reference: J. Ko, T. Chen, S. Kim, T. Ding, L. Liang, I. Zharkov and S.-Y. Yun (2025), "DistiLLM-2:
A Contrastive Approach Boosts the Distillation of LLMs", ICML 2025, PMLR 267: 31044-31062, Sec. 3:
the Contrastive Approach with asymmetric Loss Dynamics (CALD), a skew KL on teacher-generated
responses plus a skew reverse KL on student-generated responses.  The skew divergences are those of
DistiLLM (Ko et al., ICML 2024).  The paper's text was not at hand when this was written (only its
abstract), so the equations below are stated as the official code computes them -- the code the arm
vendored, and the authority App. J.3 cites.  Official code: github.com/jongwooko/distillm-2 at commit
fe4cf9b (the commit App. J.3 vendored), src/distillm_trainer.py: `DistiLLMTrainer.get_batch_logps`
(the two divergences, the mask and the averaging) and `DistiLLMTrainer.kd_loss` with
loss_type "distillm_v2" (the weighting).  This module is our own implementation of those
definitions, not a copy of that file.

Notation.  At a response position t, p = softmax(z^T_t) is the teacher's next-token distribution and
q = softmax(z^S_t) the student's, over one shared vocabulary; a in [0, 1) is the skew (alpha).

* Skew KL, on the teacher's responses y_T (the code's "chosen" side):
      SKL^a_t = KL(p || a p + (1 - a) q) = sum_v p_v [log p_v - log(a p_v + (1 - a) q_v)]
* Skew reverse KL, on the student's own responses y_S (the code's "rejected" side):
      SRKL^a_t = KL(q || (1 - a) p + a q) = sum_v q_v [log q_v - log((1 - a) p_v + a sg(q_v))]
  sg = stop-gradient: the official code detaches the student's share of this mixture, so q moves
  only as the first argument (the value is the same; only the gradient differs).
* Per sequence y with response mask M, the token mean:  D(y) = (1 / |M|) sum_{t in M} D_t
* CALD, a mean over sequences, weighted as the official code weights it:
      L = (2 - beta) mean_{y in Y_T} SKL^a(y) + beta mean_{y in Y_S} SRKL^a(y)
  At beta = 1 (the default) this is the plain, unhalved sum of the two terms.

The mixtures are formed in log space, log(a p + (1 - a) q) = logaddexp(log a + log p,
log(1 - a) + log q), from log-softmaxes taken in float32 or wider; 0 log 0 = 0.  At a = 0 the terms
are the plain forward KL(p || q) and reverse KL(q || p).  Teacher logits are detached: gradients
reach only the student.

Settled from the official code (fe4cf9b, src/distillm_trainer.py), i.e. the published defaults:

* alpha = 0.1 on both sides (`self.base_alpha_1, self.base_alpha_2 = 0.1, 0.1` in `__init__`).
* No curriculum on alpha.  `self.update_alpha = False` is hard-coded, so `logp_logq` / `logq_logp`
  stay None and `get_batch_logps` falls back to the base alpha; its adaptive branch
  (a = clip(1 - (1 - a0) g0 / g, 0.01, a0), g the per-sequence gap between exp of the mean teacher
  and exp of the mean student response log-likelihood) is never reached, and is not implemented here.
* beta = 1.  `self.gradual_beta = False` is hard-coded; the disabled schedule is `gradual_beta`
  below, for reference.  The DPO-style `beta` argument (0.1) does not enter the distillm_v2 loss.
* Averaging (`average_log_prob=True`, then `losses.mean()`): each sequence's per-token divergences
  are summed over its response mask and divided by its own count, then averaged over sequences -- a
  mean of per-sequence means, not a token mean over the batch.
* Mask and shift: `loss_mask = labels != -100` after the causal shift (labels[:, 1:] against
  logits[:, :-1]), i.e. the response tokens only, never the prompt.  Here mask[b, t] marks the
  logits row t whose next token is a response token: the caller shifts.
* Exact KLs (the p log p and q log q terms included), temperature 1, over the full vocabulary; the
  teacher's forward runs under no_grad; the SRKL mixture detaches the student (`vocab_logps.detach()`),
  the SKL mixture does not.
* Data: each prompt pairs a teacher response (chosen) with a student response (rejected).  In our arm
  (App. J.3) they are the teacher's trace and the untrained student's own generation for the prompt.

For logits computed chunk by chunk, sum `*_per_token` values times the mask per sequence over the
chunks and divide by the sequence's mask count; `sequence_mean` does this for a whole sequence.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from mistill.errors import UserError

DEFAULT_ALPHA = 0.1   # base_alpha_1 = base_alpha_2 = 0.1 (official code)
DEFAULT_BETA = 1.0    # gradual_beta = False (official code)


class Response(NamedTuple):
    """One side of CALD: both models' logits on the same responses and the response mask.

    teacher_logits, student_logits: [batch, seq, vocab]; mask: [batch, seq], bool or 0/1, marking
    the logits rows whose next token is a response token."""

    teacher_logits: torch.Tensor
    student_logits: torch.Tensor
    mask: torch.Tensor


def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not 0.0 <= alpha < 1.0:   # NaN fails too
        raise UserError(f"DistiLLM-2 skew alpha must lie in [0, 1), got {alpha}")
    return alpha


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    """log-softmax over the vocabulary in float32 or wider (bf16 logits lose the tail otherwise)."""
    return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


def _log_mix(log_a: torch.Tensor, log_b: torch.Tensor, weight_a: float) -> torch.Tensor:
    """log(w a + (1 - w) b) from log a and log b, for w in [0, 1]."""
    return torch.logaddexp(log_a + _log(weight_a), log_b + _log(1.0 - weight_a))


def _kl_from_logs(log_w: torch.Tensor, log_m: torch.Tensor) -> torch.Tensor:
    """sum_v w_v (log w_v - log m_v) with 0 log 0 = 0 (a -inf logit carries no mass)."""
    live = torch.isfinite(log_w)
    diff = torch.where(live, log_w, 0.0) - torch.where(live, log_m, 0.0)
    return (log_w.exp() * diff).sum(-1)


def skew_forward_kl_per_token(teacher_logits: torch.Tensor, student_logits: torch.Tensor,
                              alpha: float = DEFAULT_ALPHA) -> torch.Tensor:
    """SKL^a_t = KL(p || a p + (1 - a) q) at every position. [..., V] x [..., V] -> [...]."""
    alpha = _check_alpha(alpha)
    log_p = _log_probs(teacher_logits.detach())
    log_q = _log_probs(student_logits)
    return _kl_from_logs(log_p, _log_mix(log_p, log_q, alpha))


def skew_reverse_kl_per_token(teacher_logits: torch.Tensor, student_logits: torch.Tensor,
                              alpha: float = DEFAULT_ALPHA, stop_mixture_grad: bool = True) -> torch.Tensor:
    """SRKL^a_t = KL(q || (1 - a) p + a q) at every position. [..., V] x [..., V] -> [...].

    stop_mixture_grad (official code: True) detaches the student's share of the mixture."""
    alpha = _check_alpha(alpha)
    log_p = _log_probs(teacher_logits.detach())
    log_q = _log_probs(student_logits)
    mix_q = log_q.detach() if stop_mixture_grad else log_q
    return _kl_from_logs(log_q, _log_mix(log_p, mix_q, 1.0 - alpha))


def _check_response(teacher_logits: torch.Tensor, student_logits: torch.Tensor, mask: torch.Tensor) -> None:
    if teacher_logits.dim() != 3 or teacher_logits.shape != student_logits.shape:
        raise UserError(f"DistiLLM-2 needs teacher and student logits of one shape [batch, seq, vocab], got "
                        f"{tuple(teacher_logits.shape)} and {tuple(student_logits.shape)}")
    if tuple(mask.shape) != tuple(student_logits.shape[:2]):
        raise UserError(f"DistiLLM-2 response mask {tuple(mask.shape)} does not match the logits' "
                        f"[batch, seq] {tuple(student_logits.shape[:2])}")


def sequence_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each sequence's mean over its response positions. [B, T] x [B, T] -> [B].

    Masked-out positions are excluded even where their value is not finite."""
    if tuple(mask.shape) != tuple(per_token.shape):
        raise UserError(f"DistiLLM-2 response mask {tuple(mask.shape)} does not match {tuple(per_token.shape)}")
    keep = mask.to(per_token.dtype)
    counts = keep.sum(-1)
    empty = (counts == 0).nonzero().flatten().tolist()
    if empty:
        raise UserError(f"DistiLLM-2 response mask is empty for sequence(s) {empty}: no response token to score")
    values = torch.where(keep > 0, per_token, 0.0) * keep
    return values.sum(-1) / counts


def skew_forward_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor, mask: torch.Tensor,
                    alpha: float = DEFAULT_ALPHA) -> torch.Tensor:
    """mean over sequences of the per-sequence token mean of SKL^a (the teacher-response term)."""
    _check_response(teacher_logits, student_logits, mask)
    return sequence_mean(skew_forward_kl_per_token(teacher_logits, student_logits, alpha), mask).mean()


def skew_reverse_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor, mask: torch.Tensor,
                    alpha: float = DEFAULT_ALPHA, stop_mixture_grad: bool = True) -> torch.Tensor:
    """mean over sequences of the per-sequence token mean of SRKL^a (the student-response term)."""
    _check_response(teacher_logits, student_logits, mask)
    per_token = skew_reverse_kl_per_token(teacher_logits, student_logits, alpha, stop_mixture_grad)
    return sequence_mean(per_token, mask).mean()


def distillm2_loss(teacher_response: Response, student_response: Response, alpha: float = DEFAULT_ALPHA,
                   beta: float = DEFAULT_BETA) -> torch.Tensor:
    """CALD: (2 - beta) SKL^a on the teacher's responses + beta SRKL^a on the student's responses.

    Each term is a mean over its sequences of per-sequence token means (the official code's
    `average_log_prob=True` then `losses.mean()`); beta = 1 is the plain sum."""
    beta = float(beta)
    if not 0.0 <= beta <= 2.0:
        raise UserError(f"DistiLLM-2 beta must lie in [0, 2] (the terms are weighted 2 - beta and beta), got {beta}")
    skl = skew_forward_kl(*teacher_response, alpha=alpha)
    srkl = skew_reverse_kl(*student_response, alpha=alpha)
    return (2.0 - beta) * skl + beta * srkl


def gradual_beta(step: int, max_steps: int) -> float:
    """The official code's disabled beta schedule (`gradual_beta = True`): 1 rising linearly to 1.5
    over the first half of training.  Not part of the published defaults; kept for reference."""
    return 1.0 + 0.5 * min(1.0, 2.0 * step / max_steps)
