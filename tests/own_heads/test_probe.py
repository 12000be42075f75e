"""The post-hoc rank probe: the consensus head of the reference rankings, moved into the arm's own top-k with every
other head in its order; the knock-in's top-k of the probed file is the arm's top-(k-1) plus that head."""

from __future__ import annotations

import numpy as np
import pytest

from mistill.errors import UserError
from mistill.evaluate.probe import (
    consensus_head,
    moved_into_rank,
    probe_head_sets,
    ranks,
    reference_dirs,
    write_probe,
)
from mistill.instrument.global_sets import load_head_sets, phase_scores
from mistill.instrument.knockin import head_set_masks
from mistill.io import write_json


def _sets(scores: np.ndarray, n_layers: int = 2, n_heads: int = 4) -> dict:
    order = np.argsort(-scores, kind="stable")
    rows = [{"layer": int(h) // n_heads, "head": int(h) % n_heads, "ic": float(scores[h]), "weight": None}
            for h in order]
    p1 = [{**r, "ic": -r["ic"]} for r in rows]
    return {"n_layers": n_layers, "n_heads": n_heads, "phases": {"P2C": rows, "P1": p1}, "tau": {}}


def test_ranks_follow_the_knock_ins_stable_order():
    assert ranks(np.array([0.1, 0.5, 0.5, -1.0])).tolist() == [3, 1, 2, 4]


def test_the_consensus_head_has_the_best_worst_rank():
    # head 2: ranks 2, 2, 3 (worst 3); head 0: ranks 1, 1, 4 (worst 4): the paper's "rank 3 in every bf16 arm"
    refs = [np.array([9, 1, 8, 0, 7]), np.array([9, 2, 8, 7, 0]), np.array([1, 9, 7, 8, 0])]
    assert consensus_head(refs) == 2
    # a tie in the worst rank goes to the better mean rank, then to the lower index
    # (heads 0 and 2 both worst rank 3; head 2's mean 2 beats head 0's 2.5)
    assert consensus_head([np.array([3.0, 4.0, 2.0, 1.0]), np.array([2.0, 1.0, 4.0, 3.0])]) == 2
    assert consensus_head([np.array([1.0, 2.0]), np.array([2.0, 1.0])]) == 0
    with pytest.raises(UserError):
        consensus_head([])


def test_moving_a_head_keeps_every_other_head_in_its_order():
    scores = np.array([0.9, 0.1, 0.8, 0.7, 0.2, 0.6, 0.5, 0.4])   # order 0, 2, 3, 5, 6, 7, 4, 1
    probed = moved_into_rank(scores, head=1, rank=3)
    assert np.argsort(-probed, kind="stable").tolist() == [0, 2, 1, 3, 5, 6, 7, 4]
    # a head already above the rank moves down to it
    assert np.argsort(-moved_into_rank(scores, 0, 2), kind="stable").tolist() == [2, 0, 3, 5, 6, 7, 4, 1]
    # moving a head to its own rank changes no order
    assert np.array_equal(np.argsort(-moved_into_rank(scores, 3, 3), kind="stable"), np.argsort(-scores, kind="stable"))
    with pytest.raises(UserError):
        moved_into_rank(scores, 1, 9)


def test_the_probe_files_top_k_is_the_arms_top_k_minus_one_plus_the_head(tmp_path):
    rng = np.random.default_rng(3)
    refs = [rng.normal(size=8) for _ in range(3)]
    arm = rng.normal(size=8)
    arm[consensus_head(refs)] = arm.min() - 1.0      # the arm ranks the references' head last
    for seed, ref in enumerate(refs):
        write_json(tmp_path / "HD-S" / f"ref-s{seed}" / "head_sets_contrast.json", _sets(ref))
    write_json(tmp_path / "HD-S" / "arm-s0" / "head_sets_contrast.json", _sets(arm))
    write_json(tmp_path / "HD-S" / "ref-s9" / "other.json", {})      # no ranking there: not a reference
    found = reference_dirs(tmp_path / "HD-S", "ref")
    assert [d.name for d in found] == ["ref-s0", "ref-s1", "ref-s2"]

    record = write_probe(tmp_path / "HD-S" / "arm-s0", found, 3, tmp_path / "probe")
    head = consensus_head(refs)
    assert record["head"] == f"l{head // 4}h{head % 4}" and record["moved_to"] == 3
    assert record["rank_in_arm"] == int(ranks(arm)[head])
    assert record["reference_ranks"] == [int(ranks(r)[head]) for r in refs]
    body = load_head_sets(tmp_path / "probe" / "head_sets_contrast.json")
    assert body["phases"]["P1"] == _sets(arm)["phases"]["P1"]          # only the probed phase changes
    masks = head_set_masks(phase="P2C", note_id="n", bins=[3], global_scores=phase_scores(body, "P2C"),
                           own_scores=None, n_layers=2, n_heads=4, seed=0)
    top = set(np.flatnonzero(masks[("top", 3)].flatten().numpy()).tolist())
    own_top2 = [int(h) for h in np.argsort(-arm, kind="stable") if h != head][:2]
    assert top == {*own_top2, head}


def test_a_head_already_inside_the_top_k_keeps_its_rank():
    arm = np.array([0.9, 0.8, 0.1, 0.0])            # head 0 ranks 1 in the arm and in every reference
    body, record = probe_head_sets(_sets(arm, 1, 4), [_sets(np.array([1.0, 0.0, 0.0, 0.0]), 1, 4)], 2)
    assert (record["head"], record["rank_in_arm"], record["moved_to"]) == ("l0h0", 1, 1)
    assert np.array_equal(np.argsort(-phase_scores(body, "P2C"), kind="stable"), np.argsort(-arm, kind="stable"))


def test_references_of_another_shape_are_refused():
    with pytest.raises(UserError, match="not of the arm"):
        probe_head_sets(_sets(np.arange(8.0)), [_sets(np.arange(6.0), n_layers=2, n_heads=3)], 2)
