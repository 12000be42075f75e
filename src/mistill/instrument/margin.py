"""The decision margin and the entropy of a close call (Sec. 2.2, App. C "Decision margin").

    margin(q)  = logit(target) - logsumexp(logits of the competitors)      [nats]
    entropy(q) = H(softmax over {target} u competitors)                       [nats]

Both are read from the logits at q = pos - 1, the position whose output is the
decided token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


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
