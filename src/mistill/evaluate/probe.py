"""The post-hoc rank probe of App. I.4 and L.3 (R-D17, R-D22): one head moved into an arm's own top-k.

The paper's fp32 Mistill arms recover little of the contrastive decision with their own top-8, and it names why:
their first-order ranking places a causally active head (L35H26, rank 3 in every bf16 arm) at rank 11 or 12.
Moved into rank 8 of the arm's own ranking with nothing else changed, the top-8 recover most of the gap.  The
probe is a diagnosis, not a result: the probe set is chosen after seeing the ranking.

Here the head is chosen by the paper's own description, so every profile runs the same procedure: the head whose
worst P2C rank over the reference arms' own rankings (the bf16 Mistill arms of the same student, one per seed) is
best, ties broken by the mean rank and then by the head's index.  The probe ranking is the arm's own P2C ranking
with that head moved to rank k and every other head in its order (ranks are 1-based):

    probe = own[:k-1] without h, then h, then the rest of own without h;

a head the arm already ranks inside its top-k keeps its rank (the probe set is then the own top-k).

Its head-sets file holds the probe ranking's P2C scores as n - position (only the order is read: the knock-in's
top, bottom and random sets); the other phases are the arm's own.  `mistill evaluate own-heads --stages knockin
--heads-from <dir>` then knocks the probe's top-k in at the test notes.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.evaluate.compare import labelled_seed_dirs

PHASE = "P2C"


def ranks(scores: np.ndarray) -> np.ndarray:
    """1-based rank of every head under a score vector (the knock-in's stable descending order)."""
    order = np.argsort(-scores, kind="stable")
    out = np.empty(len(scores), dtype=np.int64)
    out[order] = np.arange(1, len(scores) + 1)
    return out


def consensus_head(reference_scores: Sequence[np.ndarray]) -> int:
    """The head ranked best in every reference ranking: the lowest worst rank, then the lowest mean rank, then the
    lowest index."""
    if not reference_scores:
        raise UserError("the rank probe needs at least one reference ranking")
    if len({len(s) for s in reference_scores}) != 1:
        raise UserError("the rank probe's reference rankings cover different numbers of heads")
    table = np.stack([ranks(s) for s in reference_scores])
    worst, mean = table.max(axis=0), table.mean(axis=0)
    return int(np.lexsort((np.arange(table.shape[1]), mean, worst))[0])


def moved_into_rank(scores: np.ndarray, head: int, rank: int) -> np.ndarray:
    """Scores (n - position) of the ranking `scores` gives with `head` moved to `rank`, every other head in its
    order."""
    n = len(scores)
    if not 1 <= rank <= n or not 0 <= head < n:
        raise UserError(f"rank probe: rank {rank} or head {head} outside the {n} heads")
    order = [int(h) for h in np.argsort(-scores, kind="stable") if h != head]
    order.insert(rank - 1, head)
    out = np.empty(n)
    out[order] = np.arange(n, 0, -1, dtype=float)
    return out


def head_name(index: int, n_heads: int) -> str:
    return f"l{index // n_heads}h{index % n_heads}"


def probe_head_sets(arm_sets: dict, reference_sets: Sequence[dict], rank: int) -> tuple[dict, dict]:
    """(the arm's head-sets body with its P2C ranking probed, the probe's record)."""
    from mistill.instrument.global_sets import phase_scores

    shape = (arm_sets["n_layers"], arm_sets["n_heads"])
    if any((r["n_layers"], r["n_heads"]) != shape for r in reference_sets):
        raise UserError(f"rank probe: the reference rankings are not of the arm's {shape[0]} x {shape[1]} heads")
    own = phase_scores(arm_sets, PHASE)
    head = consensus_head([phase_scores(r, PHASE) for r in reference_sets])
    rank = min(rank, int(ranks(own)[head]))   # a head already inside the top-k keeps its place: the probe is the own top-k
    probed = moved_into_rank(own, head, rank)
    body = copy.deepcopy(arm_sets)
    n_heads = arm_sets["n_heads"]
    body["phases"][PHASE] = [{"layer": int(h) // n_heads, "head": int(h) % n_heads, "ic": float(probed[h]),
                              "weight": None} for h in np.argsort(-probed, kind="stable")]
    record = {"phase": PHASE, "head": head_name(head, n_heads), "rank_in_arm": int(ranks(own)[head]),
              "moved_to": rank,
              "reference_ranks": [int(ranks(phase_scores(r, PHASE))[head]) for r in reference_sets],
              "rule": "the best worst rank over the reference arms' own rankings, then the mean rank"}
    body["probe"] = record
    return body, record


def reference_dirs(root: Path, label: str) -> list[Path]:
    """Every <root>/<label>-s<seed> with an own ranking, by seed."""
    return list(labelled_seed_dirs(root, label, "head_sets_contrast.json").values())


def write_probe(arm_dir: Path, reference_dirs: Sequence[Path], rank: int, out_dir: Path) -> dict:
    """<out_dir>/head_sets_contrast.json (the probed ranking) and probe.json from the arm's and the references'
    own-heads attribution directories (HD-S/<arm>-s<seed>)."""
    from mistill.instrument.global_sets import load_head_sets
    from mistill.io import write_json

    name = "head_sets_contrast.json"
    missing = [d for d in (arm_dir, *reference_dirs) if not (Path(d) / name).is_file()]
    if missing:
        raise UserError(f"{missing[0]}: no {name} (run the arm's own-heads attribution first)")
    body, record = probe_head_sets(load_head_sets(Path(arm_dir) / name),
                                   [load_head_sets(Path(d) / name) for d in reference_dirs], rank)
    record = {**record, "arm": str(arm_dir), "references": [str(d) for d in reference_dirs]}
    write_json(Path(out_dir) / name, body)
    write_json(Path(out_dir) / "probe.json", record)
    return record


def probe_reading(params: dict, name: str, k: int, min_range: float) -> tuple[dict, dict[str, float], Path]:
    """(probe.json, {note: recovery of the probe's top-k at P2C}, its M6 directory) of the recipe variant `name`
    (params variants.probed; stage M6-probe@<name>)."""
    from mistill.distill.runs import variant, variant_label
    from mistill.evaluate.compare import arm_values
    from mistill.io import read_json

    variants = params.get("variants") or {}
    entry = variant(variants, name)
    label, seed = variant_label(name, entry), int(entry["seed"])
    root = Path(variants["dir"]) / "probe"
    record = root / "HD-S" / f"{label}-s{seed}" / "probe.json"
    if not record.is_file():
        raise UserError(f"{record}: no rank probe; run `dvc repro pipelines/own-heads/dvc.yaml:M6-probe@{name}`")
    recovery = arm_values(root, label, "m4", phase=PHASE, k=k, min_range=min_range)
    return read_json(record, "rank probe"), recovery[seed], root / "M6" / f"{label}-s{seed}"
