r"""The Mistill objective (Sec. 4.1, App. I.1-I.2) as pure functions of pooled rows and contributions.

The paper's Sec. 4.1 equations and App. I.1's paragraph "Pooled attention, region mass and
contribution" were lost in the text extraction.  This module implements the reconstruction
documented in `docs/mistill_objective.md`, from the surviving text (L9, L51, L210, L480-498,
L504-526, L540, L600, L726) and the earlier draft's Eqs. 5-6 (earlier:L85-95, L223-239).

Notation.  Model M in {T (teacher), S (student)}; a supervised row is a position q; a pool is a
set H of heads with weights w_h = softmax(I_c / tau) (App. I.1, "Head pools"); B span buckets
(App. I.1, "Span buckets") form one axis shared by both models.

* Pooled bucket attention (Eq. A):
      abar^M_q(b) = sum_{h in H} w_h sum_{j <= q, span(j) in b} alpha^{M,h}_{q,j}
* Attention term of phase P (Eq. B), a mean over the phase's rows r (event rows; for P1 also
  the W = 8 window rows before each P1 event) of an epsilon-smoothed KL, teacher first
  (earlier:Eq. 5 writes KL(abar^T || abar^S)):
      L_attn^P = mean_r KL(abar^T_r || abar^S_r)
* Region mass at an event e (Eq. C): m^M_e = sum_{b in region(e)} abar^M_e(b), the region being
  the emitted chapter's shortlist lines (including the carved own-line and sibling buckets).
* Contribution (Eq. D), the pooled heads' direct-logit share of the margin (L210, L498, L600):
      c^M_e = [sum_h w_h < z_h W_O^h , d_e >] / max(|margin_e|, delta)
  with d_e = J_norm(q)^T W_U^T (e_target - softmax_C(competitor logits)): the gradient of
  margin = logit_target - logsumexp(logits_C) with respect to the final residual stream, the
  final RMSNorm frozen and linear.  The direction and the margin are read-out constants
  (detached): the student moves c only through its heads' writes.
* Interaction term (Eq. E), the product of mass and contribution matched by squared error, as
  the earlier draft's PCS = kappa * cos and PRS = R * H were (earlier:L89, L231):
      L_int^P = (1 / |E_P|) sum_e (m^S_e c^S_e - m^T_e c^T_e)^2
* The removed write term (App. I.2; kept behind `terms` / `write_norm`):
      L_write^P = (1 / |E_P|) sum_e (c^S_e - c^T_e)^2,
  `write_norm=True` z-scores c over the note's events of the phase on each side first.
* Total (Eq. F): one mean per event kind, each kind with its own pool; P2 and P2C both weighted
  by lambda_P2:
      L = L_CoT + lambda_P1 (L_attn^P1 + L_int^P1) + lambda_P2 sum_{P in {P2, P2C}} (L_attn^P + L_int^P)
* L_CoT (App. J.2, earlier App. B): token cross-entropy on the trace plus lambda_KL (= 1) times
  the KL from the teacher's renormalised top-32 distribution to the student's full-vocabulary
  distribution read at those ids.

Argument order follows the paper: teacher quantities first.  Teacher inputs are detached
inside every term, so gradients flow only through the student.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F

TERMS_AS_RUN = frozenset({"attn", "inter"})
ALL_TERMS = frozenset({"attn", "inter", "write"})
PHASES = ("P1", "P2", "P2C")


def pool_bucket_attention(attn_rows: torch.Tensor, bucket_of_key: torch.Tensor, head_weights: torch.Tensor,
                          n_buckets: int) -> torch.Tensor:
    """Eq. A: pooled bucket attention.

    attn_rows: [H, R, K] attention probabilities of the pool's heads at R rows over K keys
    (zero beyond the row's own position, as causal attention gives).
    bucket_of_key: [K] or [R, K] long, the bucket of each key token (per row when carving
    differs between rows).  head_weights: [H], summing to 1.  Returns [R, n_buckets].
    """
    mixed = torch.einsum("h,hrk->rk", head_weights.to(attn_rows.dtype), attn_rows)
    index = bucket_of_key if bucket_of_key.dim() == 2 else bucket_of_key.expand(mixed.shape[0], -1)
    out = torch.zeros(mixed.shape[0], n_buckets, dtype=mixed.dtype, device=mixed.device)
    return out.scatter_add(1, index, mixed)


def smoothed(dist: torch.Tensor, eps: float) -> torch.Tensor:
    """Add eps to every bucket and renormalise (future buckets carry no causal mass: the smoothing
    keeps the KL finite without moving mass between the two sides)."""
    dist = dist.clamp_min(0) + eps
    return dist / dist.sum(-1, keepdim=True)


def bucket_kl(teacher_rows: torch.Tensor, student_rows: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """KL(abar^T || abar^S) per row, epsilon-smoothed. teacher_rows, student_rows: [R, B]. Returns [R]."""
    t = smoothed(teacher_rows.detach().float(), eps)
    s = smoothed(student_rows.float(), eps)
    return (t * (t.log() - s.log())).sum(-1)


def attention_term(teacher_rows: torch.Tensor, student_rows: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Eq. B: mean over the phase's rows of KL(abar^T || abar^S); zero when there are no rows."""
    if teacher_rows.shape != student_rows.shape:
        raise ValueError(f"teacher rows {tuple(teacher_rows.shape)} vs student rows {tuple(student_rows.shape)}")
    if teacher_rows.shape[0] == 0:
        return student_rows.sum() * 0.0
    return bucket_kl(teacher_rows, student_rows, eps).mean()


def region_mass(pooled_rows: torch.Tensor, region_mask: torch.Tensor) -> torch.Tensor:
    """Eq. C: m_e = mass of the pooled row on the event's region buckets. [E, B] x [E, B] bool -> [E]."""
    return (pooled_rows * region_mask.to(pooled_rows.dtype)).sum(-1)


def competitor_matrix(competitor_ids: list[list[int]], device=None) -> torch.Tensor:
    """Ragged competitor lists as one [E, C_max] long tensor padded with -1."""
    width = max((len(c) for c in competitor_ids), default=0)
    out = torch.full((len(competitor_ids), max(width, 1)), -1, dtype=torch.long)
    for e, comps in enumerate(competitor_ids):
        out[e, :len(comps)] = torch.tensor(comps, dtype=torch.long)
    return out.to(device) if device is not None else out


def _competitor_logits(logits: torch.Tensor, competitors: torch.Tensor) -> torch.Tensor:
    """Logits of each event's competitors, -inf at the padding."""
    gathered = logits.gather(-1, competitors.clamp_min(0))
    return gathered.masked_fill(competitors < 0, float("-inf"))


def event_margins(logits: torch.Tensor, target_ids: torch.Tensor, competitor_ids) -> torch.Tensor:
    """margin = logit(target) - logsumexp(logits of the competitors), per event row. [E, V] -> [E].

    competitor_ids: ragged lists or a padded [E, C] tensor (-1 = padding)."""
    if logits.shape[0] == 0:
        return logits.new_zeros(0)
    comps = competitor_ids if torch.is_tensor(competitor_ids) else competitor_matrix(competitor_ids, logits.device)
    target = logits.gather(-1, target_ids.to(logits.device)[:, None])[:, 0]
    return target - torch.logsumexp(_competitor_logits(logits, comps.to(logits.device)), dim=-1)


def margin_direction(final_hidden: torch.Tensor, norm_weight: torch.Tensor, norm_eps: float,
                     unembed: torch.Tensor, target_ids: torch.Tensor, competitor_ids,
                     logits: torch.Tensor) -> torch.Tensor:
    """d_e = J_norm^T W_U^T (e_target - softmax_C(competitor logits)), detached.

    final_hidden: [E, D] residual stream entering the final RMSNorm at the decision rows q;
    unembed: [V, D]; logits: [E, V] at the same rows.  The RMSNorm y = g * x / rms(x) is frozen
    and linear: J = diag(g) / rms(x).  The unembedding is read only at the target and competitor ids.
    """
    final_hidden = final_hidden.detach().float()
    logits = logits.detach().float()
    comps = competitor_ids if torch.is_tensor(competitor_ids) else competitor_matrix(competitor_ids, logits.device)
    comps = comps.to(logits.device)
    coeff = -torch.softmax(_competitor_logits(logits, comps), dim=-1)          # [E, C]
    ids = torch.cat([target_ids.to(logits.device)[:, None], comps.clamp_min(0)], dim=1)  # [E, 1 + C]
    coeff = torch.cat([torch.ones_like(coeff[:, :1]), coeff.masked_fill(comps < 0, 0.0)], dim=1)
    rows = unembed.detach().float()[ids]                                       # [E, 1 + C, D]
    w_u = torch.einsum("ec,ecd->ed", coeff, rows)
    rms = final_hidden.pow(2).mean(-1, keepdim=True).add(norm_eps).rsqrt()
    return w_u * norm_weight.detach().float() * rms


def contribution(head_writes: torch.Tensor, head_weights: torch.Tensor, direction: torch.Tensor,
                 margin: torch.Tensor, min_margin: float = 0.1) -> torch.Tensor:
    """Eq. D: c_e = sum_h w_h <z_h W_O^h, d_e> / max(|margin_e|, min_margin).

    head_writes: [E, H, D] each pooled head's write z_h W_O^h at the event row; direction: [E, D];
    margin: [E] the model's own clean margin (detached: a normaliser, not a target).
    """
    dla = torch.einsum("ehd,ed->eh", head_writes.float(), direction.detach().float())
    pooled = (dla * head_weights.float()).sum(-1)
    return pooled / margin.detach().float().abs().clamp_min(min_margin)


def interaction_term(m_teacher: torch.Tensor, c_teacher: torch.Tensor,
                     m_student: torch.Tensor, c_student: torch.Tensor) -> torch.Tensor:
    """Eq. E: (1/|E|) sum_e (m^S_e c^S_e - m^T_e c^T_e)^2; zero when there are no events."""
    if m_student.numel() == 0:
        return m_student.sum() * 0.0
    target = (m_teacher.detach() * c_teacher.detach()).float()
    return ((m_student.float() * c_student.float() - target) ** 2).mean()


def standardise(values: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """z-score over the note's events (App. I.2, the --write-norm form); a single event maps to 0."""
    if values.numel() < 2:
        return values * 0.0
    return (values - values.mean()) / (values.std(unbiased=False) + eps)


def write_term(c_teacher: torch.Tensor, c_student: torch.Tensor, write_norm: bool = False) -> torch.Tensor:
    """App. I.2, removed post hoc: (1/|E|) sum_e (c^S_e - c^T_e)^2, raw or standardised per note."""
    if c_student.numel() == 0:
        return c_student.sum() * 0.0
    t, s = c_teacher.detach().float(), c_student.float()
    if write_norm:
        t, s = standardise(t), standardise(s)
    return ((s - t) ** 2).mean()


def phase_loss(*, teacher_rows: torch.Tensor, student_rows: torch.Tensor,
               m_teacher: torch.Tensor, c_teacher: torch.Tensor,
               m_student: torch.Tensor, c_student: torch.Tensor,
               terms: Iterable[str] = TERMS_AS_RUN, write_norm: bool = False,
               eps: float = 1e-6) -> dict[str, torch.Tensor]:
    """One event kind's terms, each named; `terms` selects which of attn / inter / write enter."""
    terms = frozenset(terms)
    unknown = terms - ALL_TERMS
    if unknown:
        raise ValueError(f"unknown terms {sorted(unknown)}; known: {sorted(ALL_TERMS)}")
    out: dict[str, torch.Tensor] = {}
    if "attn" in terms:
        out["attn"] = attention_term(teacher_rows, student_rows, eps)
    if "inter" in terms:
        out["inter"] = interaction_term(m_teacher, c_teacher, m_student, c_student)
    if "write" in terms:
        out["write"] = write_term(c_teacher, c_student, write_norm)
    return out


def mistill_loss(cot: torch.Tensor, per_phase: Mapping[str, Mapping[str, torch.Tensor]],
                 lambda_p1: float, lambda_p2: float) -> torch.Tensor:
    """Eq. F: L_CoT + lambda_P1 * sum(P1 terms) + lambda_P2 * sum(P2 and P2C terms)."""
    total = cot
    for phase, terms in per_phase.items():
        weight = lambda_p1 if phase == "P1" else lambda_p2
        for value in terms.values():
            total = total + weight * value
    return total


def topk_kl(student_logits: torch.Tensor, teacher_top_ids: torch.Tensor,
            teacher_top_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-position KL(p~_T || p_S) on the teacher's top-k ids (App. J.2, recommended reading).

    p~_T is the teacher's top-k distribution renormalised; p_S the student's full-vocabulary
    softmax read at those ids.  student_logits [T, V], teacher_top_* [T, k].  Returns [T].
    """
    log_ps = torch.log_softmax(student_logits.float(), dim=-1).gather(-1, teacher_top_ids)
    log_pt = torch.log_softmax(teacher_top_logprobs.detach().float(), dim=-1)  # renormalise over k
    # ids the student's vocabulary lacks arrive as -inf: they carry no teacher mass (0 log 0 = 0)
    terms = torch.where(torch.isfinite(log_pt), log_pt.exp() * (log_pt - log_ps), torch.zeros_like(log_ps))
    return terms.sum(-1)


def uld_distance(student_logits: torch.Tensor, teacher_top_logprobs: torch.Tensor) -> torch.Tensor:
    """ULD (Boizard et al. 2024) for a student with another vocabulary: the L1 distance between the
    sorted probability vectors, here over k bins = the teacher's stored top-k. Returns [T]."""
    k = teacher_top_logprobs.shape[-1]
    ps = torch.softmax(student_logits.float(), dim=-1).topk(k, dim=-1).values
    pt = teacher_top_logprobs.detach().float().exp().sort(dim=-1, descending=True).values
    return (ps - pt).abs().sum(-1)


def cot_token_losses(student_logits: torch.Tensor, labels: torch.Tensor, teacher_top_ids: torch.Tensor | None,
                     teacher_top_logprobs: torch.Tensor | None, kl_weight: float = 1.0,
                     uld: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """L_CoT's per-token pieces (CE, kl_weight * KL) at the scored positions (labels != -100), in order.
    (`cot_loss_sums` keeps its fused sum reductions: their rounding is what every unweighted run trained with.)"""
    keep = labels != -100
    logits = student_logits[keep]
    ce = F.cross_entropy(logits.float(), labels[keep], reduction="none")
    if teacher_top_logprobs is None or kl_weight == 0:
        return ce, ce * 0.0
    if uld:
        kl = uld_distance(logits, teacher_top_logprobs[keep])
    else:
        kl = topk_kl(logits, teacher_top_ids[keep], teacher_top_logprobs[keep])
    return ce, kl_weight * kl


def cot_loss_sums(student_logits: torch.Tensor, labels: torch.Tensor, teacher_top_ids: torch.Tensor | None,
                  teacher_top_logprobs: torch.Tensor | None, kl_weight: float = 1.0,
                  uld: bool = False) -> tuple[torch.Tensor, torch.Tensor, int]:
    """L_CoT pieces for one chunk of trace positions: (sum CE, sum KL, number of scored tokens).

    labels: [T], -100 marks positions that are not scored (prompt tokens, padding); the
    teacher arrays align with the same positions (rows of unscored positions are ignored).
    The caller divides the sums over all chunks by the total count: a token mean over the trace.
    """
    keep = labels != -100
    n = int(keep.sum())
    if n == 0:
        zero = student_logits.sum() * 0.0
        return zero, zero, 0
    logits = student_logits[keep]
    ce = F.cross_entropy(logits.float(), labels[keep], reduction="sum")
    if teacher_top_logprobs is None or kl_weight == 0:
        return ce, ce * 0.0, n
    if uld:
        kl = uld_distance(logits, teacher_top_logprobs[keep]).sum()
    else:
        kl = topk_kl(logits, teacher_top_ids[keep], teacher_top_logprobs[keep]).sum()
    return ce, kl_weight * kl, n


def weighted_cot_loss_sums(student_logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                           teacher_top_ids: torch.Tensor | None, teacher_top_logprobs: torch.Tensor | None,
                           kl_weight: float = 1.0, uld: bool = False) -> tuple[torch.Tensor, torch.Tensor, int, float]:
    """`cot_loss_sums` with each position's CE and KL multiplied by `weights` [T] (Vanilla CoT-KD with its token
    loss up-weighted at the teacher's events, App. M.1), and the sum of what the weights add beyond 1: the
    extra loss the up-weighting brings (divided by the token count like the sums, it is comparable with
    Mistill's extra loss)."""
    keep = labels != -100
    n = int(keep.sum())
    if n == 0:
        zero = student_logits.sum() * 0.0
        return zero, zero, 0, 0.0
    ce, kl = cot_token_losses(student_logits, labels, teacher_top_ids, teacher_top_logprobs, kl_weight, uld)
    w = weights[keep].to(ce.dtype)
    extra = float(((w - 1.0) * (ce + kl)).sum().detach())
    return (w * ce).sum(), (w * kl).sum(), n, extra
