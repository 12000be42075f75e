"""A planted mechanism: the demo teacher's decisions routed through designated heads.

The instrument (App. C, D) ranks heads by how much mean-ablating one of them at a decision's query
position moves the margin.  To score it against a mechanism known in advance, the demo teacher is
trained so that each phase's decisions can run through a designated head set P_phase only: at the
query position q of every P1, P2 and P2C event of a training trace (q = pos - 1, where the decided
token's logits are read), every head outside the phase's set is held to its own mean output over the
input, which is exactly what the instrument's mean ablation puts in its place:

    R = (1 / |E|) sum_{e in E} (1 / |H \\ P_e|) sum_{h not in P_e} ||z_h(q_e) - mu_h||^2 / (s_h^2 + eps)

    mu_h  = mean of z_h over every position of the example's input (prompt and trace, as the
            instrument's mean ablation takes it; the closing EOS is not part of that input)
    s_h^2 = mean over those positions of ||z_h - mu_h||^2, held fixed (no gradient), so R is
            invariant to a head's scale (shrinking z_h and growing o_proj cannot lower it)

and the teacher minimises L_CE + weight * R, its forward run with every held head mean-ablated at
the decisions' query positions (`PlantedRouting`: a penalty alone is gamed).  A head with
z_h(q) = mu_h changes nothing when it is ablated at q, so the note-specific information a decision
needs (which code the note supports) can reach its position only through P_phase; the planted sets
are the ground truth the instrument's global ranking is scored against (`planted_recall`).

A position that is both a P2 and a P2C event (the first differing character of a code whose sibling
was named earlier) belongs to P2C: the contrastive decision is the one planted there.  P1 events sit
on chapter letters, which no P2 or P2C event shares.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mistill.errors import UserError
from mistill.instrument.events import DECISION_KINDS, extract_events

PLANTED_PHASES = ("P1", "P2", "P2C")
# a position's phase when two events share it: the later entry wins
_PRIORITY = {"P1": 0, "P2": 1, "P2C": 2}
_HEAD = re.compile(r"^l(\d+)h(\d+)$")
EPS = 1e-6


def parse_head(name: str) -> tuple[int, int]:
    """'l2h5' -> (2, 5)."""
    match = _HEAD.match(str(name))
    if not match:
        raise UserError(f"planted heads: {name!r} is not a head name of the form l<layer>h<head>")
    return int(match.group(1)), int(match.group(2))


def head_name(head: tuple[int, int]) -> str:
    return f"l{head[0]}h{head[1]}"


@dataclass(frozen=True)
class PlantedHeads:
    """Each phase's designated heads, the routing term's weight and the share of training steps whose
    forward mean-ablates the held heads (1: every step; below 1 the model also trains as the instrument
    reads it, untouched, so a held head's residue cannot come to matter at a decision)."""

    sets: Mapping[str, frozenset[tuple[int, int]]]
    weight: float
    ablate_share: float = 1.0

    @classmethod
    def from_params(cls, cfg: Mapping[str, Any] | None, *, n_layers: int, n_heads: int) -> PlantedHeads | None:
        """`{P1: [l2h1, ...], P2: [...], P2C: [...], weight: w, ablate_share: s}`, or None (no planted
        mechanism)."""
        if not cfg:
            return None
        missing = [p for p in PLANTED_PHASES if not cfg.get(p)]
        if missing:
            raise UserError(f"params: planted heads need a non-empty set for each of {', '.join(PLANTED_PHASES)}; "
                            f"missing {', '.join(missing)}")
        sets = {}
        for phase in PLANTED_PHASES:
            heads = frozenset(parse_head(h) for h in cfg[phase])
            outside = [head_name(h) for h in sorted(heads) if not (h[0] < n_layers and h[1] < n_heads)]
            if outside:
                raise UserError(f"params: planted {phase} heads {', '.join(outside)} are outside the model's "
                                f"{n_layers} layers x {n_heads} heads")
            sets[phase] = heads
        weight = float(cfg.get("weight", 1.0))
        if not weight > 0:
            raise UserError(f"params: planted heads' weight must be positive, got {weight}")
        share = float(cfg.get("ablate_share", 1.0))
        if not 0 <= share <= 1:
            raise UserError(f"params: planted heads' ablate_share must lie in [0, 1], got {share}")
        return cls(sets, weight, share)

    def held_mask(self, phase: str, n_layers: int, n_heads: int) -> np.ndarray:
        """[L, H] booleans: the heads held to their mean at a `phase` decision (all but its set)."""
        mask = np.ones((n_layers, n_heads), dtype=bool)
        for layer, head in self.sets[phase]:
            mask[layer, head] = False
        return mask

    def as_dict(self) -> dict:
        return {**{p: sorted(head_name(h) for h in self.sets[p]) for p in PLANTED_PHASES}, "weight": self.weight,
                "ablate_share": self.ablate_share}


def decision_rows(tokenizer: Any, text: str, completion_start: int, codes: Sequence[str]
                  ) -> tuple[tuple[int, str], ...]:
    """(query position, phase) of every decision event of one trace, as the instrument extracts them
    (`mistill.instrument.events.extract_events` on the same text), one phase per position."""
    enc = tokenizer.encode(text)
    events, _ = extract_events(note_id="", text=text, ids=enc.ids, offsets=enc.offsets,
                               completion_start=completion_start, codes=codes, tokenizer=tokenizer, n_null=0)
    phase_at: dict[int, str] = {}
    for event in events:
        if event.kind not in DECISION_KINDS:
            continue
        q = event.pos - 1
        if q not in phase_at or _PRIORITY[event.kind] > _PRIORITY[phase_at[q]]:
            phase_at[q] = event.kind
    return tuple(sorted(phase_at.items()))


class PlantedRouting:
    """The routing term and its training-time ablation for one model, through forward pre-hooks on
    every layer's o_proj.

    Holding a head near its mean with a penalty alone can be gamed: a deviation far below the head's
    spread, amplified by the layers above (RMSNorm rescales), can still carry the decision.  So in
    training every held head's output at a decision's query position is also replaced by its mean
    (detached), which is the instrument's mean ablation: the layers above only ever see mu_h there
    and never learn to read a held head's residue.  The penalty R, on the outputs before the
    replacement, keeps the untouched model (what the instrument reads) at those means too.

    `batch_loss` runs a shared-prefix batch as two calls per layer (the prefix once, then the
    suffixes); the prefix never holds a decision, so the hooks only record it."""

    def __init__(self, model: Any, planted: PlantedHeads):
        self.planted = planted
        self.layers = model.model.layers
        self.n_heads = model.config.num_attention_heads
        self._handles: list[Any] = []

    @contextlib.contextmanager
    def applied(self, batch: Sequence[Any], shared: int, *, ablate: bool = True) -> Iterator[PlantedRouting]:
        """Hooks on for one forward of `batch` (prefix of `shared` tokens run once when > 0); `ablate=False`
        records R on the untouched forward."""
        import torch

        self._batch, self._shared, self._ablate = batch, shared, ablate
        self._rows = [(b, q - shared, phase) for b, ex in enumerate(batch) for q, phase in ex.decisions]
        held = np.stack([self.planted.held_mask(p, len(self.layers), self.n_heads) for _, _, p in self._rows]) \
            if self._rows else np.zeros((0, len(self.layers), self.n_heads), dtype=bool)
        self._held = torch.tensor(held)
        self._prefix: list[Any] = [None] * len(self.layers)
        self._terms: list[Any] = [None] * len(self.layers)
        self._handles = [layer.self_attn.o_proj.register_forward_pre_hook(self._hook(i))
                         for i, layer in enumerate(self.layers)]
        try:
            yield self
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles = []

    def _hook(self, layer: int):
        def hook(module, args):
            (x,) = args
            z = x.view(*x.shape[:-1], self.n_heads, -1)
            if self._shared and self._prefix[layer] is None:
                self._prefix[layer] = z[0]                    # [S, H, D], the prefix's one call
                return None
            if not self._rows:
                return None
            return (self._hold(layer, z).reshape(x.shape),)
        return hook

    def _hold(self, layer: int, z):
        """Record this layer's R terms; return z with the held heads at their means at every decision (or
        untouched when this forward does not ablate)."""
        import torch

        mus, scales = [], []
        for b, ex in enumerate(self._batch):
            n = len(ex.ids) - 1 - self._shared      # the instrument's input: every id but the closing EOS
            parts = [z[b, :n]] if self._prefix[layer] is None else [self._prefix[layer], z[b, :n]]
            positions = torch.cat(parts, dim=0).float()                    # [T, H, D]
            mu = positions.mean(dim=0)                                     # [H, D]
            with torch.no_grad():
                scales.append((positions - mu).pow(2).sum(dim=-1).mean(dim=0))   # [H]
            mus.append(mu)
        rows_b = torch.tensor([b for b, _, _ in self._rows], device=z.device)
        rows_j = torch.tensor([j for _, j, _ in self._rows], device=z.device)
        at_q = z[rows_b, rows_j].float()                                   # [n_rows, H, D]
        mu, scale = torch.stack(mus)[rows_b], torch.stack(scales)[rows_b]
        self._terms[layer] = (at_q - mu).pow(2).sum(dim=-1) / (scale + EPS)   # [n_rows, H]
        if not self._ablate:
            return z
        held = self._held[:, layer].to(z.device).unsqueeze(-1)             # [n_rows, H, 1]
        replaced = torch.where(held, mu.detach().to(z.dtype), z[rows_b, rows_j])
        return z.index_put((rows_b, rows_j), replaced)

    def penalty(self):
        """R of the last forward and the number of decisions it averages over; (None, 0) without any."""
        import torch

        if not self._rows:
            return None, 0
        deviation = torch.stack(self._terms, dim=1)                        # [n_rows, L, H]
        held = self._held.to(deviation.device)
        per_row = (deviation * held).sum(dim=(1, 2)) / held.sum(dim=(1, 2)).clamp(min=1)
        return per_row.mean(), len(self._rows)


def planted_recall(ranked: Sequence[tuple[int, int]], planted: frozenset[tuple[int, int]]) -> float:
    """Share of the planted heads among the ranking's top |planted| (recall at k = |planted|)."""
    k = len(planted)
    return len(set(map(tuple, ranked[:k])) & set(planted)) / k


def planted_ranks(ranked: Sequence[tuple[int, int]], planted: frozenset[tuple[int, int]]) -> dict[str, int]:
    """1-based rank of every planted head in the ranking."""
    position = {tuple(h): i + 1 for i, h in enumerate(ranked)}
    return {head_name(h): position[h] for h in sorted(planted)}
