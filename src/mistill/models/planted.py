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
the decisions' query positions (`PlantedRouting`: a penalty alone is gamed).

A model trained only with the ablation in place is not the model that generates, and the instrument
reads the untouched one.  With `consistency` gamma > 0 every step therefore runs both forwards, the
untouched one (c) and the one with the held heads ablated at the decisions (a), and asks them to agree
on what the instrument measures, the decision margin m = logit(target) - logsumexp(logits of the
competitors) (`mistill.instrument.margin`):

    L = (L_CE(c) + L_CE(a)) / 2 + weight * R(c) + gamma * (1 / |E|) sum_{e in E} (m_e(c) - m_e(a))^2

so the held heads, ablated together, move no decision's margin, and what the decision needs reaches
it through the planted set in both forwards.  A head with
z_h(q) = mu_h changes nothing when it is ablated at q, so the note-specific information a decision
needs (which code the note supports) can reach its position only through P_phase; the planted sets
are the ground truth the instrument's global ranking is scored against (`planted_recall`).

Holding every other head costs the decisions their capacity (docs/demo-world.md: no held teacher kept
coding).  The knock-out form (`necessity` delta > 0; `mistill.models.train_teacher.necessity_step`)
asks instead what the instrument ranks by, one head mean-ablated at a time.  Every step runs the batch
untouched (c), once per planted slot j with the j-th planted head of each decision's phase knocked out
(a_j), and once per probe r with one head no phase plants knocked out at every decision (b_r, drawn
afresh each step):

    L = L_CE(c) + weight * mean_{e,j} max(0, delta - (m_e(c) - m_e(a_j)))
                + held_weight * mean_{e,r} (m_e(c) - m_e(b_r))^2

so each planted head alone moves its decisions' margins by at least delta nats and any other head alone
by about nothing, while every head stays free to compute (the others may share the work redundantly,
which single-head ablation then cannot see: the ground truth is the heads each decision needs).  With
`shared: union`, a position where a P2 and a P2C event sit together needs both phases' heads (the
instrument's P2 events include the positions P2C wins), one slot per head of the union.

A position that is both a P2 and a P2C event (the first differing character of a code whose sibling
was named earlier) belongs to P2C: the contrastive decision is the one planted there.  P1 events sit
on chapter letters, which no P2 or P2C event shares.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from mistill.errors import UserError
from mistill.instrument.events import DECISION_KINDS, extract_events

PLANTED_PHASES = ("P1", "P2", "P2C")
# a position's phase when two events share it: the later entry wins
_PRIORITY = {"P1": 0, "P2": 1, "P2C": 2}
_HEAD = re.compile(r"^l(\d+)h(\d+)$")
SHARED_RULES = ("phase", "union")   # the knock-out form at a position two phases' events share
EPS = 1e-6


def parse_head(name: str) -> tuple[int, int]:
    """'l2h5' -> (2, 5)."""
    match = _HEAD.match(str(name))
    if not match:
        raise UserError(f"planted heads: {name!r} is not a head name of the form l<layer>h<head>")
    return int(match.group(1)), int(match.group(2))


def head_name(head: tuple[int, int]) -> str:
    return f"l{head[0]}h{head[1]}"


class Decision(NamedTuple):
    """One decision of a training trace: its query position, phase, decided token and competitors, and every
    phase whose event sits at the position (a P2 and a P2C event may share one)."""

    q: int
    phase: str
    target: int
    competitors: tuple[int, ...]
    phases: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlantedHeads:
    """Each phase's designated heads, the routing term's weight, the share of training steps whose
    forward mean-ablates the held heads (1: every step; below 1 the model also trains as the instrument
    reads it, untouched, so a held head's residue cannot come to matter at a decision), and the weight
    gamma of the margin agreement between the untouched and the ablated forward (0: off; above 0 every
    step runs both, and `ablate_share` is not used)."""

    sets: Mapping[str, frozenset[tuple[int, int]]]
    weight: float
    ablate_share: float = 1.0
    consistency: float = 0.0
    necessity: float = 0.0       # delta > 0: the knock-out form (`necessity_step`), each planted head necessary
    held_probes: int = 0         # ... held heads knocked out one at a time per step, each to move no margin
    held_weight: float = 0.0     # ... the weight of their squared margin moves
    shared: str = "phase"        # ... at a position of two phases' events: the winning phase's heads, or the union

    @classmethod
    def from_params(cls, cfg: Mapping[str, Any] | None, *, n_layers: int, n_heads: int) -> PlantedHeads | None:
        """`{P1: [l2h1, ...], P2: [...], P2C: [...], weight: w, ablate_share: s, consistency: gamma}`, or
        None (no planted mechanism)."""
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
        if not weight >= 0:
            raise UserError(f"params: planted heads' weight must be at least 0, got {weight}")
        share = float(cfg.get("ablate_share", 1.0))
        if not 0 <= share <= 1:
            raise UserError(f"params: planted heads' ablate_share must lie in [0, 1], got {share}")
        consistency = float(cfg.get("consistency", 0.0))
        necessity, probes, held_weight = (float(cfg.get("necessity", 0.0)), int(cfg.get("held_probes", 0)),
                                          float(cfg.get("held_weight", 0.0)))
        for name, value in (("consistency", consistency), ("necessity", necessity), ("held_probes", probes),
                            ("held_weight", held_weight)):
            if not value >= 0:
                raise UserError(f"params: planted heads' {name} must be at least 0, got {value}")
        if necessity and consistency:
            raise UserError("params: planted heads take the margin agreement (consistency) or the knock-out form "
                            "(necessity), not both")
        shared = str(cfg.get("shared", "phase"))
        if shared not in SHARED_RULES:
            raise UserError(f"params: planted heads' shared must be one of {', '.join(SHARED_RULES)}, got {shared!r}")
        return cls(sets, weight, share, consistency, necessity, probes, held_weight, shared)

    def held_mask(self, phase: str, n_layers: int, n_heads: int) -> np.ndarray:
        """[L, H] booleans: the heads held to their mean at a `phase` decision (all but its set)."""
        mask = np.ones((n_layers, n_heads), dtype=bool)
        for layer, head in self.sets[phase]:
            mask[layer, head] = False
        return mask

    def needed(self, decision: Decision) -> list[tuple[int, int]]:
        """The heads the knock-out form makes necessary at `decision`, in order: its phase's set or, with
        `shared: union`, the union over every phase whose event sits at its position (the instrument's P2
        events include the positions P2C wins)."""
        phases = decision.phases if self.shared == "union" and decision.phases else (decision.phase,)
        return sorted(set().union(*(self.sets[p] for p in phases)))

    def unplanted(self, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
        """The heads no phase plants, in order: the knock-out form's probes are drawn from them."""
        planted = set().union(*self.sets.values())
        return [(layer, head) for layer in range(n_layers) for head in range(n_heads) if (layer, head) not in planted]

    def as_dict(self) -> dict:
        out = {**{p: sorted(head_name(h) for h in self.sets[p]) for p in PLANTED_PHASES}, "weight": self.weight,
               "ablate_share": self.ablate_share, "consistency": self.consistency}
        if self.necessity:
            out.update(necessity=self.necessity, held_probes=self.held_probes, held_weight=self.held_weight)
            if self.shared != "phase":
                out["shared"] = self.shared
        return out


def knockout_mask(head: tuple[int, int], n_layers: int, n_heads: int) -> np.ndarray:
    """[L, H] booleans: `head` alone knocked out (the knock-out form's slots and probes)."""
    mask = np.zeros((n_layers, n_heads), dtype=bool)
    mask[head] = True
    return mask


def decision_rows(tokenizer: Any, text: str, completion_start: int, codes: Sequence[str]) -> tuple[Decision, ...]:
    """Every decision event of one trace as the instrument extracts it (`mistill.instrument.events.
    extract_events` on the same text), one per query position, by position."""
    enc = tokenizer.encode(text)
    events, _ = extract_events(note_id="", text=text, ids=enc.ids, offsets=enc.offsets,
                               completion_start=completion_start, codes=codes, tokenizer=tokenizer, n_null=0)
    at: dict[int, Decision] = {}
    kinds: dict[int, set[str]] = {}
    for event in events:
        if event.kind not in DECISION_KINDS:
            continue
        q = event.pos - 1
        kinds.setdefault(q, set()).add(event.kind)
        if q not in at or _PRIORITY[event.kind] > _PRIORITY[at[q].phase]:
            at[q] = Decision(q, event.kind, int(event.target_id), tuple(int(c) for c in event.competitor_ids))
    return tuple(at[q]._replace(phases=tuple(sorted(kinds[q], key=_PRIORITY.get))) for q in sorted(at))


class PlantedRouting:
    """The routing term and its training-time ablation for one model, through forward pre-hooks on
    every layer's o_proj.

    Holding a head near its mean with a penalty alone can be gamed: a deviation far below the head's
    spread, amplified by the layers above (RMSNorm rescales), can still carry the decision.  So in
    training every held head's output at a decision's query position is also replaced by its mean
    (detached), which is the instrument's mean ablation: the layers above only ever see mu_h there
    and never learn to read a held head's residue.  The penalty R, on the outputs before the
    replacement, keeps the untouched model (what the instrument reads) at those means too.

    A forward under `applied` may run a shared-prefix batch as two calls per layer (the prefix once,
    then the suffixes); the prefix never holds a decision, so the hooks only record it."""

    def __init__(self, model: Any, planted: PlantedHeads):
        self.planted = planted
        self.layers = model.model.layers
        self.n_heads = model.config.num_attention_heads
        self._handles: list[Any] = []

    @contextlib.contextmanager
    def applied(self, batch: Sequence[Any], shared: int, *, ablate: bool | Sequence[bool] = True,
                held: np.ndarray | None = None) -> Iterator[PlantedRouting]:
        """Hooks on for one forward of `batch` (prefix of `shared` tokens run once when > 0); `ablate=False`
        records R on the untouched forward, and a sequence of one flag per example ablates only the
        flagged ones (one forward can carry an untouched and an ablated copy of a batch).  `held`
        [n_decisions, L, H], in the order of the batch's decisions, replaces the phases' held masks (the
        knock-out form ablates one head per copy).  `rows` then holds the decisions' (batch row, suffix
        position) index tensors, where `margins` reads the logits."""
        import torch

        flags = [bool(ablate)] * len(batch) if isinstance(ablate, bool) else [bool(a) for a in ablate]
        if len(flags) != len(batch):
            raise ValueError(f"{len(flags)} ablation flags for {len(batch)} examples")
        self._shared = shared
        decisions = [(b, d) for b, ex in enumerate(batch) for d in ex.decisions]
        n_layers = len(self.layers)
        if held is None:
            held = np.stack([self.planted.held_mask(d.phase, n_layers, self.n_heads) for _, d in decisions]) \
                if decisions else np.zeros((0, n_layers, self.n_heads), dtype=bool)
        elif held.shape != (len(decisions), n_layers, self.n_heads):
            raise ValueError(f"held masks {held.shape} for {len(decisions)} decisions of {n_layers} x {self.n_heads}")
        self._held = torch.tensor(held)
        self._ablated = torch.tensor([flags[b] for b, _ in decisions], dtype=torch.bool)
        self._example_of_row = np.array([b for b, _ in decisions], dtype=int)
        self.rows = (torch.tensor([b for b, _ in decisions], dtype=torch.long),
                     torch.tensor([d.q - shared for _, d in decisions], dtype=torch.long))
        # the instrument's input per example: every id but the closing EOS, here past the shared prefix
        self._lengths = torch.tensor([len(ex.ids) - 1 - shared for ex in batch], dtype=torch.long)
        width = max((len(d.competitors) for _, d in decisions), default=1)
        self._targets = torch.tensor([d.target for _, d in decisions], dtype=torch.long)
        self._competitors = torch.tensor([list(d.competitors) + [0] * (width - len(d.competitors))
                                          for _, d in decisions] or [[0]], dtype=torch.long)
        self._present = torch.tensor([[True] * len(d.competitors) + [False] * (width - len(d.competitors))
                                      for _, d in decisions] or [[False]])
        self._prefix: list[Any] = [None] * n_layers
        self._terms: list[Any] = [None] * n_layers
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
            if not len(self._held):
                return None
            return (self._hold(layer, z).reshape(x.shape),)
        return hook

    def _means(self, layer: int, z):
        """(mu [B, H, D], s^2 [B, H] without gradient): each example's mean head output over its input and
        its spread about that mean, the shared prefix counted once per example."""
        import torch

        zf = z.float()                                                     # [B, T, H, D]
        lengths = self._lengths.to(z.device)
        valid = (torch.arange(z.shape[1], device=z.device)[None, :] < lengths[:, None]).to(zf.dtype)
        total, count = (zf * valid[..., None, None]).sum(dim=1), lengths.to(zf.dtype)
        prefix = self._prefix[layer]
        if prefix is not None:
            total = total + prefix.float().sum(dim=0)
            count = count + prefix.shape[0]
        mu = total / count[:, None, None]
        with torch.no_grad():
            spread = ((zf - mu[:, None]).pow(2).sum(dim=-1) * valid[..., None]).sum(dim=1)   # [B, H]
            if prefix is not None:
                spread = spread + (prefix.float()[None] - mu[:, None]).pow(2).sum(dim=-1).sum(dim=1)
            spread = spread / count[:, None]
        return mu, spread

    def _hold(self, layer: int, z):
        """Record this layer's R terms; return z with the held heads at their means at every decision (or
        untouched when this forward does not ablate)."""
        import torch

        mu, spread = self._means(layer, z)
        rows_b, rows_j = (r.to(z.device) for r in self.rows)
        at_q = z[rows_b, rows_j].float()                                   # [n_rows, H, D]
        mu, spread = mu[rows_b], spread[rows_b]
        self._terms[layer] = (at_q - mu).pow(2).sum(dim=-1) / (spread + EPS)   # [n_rows, H]
        if not bool(self._ablated.any()):
            return z
        held = (self._held[:, layer] & self._ablated[:, None]).to(z.device).unsqueeze(-1)   # [n_rows, H, 1]
        replaced = torch.where(held, mu.detach().to(z.dtype), z[rows_b, rows_j])
        return z.index_put((rows_b, rows_j), replaced)

    def penalty(self, examples: Sequence[int] | None = None):
        """R of the last forward over the decisions of `examples` (batch indices; all when None) and the
        number of decisions it averages over; (None, 0) without any."""
        import torch

        rows = np.arange(len(self._held)) if examples is None else \
            np.flatnonzero(np.isin(self._example_of_row, list(examples)))
        if not len(rows):
            return None, 0
        index = torch.as_tensor(rows)
        deviation = torch.stack(self._terms, dim=1)[index.to(self._terms[0].device)]   # [n_rows, L, H]
        held = self._held[index].to(deviation.device)
        per_row = (deviation * held).sum(dim=(1, 2)) / held.sum(dim=(1, 2)).clamp(min=1)
        return per_row.mean(), len(rows)

    def margins(self, logits):
        """Each decision's margin, logit(target) - logsumexp(logits of its competitors) (float32), from
        `logits` [n_rows, V] at `rows`: the instrument's margin (`mistill.instrument.margin`), batched."""
        import torch

        logits = logits.float()
        target = logits.gather(-1, self._targets.to(logits.device)[:, None])[:, 0]
        competitors = logits.gather(-1, self._competitors.to(logits.device))
        competitors = competitors.masked_fill(~self._present.to(logits.device), float("-inf"))
        return target - torch.logsumexp(competitors, dim=-1)


def planted_recall(ranked: Sequence[tuple[int, int]], planted: frozenset[tuple[int, int]]) -> float:
    """Share of the planted heads among the ranking's top |planted| (recall at k = |planted|)."""
    k = len(planted)
    return len(set(map(tuple, ranked[:k])) & set(planted)) / k


def planted_ranks(ranked: Sequence[tuple[int, int]], planted: frozenset[tuple[int, int]]) -> dict[str, int]:
    """1-based rank of every planted head in the ranking."""
    position = {tuple(h): i + 1 for i, h in enumerate(ranked)}
    return {head_name(h): position[h] for h in sorted(planted)}
