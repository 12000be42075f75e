"""Global head sets per phase and their pooled weights (Sec. 2.3, App. D "Pooled weights").

A phase's global set is its ranking of every head by mean I_c over notes; top-k
is taken from it.  The pooled weights of the top-k are

    w_h = softmax(I_c,h / tau),   tau = s.d. (population) of the k importances,

which the distillation pools read from `head_sets_contrast.json`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.io import read_json, write_json
from mistill.stats import pooled_weights


def ranking(ic_mean: np.ndarray) -> np.ndarray:
    """Flat head indices from highest to lowest I_c (stable)."""
    return np.argsort(-ic_mean, kind="stable")


def head_sets(ic_mean: Mapping[str, np.ndarray], n_layers: int, n_heads: int, *, pool_k: int) -> dict:
    """The head_sets_contrast.json body: every head ranked by I_c per phase, weights on the top pool_k."""
    phases, taus = {}, {}
    for phase, values in ic_mean.items():
        k = min(pool_k, values.size)
        pooled = pooled_weights(values, k, ddof=0)
        weight = dict(zip(pooled.heads.tolist(), pooled.weights.tolist()))
        taus[phase] = pooled.tau
        phases[phase] = [{"layer": int(i // n_heads), "head": int(i % n_heads), "ic": float(values[i]),
                          "weight": weight.get(int(i))} for i in ranking(values)]
    return {"n_layers": n_layers, "n_heads": n_heads, "pool_k": pool_k, "phases": phases, "tau": taus}


def write_head_sets(path: str | Path, body: dict, provenance: dict) -> None:
    write_json(path, {**body, "provenance": provenance})


def load_head_sets(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no head sets; run `mistill instrument calibrate` first")
    body = read_json(path, "head sets")
    missing = [k for k in ("phases", "n_layers", "n_heads") if not isinstance(body, dict) or k not in body]
    if missing:
        raise UserError(f"{path}: malformed head sets (missing {', '.join(missing)}); "
                        "rerun `mistill instrument calibrate`")
    return body


def phase_scores(body: dict, phase: str) -> np.ndarray:
    """I_c [L*H] of one phase, back from the ranked list."""
    scores = np.full(body["n_layers"] * body["n_heads"], np.nan)
    for row in body["phases"][phase]:
        scores[row["layer"] * body["n_heads"] + row["head"]] = row["ic"]
    return scores
