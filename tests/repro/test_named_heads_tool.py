"""tools/named_heads.py chooses the demo's named heads by the rules params.yaml states, on hand-made rankings."""

import importlib.util

import numpy as np
from scipy.stats import binomtest

from tests.repro.repro_helpers import REPO

spec = importlib.util.spec_from_file_location("named_heads", REPO / "tools" / "named_heads.py")
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)

N_LAYERS, N_HEADS = 2, 4


def sets_from(orders: dict[str, list[int]]) -> dict:
    """Global rankings (best first) as HD-001's head_sets_contrast.json holds them."""
    return {"n_layers": N_LAYERS, "n_heads": N_HEADS,
            "phases": {p: [{"layer": h // N_HEADS, "head": h % N_HEADS, "ic": float(-i), "weight": None}
                           for i, h in enumerate(order)] for p, order in orders.items()}}


def recurrence(counts: list[int], n_notes: int, top_k: int, alpha: float) -> dict:
    p = [binomtest(c, n_notes, top_k / len(counts), alternative="greater").pvalue for c in counts]
    return {"n_notes": n_notes, "recurrence": {"top_k": top_k, "counts": counts,
                                               "n_recurrent": int(np.sum(np.array(p) <= alpha / len(counts)))}}


def test_the_leader_has_the_smallest_sum_of_ranks_and_the_specialist_leads_p2c_otherwise():
    # head 5 (l1h1) is rank 2, 2, 2 (sum 6); head 0 is first at P1 and P2 but last at P2C (sum 10)
    sets = sets_from({"P1": [0, 5, 1, 2, 3, 4, 6, 7], "P2": [0, 5, 2, 1, 3, 4, 6, 7],
                      "P2C": [6, 5, 1, 2, 3, 4, 7, 0]})
    roles = tool.ranking_roles(sets, recurrence([0] * 8, 10, 2, 0.05), 0.05)
    assert roles["leader"] == "l1h1"
    assert roles["contrastive_specialist"] == "l1h2"   # head 6, P2C's rank 1
    assert roles["intact_p2"] == ["l0h0", "l1h1", "l0h2", "l0h1"]


def test_the_specialist_is_the_next_p2c_head_when_the_leader_leads_p2c():
    order = [3, 1, 0, 2, 4, 5, 6, 7]
    roles = tool.ranking_roles(sets_from({"P1": order, "P2": order, "P2C": order}),
                               recurrence([0] * 8, 10, 2, 0.05), 0.05)
    assert (roles["leader"], roles["contrastive_specialist"]) == ("l0h3", "l0h1")


def test_recurrent_heads_are_the_bonferroni_survivors_most_notes_first():
    counts = [20, 2, 2, 17, 2, 2, 20, 1]     # 20 notes, top-2 of 8 heads: 5 expected by chance
    order = list(range(8))
    roles = tool.ranking_roles(sets_from({"P1": order, "P2": order, "P2C": order}),
                               recurrence(counts, 20, 2, 0.05), 0.05)
    assert roles["recurrent"] == ["l0h0", "l1h2", "l0h3"]
