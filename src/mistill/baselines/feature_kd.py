r"""Feature-KD, the generic attention-and-representation control of Table 2 (App. J.3, "Feature-KD").

The MiniLM / TinyBERT lineage (Jiao et al., 2020; Wang et al., 2020; Zagoruyko & Komodakis, 2017;
Romero et al., 2015), as the paper runs it: unranked, unphased feature matching at matched data and
schedule, the control against Mistill's ranked head supervision.  The paper gives it in prose only
(App. J.3; App. I.5 adds the unit test that ties its attention term to Mistill's); the equations
below are our reconstruction of that prose, with each choice the prose leaves open marked [ours].

Notation.  Model M in {T (teacher), S (student)} with L_M layers, H_M query heads per layer and width
D_M; B span buckets of App. I.1 (`mistill.distill.buckets`) form one key axis for both models.

* Layer pairs, "four uniformly mapped layer pairs" (1-indexed, METHOD-GUIDE §14's reading):
      (l_S(k), l_T(k)) = (k L_S / 4, k L_T / 4),  k = 1..4
  e.g. student {9, 18, 27, 36} <-> teacher {10, 20, 30, 40} for 36 and 40 layers
  (`uniform_layer_pairs` returns them 0-indexed; k L / 4 is rounded down [ours] when not whole).
* Head-averaged, bucket-pooled attention at a row r of layer l: Mistill's Eq. A with a uniform pool
  over all H_M heads of the layer (`objective.pool_bucket_attention`, weights 1 / H_M):
      abar^M_{l,r}(b) = (1 / H_M) sum_{h=1..H_M} sum_{j <= r, span(j) in b} alpha^{M,l,h}_{r,j}
  Each model averages its own heads, so different head counts (and, through the buckets, different
  tokenizations) need no correspondence between heads.
* Attention term, at R = the 64 trace positions sampled per note, with the epsilon-smoothed KL of
  Mistill's attention term, teacher first (App. I.5: with a uniform pool over one layer's heads
  Mistill's attention term equals this KL):
      L_attn = (1 / 4) sum_k (1 / |R|) sum_{r in R} KL_eps(abar^T_{l_T(k),r} || abar^S_{l_S(k),r})
  [ours] a mean, not a sum, over the four pairs.
* Hidden-state term, at every trace position t in T (the response mask), through one linear adapter
  A_k: R^{D_S} -> R^{D_T} per pair ("the student's through a linear adapter to the teacher's width";
  "adapters", plural, in the seed caveat), both sides RMS-normalised per position before the error:
      rms(x) = x / sqrt(mean_d x_d^2 + eps)
      L_hid = (1 / 4) sum_k (1 / (|T| D_T)) sum_{t in T} || rms(A_k h^S_{l_S(k),t}) - rms(h^T_{l_T(k),t}) ||^2
  [ours] h^M_{l,t} is the residual stream leaving decoder block l (the input of block l + 1, or the
  final norm's input for the last block: what `pooled_attention.LayerInputCapture` keeps; HF's
  `hidden_states[l + 1]` agrees except for the last block, whose entry there is after the final norm); the
  adapter is bias-free (TinyBERT's W_h) and keeps PyTorch's default initialisation; normalisation
  follows the adapter; eps = 1e-6; a mean over the pairs.
* Total, weights 1 and 1, no phases and no events; with L_CoT added, METHOD-GUIDE §14's reading of
  App. J.3 (the SmolLM3-3B arms share L_CoT and "differ only in their own terms"):
      L = L_CoT + 1 * L_attn + 1 * L_hid

Both terms take teacher and student features already paired position by position.  With a shared
tokenizer (Qwen3-4B) the positions are the same tokens; for a student with another tokenizer
(SmolLM3-3B) the paper does not say how positions were paired, and the pairing is the caller's.

Teacher features are detached: gradients reach only the student and the adapters.  Seed the random
number generators before constructing `LinearAdapter` (App. J.3, the adapter-seed caveat).
The student's rows are computed with `pooled_attention.SupervisedRows`, one `RowRequest` per paired
layer with a uniform `LayerPool` (`attention_requests`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mistill.distill.objective import attention_term, pool_bucket_attention
from mistill.distill.pooled_attention import LayerPool, RowRequest
from mistill.errors import UserError

N_PAIRS = 4
N_POSITIONS = 64
ATTN_WEIGHT = 1.0
HIDDEN_WEIGHT = 1.0


def uniform_layer_pairs(n_student_layers: int, n_teacher_layers: int, n_pairs: int = N_PAIRS) -> list[tuple[int, int]]:
    """(student layer, teacher layer), 0-indexed: the k L / n-th layer of each model, k = 1..n."""
    if not 0 < n_pairs <= min(n_student_layers, n_teacher_layers):
        raise UserError(f"Feature-KD cannot map {n_pairs} layer pairs between {n_student_layers} and "
                        f"{n_teacher_layers} layers")
    return [(k * n_student_layers // n_pairs - 1, k * n_teacher_layers // n_pairs - 1) for k in range(1, n_pairs + 1)]


def sample_positions(trace_rows: torch.Tensor, k: int = N_POSITIONS, generator: torch.Generator | None = None) -> torch.Tensor:
    """k of a note's trace rows, uniformly without replacement, in increasing order (all when fewer).

    The paper fixes only the count and that the seed fixes the draw; the sampler is [ours]."""
    if len(trace_rows) <= k:
        return trace_rows.sort().values
    pick = torch.randperm(len(trace_rows), generator=generator)[:k]
    return trace_rows[pick].sort().values


def uniform_layer_pool(layer: int, n_heads: int, device=None) -> LayerPool:
    """Every head of one layer with weight 1 / H: head averaging as a pool."""
    return LayerPool(layer, torch.arange(n_heads, device=device), torch.full((n_heads,), 1.0 / n_heads, device=device))


def attention_requests(layers: Sequence[int], n_heads: int, rows: torch.Tensor,
                       bucket_index: torch.Tensor) -> list[RowRequest]:
    """One request per layer (keyed "fkd:<layer>"), so `SupervisedRows.collect` keeps the layers
    apart instead of summing them; bucket_index is the note's base (uncarved) index [T]."""
    return [RowRequest(f"fkd:{layer}", rows, bucket_index, [uniform_layer_pool(layer, n_heads, rows.device)])
            for layer in layers]


def head_averaged_rows(attn_rows: torch.Tensor, bucket_of_key: torch.Tensor, n_buckets: int) -> torch.Tensor:
    """abar_{l,r}: one layer's attention [H, R, K] averaged over its H heads and pooled into buckets. -> [R, B]."""
    n_heads = attn_rows.shape[0]
    weights = torch.full((n_heads,), 1.0 / n_heads, dtype=attn_rows.dtype, device=attn_rows.device)
    return pool_bucket_attention(attn_rows, bucket_of_key, weights, n_buckets)


def _pairs(teacher: Sequence[torch.Tensor], student: Sequence[torch.Tensor], what: str) -> None:
    if len(teacher) == 0 or len(teacher) != len(student):
        raise UserError(f"Feature-KD {what}: {len(teacher)} teacher layers against {len(student)} student layers")


def attention_map_loss(teacher_rows: Sequence[torch.Tensor], student_rows: Sequence[torch.Tensor],
                       eps: float = 1e-6) -> torch.Tensor:
    """L_attn: mean over layer pairs of the mean over rows of KL_eps(abar^T || abar^S).

    teacher_rows[k], student_rows[k]: [R, B] head-averaged bucket rows of pair k at the same rows."""
    _pairs(teacher_rows, student_rows, "attention")
    for k, (t, s) in enumerate(zip(teacher_rows, student_rows)):
        if t.shape != s.shape or t.dim() != 2:
            raise UserError(f"Feature-KD attention pair {k}: teacher rows {tuple(t.shape)} vs student rows "
                            f"{tuple(s.shape)}; expected one [rows, buckets] shape")
    return torch.stack([attention_term(t, s, eps) for t, s in zip(teacher_rows, student_rows)]).mean()


def rms_normalise(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(mean_d x_d^2 + eps) per position (no gain)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class LinearAdapter(torch.nn.Module):
    """A_k: one bias-free linear map from the student's width to the teacher's per layer pair."""

    def __init__(self, d_student: int, d_teacher: int, n_pairs: int = N_PAIRS):
        super().__init__()
        self.maps = torch.nn.ModuleList(torch.nn.Linear(d_student, d_teacher, bias=False) for _ in range(n_pairs))

    def forward(self, hidden: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if len(hidden) != len(self.maps):
            raise UserError(f"Feature-KD adapter has {len(self.maps)} layer pairs, got {len(hidden)} hidden states")
        return [m(h.to(m.weight.dtype)) for m, h in zip(self.maps, hidden)]


def hidden_state_loss(teacher_hidden: Sequence[torch.Tensor], student_hidden: Sequence[torch.Tensor],
                      mask: torch.Tensor, adapter: LinearAdapter | None = None, eps: float = 1e-6) -> torch.Tensor:
    """L_hid: mean over layer pairs of the masked mean over positions (and over the teacher's width)
    of the squared error between RMS-normalised states.

    teacher_hidden[k]: [..., T, D_T]; student_hidden[k]: [..., T, D_S], mapped by `adapter` when
    given (else already of width D_T); mask: [..., T], bool or 0/1, the trace positions."""
    _pairs(teacher_hidden, student_hidden, "hidden states")
    if adapter is not None:
        student_hidden = adapter(student_hidden)
    keep = mask.float()
    count = keep.sum()
    if count == 0:
        raise UserError("Feature-KD hidden-state mask is empty: no trace position to match")
    losses = []
    for k, (t, s) in enumerate(zip(teacher_hidden, student_hidden)):
        if t.shape != s.shape or tuple(t.shape[:-1]) != tuple(mask.shape):
            raise UserError(f"Feature-KD hidden pair {k}: teacher {tuple(t.shape)}, student (mapped) "
                            f"{tuple(s.shape)}, mask {tuple(mask.shape)}; expected [..., T, D_T] and [..., T]")
        err = (rms_normalise(s.float(), eps) - rms_normalise(t.detach().float(), eps)).pow(2).mean(-1)
        losses.append((torch.where(keep > 0, err, 0.0) * keep).sum() / count)
    return torch.stack(losses).mean()


def feature_kd_terms(*, teacher_rows: Sequence[torch.Tensor], student_rows: Sequence[torch.Tensor],
                     teacher_hidden: Sequence[torch.Tensor], student_hidden: Sequence[torch.Tensor],
                     mask: torch.Tensor, adapter: LinearAdapter | None = None,
                     eps_attn: float = 1e-6, eps_rms: float = 1e-6) -> dict[str, torch.Tensor]:
    """The two Feature-KD terms, named: {"attn": L_attn, "hidden": L_hid}."""
    return {"attn": attention_map_loss(teacher_rows, student_rows, eps_attn),
            "hidden": hidden_state_loss(teacher_hidden, student_hidden, mask, adapter, eps_rms)}


def feature_kd_loss(cot: torch.Tensor, terms: dict[str, torch.Tensor], attn_weight: float = ATTN_WEIGHT,
                    hidden_weight: float = HIDDEN_WEIGHT) -> torch.Tensor:
    """L = L_CoT + attn_weight * L_attn + hidden_weight * L_hid (the paper: weights 1 and 1)."""
    return cot + attn_weight * terms["attn"] + hidden_weight * terms["hidden"]
