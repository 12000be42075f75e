"""The decision margin and the entropy of a close call (Sec. 2.2, App. C "Decision margin").

    margin(q)  = logit(target) - logsumexp(logits of the competitors)      [nats]
    entropy(q) = H(softmax over {target} u competitors)                       [nats]

Both are read from the logits at q = pos - 1, the position whose output is the
decided token.

A model run in bfloat16 writes its logits, and so its margins, on bf16's grid: 8 significant bits,
so numbers in [2^e, 2^(e+1)) sit 2^(e-7) apart (`bf16_spacing`).  At the paper's margins of 16 to 32
nats that is 0.125 nats, which is why its medians of edit effects fall on multiples of 0.125 (App. E).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

BF16_SIGNIFICANT_BITS = 8     # 7 stored, 1 implicit


def margin_and_entropy(logits: torch.Tensor, target_id: int, competitor_ids: Sequence[int]
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """`logits[..., V]` -> (margin[...], entropy[...]), in float32 (float64 kept); differentiable."""
    index = torch.tensor([target_id, *competitor_ids], device=logits.device)
    sel = logits.index_select(-1, index)
    sel = sel if sel.dtype == torch.float64 else sel.float()
    margin = sel[..., 0] - torch.logsumexp(sel[..., 1:], dim=-1)
    logp = torch.log_softmax(sel, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return margin, entropy


def margin(logits: torch.Tensor, target_id: int, competitor_ids: Sequence[int]) -> torch.Tensor:
    return margin_and_entropy(logits, target_id, competitor_ids)[0]


def bf16_spacing(x: float) -> float:
    """The distance between adjacent bfloat16 numbers at magnitude |x| (0 for x = 0)."""
    if x == 0:
        return 0.0
    return math.ldexp(1.0, math.frexp(abs(x))[1] - BF16_SIGNIFICANT_BITS)
