"""Head pools (App. I.1, "Head pools"; App. M controls): which heads each model pools, with weights.

A pool is the causally ranked top-k of one phase's calibrated ranking (the instrument's
`head_sets_contrast.json`), weighted

    w_h = softmax(I_c / tau) over the k heads,   tau = the standard deviation of their k importances

(population s.d.; METHOD-GUIDE §9).  The weights are recomputed over the k heads taken, so k8 and
k100 get their own tau.  Controls (App. M): `bottom` takes the k most negatively ranked heads and
gives them the top-k weight profile in rank order (the most negative head gets the leader's
weight); `random` draws k heads from the layers of the top-k pool with a pool seed, keeping the
top-k weight profile; `uniform` puts equal weight on every head of the pool's layers.  `shifted`,
a mutant of the recipe rather than one of the paper's controls (`mistill.repro.mutants`), keeps the
top-k heads and weights and moves each head one layer up (the last layer wraps to the first): the
student's layer map off by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.io import read_json

POOL_PHASES = ("P1", "P2", "P2C", "prose")
HEAD_MODES = ("top", "bottom", "random", "uniform", "shifted")


@dataclass(frozen=True)
class Pool:
    phase: str
    heads: tuple[tuple[int, int], ...]   # (layer, head)
    weights: tuple[float, ...]

    def by_layer(self):
        """[(layer, [head...], [weight...])] in layer order, the form pooled_attention wants."""
        import torch

        from mistill.distill.pooled_attention import LayerPool

        layers: dict[int, list[tuple[int, float]]] = {}
        for (layer, head), w in zip(self.heads, self.weights):
            layers.setdefault(layer, []).append((head, w))
        return [LayerPool(layer, torch.tensor([h for h, _ in hw]), torch.tensor([w for _, w in hw]))
                for layer, hw in sorted(layers.items())]

    def as_dict(self) -> dict:
        return {"phase": self.phase, "heads": [list(h) for h in self.heads], "weights": list(self.weights)}


def softmax_weights(importances: np.ndarray) -> np.ndarray:
    """w = softmax(I_c / tau), tau = population s.d. of the importances (uniform when tau == 0)."""
    ic = np.asarray(importances, dtype=float)
    tau = ic.std()
    if not np.isfinite(tau) or tau == 0:
        return np.full(len(ic), 1.0 / len(ic))
    z = ic / tau
    z = np.exp(z - z.max())
    return z / z.sum()


def load_head_sets(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no head sets file (the instrument's head_sets_contrast.json)")
    data = read_json(path, "head sets")
    for key in ("n_layers", "n_heads", "phases"):
        if not isinstance(data, dict) or key not in data:
            raise UserError(f"{path}: missing {key!r}; expected the head_sets_contrast.json contract")
    return data


def build_pool(head_sets: dict, phase: str, k: int, *, mode: str = "top", pool_seed: int = 0,
               source: str = "head sets") -> Pool:
    """One phase's pool of k heads under `mode` (top / bottom / random / uniform)."""
    if mode not in HEAD_MODES:
        raise UserError(f"unknown head mode {mode!r}; known: {', '.join(HEAD_MODES)}")
    ranking = head_sets["phases"].get(phase)
    if not ranking:
        raise UserError(f"{source}: no ranking for phase {phase}")
    if len(ranking) < k:
        raise UserError(f"{source}: phase {phase} ranks {len(ranking)} heads, fewer than k={k}")
    ranked = [(int(r["layer"]), int(r["head"])) for r in ranking]
    ic = np.array([float(r["ic"]) for r in ranking])
    top_weights = softmax_weights(ic[:k])
    if mode == "top":
        return Pool(phase, tuple(ranked[:k]), tuple(top_weights.tolist()))
    if mode == "shifted":
        n_layers = int(head_sets["n_layers"])
        return Pool(phase, tuple(((layer + 1) % n_layers, head) for layer, head in ranked[:k]),
                    tuple(top_weights.tolist()))
    if mode == "bottom":
        order = np.argsort(ic, kind="stable")[:k]  # most negative first
        return Pool(phase, tuple(ranked[i] for i in order), tuple(top_weights.tolist()))
    layers = sorted({layer for layer, _ in ranked[:k]})
    candidates = [(layer, h) for layer in layers for h in range(int(head_sets["n_heads"]))]
    if mode == "uniform":
        return Pool(phase, tuple(candidates), tuple([1.0 / len(candidates)] * len(candidates)))
    rng = np.random.default_rng(pool_seed)
    picked = rng.choice(len(candidates), size=k, replace=False)
    return Pool(phase, tuple(candidates[i] for i in picked), tuple(top_weights.tolist()))


def build_pools(head_sets: dict, k: int, *, mode: str = "top", pool_seed: int = 0,
                phases=("P1", "P2", "P2C"), source: str = "head sets") -> dict[str, Pool]:
    return {p: build_pool(head_sets, p, k, mode=mode, pool_seed=pool_seed, source=source) for p in phases}
