"""Donor matching and the aggregation of necessity and knock-in (Sec. 3.1, App. C, D)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mistill.errors import UserError
from mistill.instrument.events import Event
from mistill.instrument.knockin import head_set_masks, match_donor_events, summarize


def _ev(kind, target, pos=1):
    return Event(kind, pos, target, [99], 0)


def test_donor_event_is_the_first_of_the_kind_with_a_different_choice():
    clean = [_ev("P1", 1), _ev("P1", 2), _ev("P2", 5), _ev("P2C", 7)]
    donor = [_ev("P1", 1), _ev("P2", 5), _ev("P1", 3), _ev("P2", 6), _ev("P1", 2)]
    assert match_donor_events(clean, donor) == [2, 0, 3, None]
    assert match_donor_events(clean, donor, "index") == [2, 2, 3, None]


def test_head_sets_top_bottom_random_own():
    scores = np.array([0.5, -1.0, 2.0, 0.1, 0.0, -0.2])
    own = np.array([0.0, 3.0, 0.0, 0.0, 1.0, 0.0])
    masks = head_set_masks(phase="P1", note_id="n", bins=[2, 9], global_scores=scores, own_scores=own,
                           n_layers=2, n_heads=3, seed=0)
    assert set(masks) == {("top", 2), ("bottom", 2), ("random", 2), ("own", 2)}  # k=9 > 6 heads: dropped
    assert masks[("top", 2)].flatten().nonzero().flatten().tolist() == [0, 2]
    assert masks[("bottom", 2)].flatten().nonzero().flatten().tolist() == [1, 5]
    assert masks[("own", 2)].flatten().nonzero().flatten().tolist() == [1, 4]
    assert int(masks[("random", 2)].sum()) == 2
    again = head_set_masks(phase="P1", note_id="n", bins=[2], global_scores=scores, own_scores=None,
                           n_layers=2, n_heads=3, seed=0)
    assert torch.equal(again[("random", 2)], masks[("random", 2)])
    one = head_set_masks(phase="P1", note_id="n", bins=[1], global_scores=scores, own_scores=own,
                         n_layers=2, n_heads=3, seed=0)     # k = 1: the bottom head alone, head 1
    assert one[("bottom", 1)].flatten().nonzero().flatten().tolist() == [1]
    assert one[("top", 1)].flatten().nonzero().flatten().tolist() == [2]


def _row(clean, corr, full, top, rnd, abl_top, abl_rnd):
    return {"kind": "P1", "margin_clean": clean, "margin_corr": corr, "margin_all": full,
            "knockin": {"top": {"2": top}, "random": {"2": rnd}},
            "necessity": {"top": {"2": abl_top}, "random": {"2": abl_rnd}}}


def test_summary_is_the_median_over_notes_of_per_note_means_with_the_range_gate():
    rows = {
        "a": [_row(4.0, -2.0, 4.0, 1.0, -1.5, 1.0, 3.5), _row(2.0, 1.5, 2.0, 1.9, 1.6, 0.0, 2.0)],  # 2nd fails gate
        "b": [_row(5.0, 0.0, 5.0, 5.0, 0.5, 2.5, 5.0)],
        "c": [_row(1.0, -1.0, 1.0, -0.5, 0.0, 2.0, 1.0)],
    }
    out = summarize(rows, bins=[2], min_range=1.0)["phases"]["P1"]
    cell = out["bins"]["2"]
    # knock-in: a: (1 - -2)/6 = 0.5 ; b: 1.0 ; c: (-0.5 - -1)/2 = 0.25 -> median 0.5
    assert np.isclose(cell["knockin"]["top"]["median"], 0.5)
    # random: a: 0.5/6 ; b: 0.1 ; c: 0.5 -> median 0.1
    assert np.isclose(cell["knockin"]["random"]["median"], 0.1)
    # necessity: a: mean(0.75, 1.0) = 0.875 ; b: 0.5 ; c: -1.0 -> median 0.5
    assert np.isclose(cell["necessity"]["top"]["median"], 0.5)
    assert cell["knockin"]["vs"]["random"]["notes_top_above"] == 2  # a and b beat random, c does not
    assert np.isclose(out["range_gate_pass_rate"], 3 / 4)
    assert out["all_heads_minus_clean_max_abs"] == 0.0


def test_patients_as_units_average_their_notes_means_first():
    """App. C "Patients": notes a and b are one patient's two prompt variants, c another patient."""
    rows = {
        "a": [_row(4.0, -2.0, 4.0, 1.0, -1.5, 1.0, 3.5), _row(2.0, 1.5, 2.0, 1.9, 1.6, 0.0, 2.0)],
        "b": [_row(5.0, 0.0, 5.0, 5.0, 0.5, 2.5, 5.0)],
        "c": [_row(1.0, -1.0, 1.0, -0.5, 0.0, 2.0, 1.0)],
    }
    out = summarize(rows, bins=[2], min_range=1.0, units={"a": "p1", "b": "p1", "c": "p2"})["phases"]["P1"]
    cell = out["bins"]["2"]
    # knock-in per note a 0.5, b 1.0, c 0.25 -> patients p1 0.75, p2 0.25 -> median 0.5 over two patients
    assert np.isclose(cell["knockin"]["top"]["median"], 0.5) and cell["knockin"]["top"]["n_notes"] == 2
    # necessity per note a 0.875, b 0.5, c -1.0 -> patients 0.6875, -1.0 -> median -0.15625
    assert np.isclose(cell["necessity"]["top"]["median"], (0.6875 - 1.0) / 2)
    assert cell["knockin"]["vs"]["random"]["notes"] == 2      # the sign test counts patients
    with pytest.raises(UserError, match="no patient"):
        summarize(rows, bins=[2], units={"a": "p1"})
