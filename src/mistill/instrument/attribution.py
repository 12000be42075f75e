"""Attribution as a screen, exact patching of its nominees, and its fidelity (App. C).

First-order attribution estimates the effect of mean-ablating head h at q from
one backward pass (Syed et al., 2024):

    A_h = (mu_h - z_h) . d margin / d z_h          (change in margin under ablation)

so the estimated importance, positive when the head supports the emitted token
(METHOD-GUIDE §7 sign convention), is

    I^fo_h = -A_h = (z_h - mu_h) . d margin / d z_h .

The exact importance is I_h(q) = margin(q) - margin(q | h mean-ablated).  At every
P1 event and a seeded share of the NULL events the pass mean-ablates exactly the
event's top-k by |A_h| plus the running global top-g (largest mean first-order
importance over the chapter events of the notes already processed); a head's
importance is exact where measured and first-order elsewhere.

The gradient leaf is `intact` (every path through later layers) or `detached`
(only each head's direct path: the paper's attribution-pass hook, correlation
0.36 with exact effects against 0.84 intact, Table 8).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mistill.instrument.events import Event, note_rng
from mistill.instrument.hook import HeadHook, Replacement
from mistill.instrument.margin import margin, margin_and_entropy
from mistill.instrument.patching import (
    EventVariants,
    Variants,
    forward_at,
    forward_variants,
    forward_variants_chunked,
    one_head_mask,
    one_head_per_variant,
    run_variants,
)


@dataclass(frozen=True)
class Decision:
    """One decision read at q = pos - 1: the token fed there (the trace's own), the decided token and its
    competitors, whose margin the passes read."""

    q: int
    token_id: int
    target_id: int
    competitor_ids: Sequence[int]

    @classmethod
    def of(cls, event: Event, ids: Sequence[int]) -> Decision:
        return cls(event.pos - 1, int(ids[event.pos - 1]), event.target_id, event.competitor_ids)


def first_order_batch(model, hook: HeadHook, cache, variants: Variants,
                      decisions: Sequence[tuple[int, Sequence[int]]], mu: torch.Tensor, mode: str
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(margins [B], I^fo [B, L, H], d margin / d z [B, L, H, D]) of B variants in ONE forward and backward.

    Variant b's margin is read at decisions[b] = (target id, competitor ids).  The variants see the cache
    and themselves only, so the gradient of the summed margins at variant b's head outputs is the
    gradient of variant b's own margin.
    """
    with torch.enable_grad(), hook.gradient_leaves(mode) as leaves:
        logits = forward_at(model, hook, cache, variants.positions, variants.token_ids,
                            variants.replacement(range(len(variants))))
        margins = torch.stack([margin(logits[b], target, competitors)
                               for b, (target, competitors) in enumerate(decisions)])
        grads = torch.autograd.grad(margins.sum(), [leaf for _, leaf in leaves])
    z = torch.stack([value[0] for value, _ in leaves], dim=1)  # [B, L, H, D]
    g = torch.stack([grad[0] for grad in grads], dim=1)
    dtype = torch.float64 if z.dtype == torch.float64 else torch.float32
    importance = ((z.to(dtype) - mu.to(z.device, dtype)) * g.to(dtype)).sum(-1)  # = -A_h
    return margins.detach().cpu().numpy(), importance.cpu().numpy(), g.to(dtype).cpu().numpy()


def first_order_importance(model, hook: HeadHook, cache, decision: Decision, mu: torch.Tensor, mode: str,
                           replacement: Replacement | None = None) -> tuple[float, np.ndarray]:
    """(margin, I^fo [L, H]) at q from one forward and one backward against the cache cropped to [0, q).

    With `replacement`, the gradient is taken at the replaced head outputs (integrated gradients)
    and returned in place of I^fo ([L, H, D]): the caller scales it by its own path.
    """
    variants = Variants([decision.q], [decision.token_id])
    if replacement is not None:
        variants = Variants([decision.q], [decision.token_id], replacement.mask, replacement.values)
    margins, importance, gradient = first_order_batch(model, hook, cache, variants,
                                                      [(decision.target_id, decision.competitor_ids)], mu, mode)
    return float(margins[0]), (gradient[0] if replacement is not None else importance[0])


def integrated_gradients(model, hook: HeadHook, cache, decision: Decision, mu: torch.Tensor, z: torch.Tensor,
                         steps: int = 5) -> np.ndarray:
    """IG_h = (z_h - mu_h) . mean_a d margin / d z_h at z(a) = mu + a (z - mu), every layer at once.

    Midpoint rule over `steps` points, graph intact (App. C: 5 steps; worse than first-order,
    plausibly because interpolating every layer together leaves the model's distribution).
    """
    L, H = hook.n_layers, hook.n_heads
    mask = torch.ones(L, 1, H, dtype=torch.bool)
    total = 0.0
    for a in (np.arange(steps) + 0.5) / steps:
        values = mu.to(z.device, z.dtype) + float(a) * (z - mu.to(z.device, z.dtype))
        _, g = first_order_importance(model, hook, cache, decision, mu, "intact", Replacement(mask, values))
        total = total + g
    return ((z.float() - mu.to(z.device).float()).cpu().numpy() * (total / steps)).sum(-1)


def exact_importance(model, hook: HeadHook, cache, decision: Decision, mu: torch.Tensor,
                     heads: Sequence[tuple[int, int]], max_batch: int) -> tuple[float, np.ndarray]:
    """(clean margin, I_h for each head in `heads`): each head mean-ablated alone, one batch per chunk."""
    mask = one_head_per_variant(hook.n_layers, hook.n_heads, heads)
    logits = forward_variants_chunked(model, hook, cache, decision.q, decision.token_id, mask, mu, max_batch)
    margins = margin(logits, decision.target_id, decision.competitor_ids)
    return float(margins[0]), (margins[0] - margins[1:]).cpu().numpy()


def exact_importance_batch(model, hook: HeadHook, cache, requests: Sequence[tuple[Event, Sequence[tuple[int, int]]]],
                           token_ids: Sequence[int], mu: torch.Tensor, max_batch: int
                           ) -> list[tuple[float, np.ndarray]]:
    """`exact_importance` of several events of one note, their variants packed into shared forwards.

    requests: (event, heads) pairs; the token at event.pos - 1 is token_ids[event.pos - 1].
    Returns, per request, (clean margin, I_h of each of its heads).
    """
    if not requests:
        return []
    variants = EventVariants.build({i: e.pos - 1 for i, (e, _) in enumerate(requests)},
                                   {i: token_ids[e.pos - 1] for i, (e, _) in enumerate(requests)},
                                   {i: [torch.zeros(hook.n_layers, hook.n_heads, dtype=torch.bool),
                                        *(one_head_mask(hook.n_layers, hook.n_heads, h) for h in heads)]
                                    for i, (_, heads) in enumerate(requests)})
    variants.values = mu
    logits = run_variants(model, hook, cache, variants, max_batch).logits
    out = []
    for i, (event, _) in enumerate(requests):
        lo, hi = variants.spans[i]
        margins = margin(logits[lo:hi], event.target_id, event.competitor_ids)
        out.append((float(margins[0]), (margins[0] - margins[1:]).cpu().numpy()))
    return out


def all_heads(hook: HeadHook) -> list[tuple[int, int]]:
    return [(layer, head) for layer in range(hook.n_layers) for head in range(hook.n_heads)]


class RunningGlobalTop:
    """The heads with the largest mean first-order importance over the chapter events seen so far."""

    def __init__(self, n_layers: int, n_heads: int):
        self.total = np.zeros((n_layers, n_heads))
        self.count = 0

    def update(self, first_order_p1: np.ndarray) -> None:
        """Add the P1 rows [E, L, H] of one processed note."""
        if first_order_p1.size:
            self.total += first_order_p1.sum(0)
            self.count += first_order_p1.shape[0]

    def top(self, k: int) -> list[tuple[int, int]]:
        if self.count == 0 or k <= 0:
            return []
        mean = self.total / self.count
        flat = np.argsort(-mean, axis=None, kind="stable")[:k]
        return [tuple(int(x) for x in np.unravel_index(i, mean.shape)) for i in flat]


def nominees(first_order: np.ndarray, k: int, global_top: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The event's top-k by |A_h| plus the running global top (union, event's own first)."""
    flat = np.argsort(-np.abs(first_order), axis=None, kind="stable")[:k]
    chosen = [tuple(int(x) for x in np.unravel_index(i, first_order.shape)) for i in flat]
    seen = set(chosen)
    chosen += [h for h in global_top if h not in seen]
    return chosen


@dataclass
class NoteAttribution:
    kinds: np.ndarray  # [E] str
    positions: np.ndarray  # [E]
    margin: np.ndarray  # [E] clean margin, from the first-order forward
    first_order: np.ndarray  # [E, L, H] I^fo
    exact: np.ndarray  # [E, L, H] exact I where patched, NaN elsewhere

    @property
    def importance(self) -> np.ndarray:
        """Exact where measured, first-order elsewhere (App. C)."""
        return np.where(np.isnan(self.exact), self.first_order, self.exact)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"kinds": self.kinds, "positions": self.positions, "margin": self.margin,
                "first_order": self.first_order.astype(np.float32), "exact": self.exact.astype(np.float32),
                "importance": self.importance.astype(np.float32)}


def attribute_note(model, hook: HeadHook, cache, mu: torch.Tensor, ids: Sequence[int], events: Sequence[Event], *,
                   note_id: str, mode: str, nominees_topk: int, global_top: Sequence[tuple[int, int]],
                   exact_kinds: Sequence[str] = ("P1",), null_exact_share: float = 0.5, seed: int = 0,
                   max_batch: int = 64) -> NoteAttribution:
    """The attribution pass over one note's events: first-order at every event, exact patches of the nominees.

    Events share forwards (at most `max_batch` per forward and backward), visited in decreasing
    position so that the cache only crops; an event's numbers do not depend on its batch mates
    beyond float rounding.
    """
    nulls = [i for i, e in enumerate(events) if e.kind == "NULL"]
    rng = note_rng(seed, note_id + ":null-exact")
    exact_null = set(rng.choice(nulls, size=int(round(null_exact_share * len(nulls))), replace=False).tolist()
                     ) if nulls else set()
    E, L, H = len(events), hook.n_layers, hook.n_heads
    first = np.zeros((E, L, H), dtype=np.float64)
    exact = np.full((E, L, H), np.nan)
    margins = np.zeros(E)
    variants = Variants([e.pos - 1 for e in events], [int(ids[e.pos - 1]) for e in events])
    # group by group, highest positions first: a group's exact patches run before the cache is
    # cropped below it
    for group in variants.chunks(max_batch):
        chunk = Variants([variants.positions[i] for i in group], [variants.token_ids[i] for i in group])
        decisions = [(events[i].target_id, events[i].competitor_ids) for i in group]
        margins[group], first[group], _ = first_order_batch(model, hook, cache, chunk, decisions, mu, mode)
        patched = [i for i in group if events[i].kind in exact_kinds or i in exact_null]
        requests = [(events[i], nominees(first[i], nominees_topk, global_top)) for i in patched]
        effects = exact_importance_batch(model, hook, cache, requests, ids, mu, max_batch)
        for i, (_, heads), (_, values) in zip(patched, requests, effects):
            for (layer, head), value in zip(heads, values):
                exact[i, layer, head] = value
    return NoteAttribution(np.array([e.kind for e in events]), np.array([e.pos for e in events]), margins,
                           first, exact)


# ---- the fidelity self-test (R-C2, Table 8) ------------------------------------------------------------


@dataclass
class SelfTest:
    exact: np.ndarray  # [E, L, H] every head patched exactly
    intact: np.ndarray  # [E, L, H] first-order, graph intact
    detached: np.ndarray  # [E, L, H] first-order, detached leaf
    integrated: np.ndarray  # [E, L, H] integrated gradients, graph intact
    clean_margin: np.ndarray  # [E]
    repeat_margins: np.ndarray  # [E, R] identical single-token forwards (noise floor)
    positions: np.ndarray


def self_test_note(model, hook: HeadHook, cache, mu: torch.Tensor, ids: Sequence[int], events: Sequence[Event], *,
                   repeats: int = 6, max_batch: int = 64, ig_steps: int = 5, progress=None) -> SelfTest:
    """Every head patched exactly at each event, beside both first-order estimates (App. C, Table 8)."""
    heads = all_heads(hook)
    E, L, H = len(events), hook.n_layers, hook.n_heads
    exact, intact, detached, integrated = (np.zeros((E, L, H)) for _ in range(4))
    clean, rep = np.zeros(E), np.zeros((E, repeats))
    for i in sorted(range(E), key=lambda i: -events[i].pos):
        decision = Decision.of(events[i], ids)
        clean[i], effects = exact_importance(model, hook, cache, decision, mu, heads, max_batch)
        exact[i] = effects.reshape(L, H)
        _, intact[i] = first_order_importance(model, hook, cache, decision, mu, "intact")
        _, detached[i] = first_order_importance(model, hook, cache, decision, mu, "detached")
        with torch.no_grad(), hook.recording() as rec:
            forward_variants(model, hook, cache, decision.q, decision.token_id, None, 1)
        z = torch.stack([r[0, 0] for r in rec])
        integrated[i] = integrated_gradients(model, hook, cache, decision, mu, z, ig_steps)
        with torch.no_grad():
            for r in range(repeats):
                logits = forward_variants(model, hook, cache, decision.q, decision.token_id, None, 1)[0]
                rep[i, r] = float(margin(logits, decision.target_id, decision.competitor_ids))
        if progress is not None:
            progress()
    return SelfTest(exact, intact, detached, integrated, clean, rep, np.array([e.pos for e in events]))


def fidelity(exact: np.ndarray, estimate: np.ndarray, *, floor: float, top_k: int) -> dict[str, float]:
    """Table 8's columns for one estimator against exact effects over all (event, head) pairs.

    pearson: over all heads and events; pearson_above_noise: heads with |exact| > floor;
    spearman; top-k overlap (mean over events) and the share of the exact top-k's summed
    effect that the estimator's top-k carries (per event, then mean).
    """
    from scipy import stats

    from mistill.stats import spearman_over_heads, top_k_overlap

    x, y = exact.reshape(len(exact), -1), estimate.reshape(len(estimate), -1)
    above = np.abs(x) > floor
    overlaps, recovered = [], []
    for xe, ye in zip(x, y):
        overlaps.append(top_k_overlap(xe, ye, top_k))
        best = np.sort(xe)[::-1][:top_k].sum()
        chosen = xe[np.argsort(-ye, kind="stable")[:top_k]].sum()
        recovered.append(chosen / best if best != 0 else np.nan)
    result = {
        "pearson": float(stats.pearsonr(x.ravel(), y.ravel()).statistic),
        "pearson_above_noise": (float(stats.pearsonr(x[above], y[above]).statistic)
                                if above.sum() > 2 else float("nan")),
        "spearman": spearman_over_heads(x.ravel(), y.ravel()).rho,
        "top_k_overlap": float(np.mean(overlaps)),
        "top_k_effect_recovered": float(np.nanmean(recovered)),
        "heads_above_noise_per_event_min": int(above.sum(1).min()),
        "heads_above_noise_per_event_max": int(above.sum(1).max()),
    }
    return result


def margins_at(logits: torch.Tensor, events: Sequence[Event]) -> list[tuple[float, float]]:
    """(margin, entropy) of each event from logits [E, V] read at the events' pos - 1."""
    return [tuple(float(v) for v in margin_and_entropy(logits[i], e.target_id, e.competitor_ids))
            for i, e in enumerate(events)]
