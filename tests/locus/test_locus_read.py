"""Table 33's read at the locus (mistill.locus.read): the groups, a locus's group means and the summary by hand."""

import numpy as np
import pytest
from scipy.stats import binomtest

from mistill.instrument.readside import CAT, CATEGORIES
from mistill.locus.read import GROUPS, MEASURES, locus_groups, locus_values, summarize_locus_reads


def _shares(**mass) -> list[float]:
    row = np.zeros(len(CATEGORIES))
    for name, x in mass.items():
        row[CAT[name]] = x
    return row.tolist()


def test_the_groups_are_the_rankings_ends_and_a_seeded_draw():
    prose, emission = np.array([0.5, -1.0, 2.0, 0.1, 0.0, 0.3]), np.array([0.0, 3.0, 1.0, 0.0, -2.0, 0.5])
    groups = locus_groups(prose, emission, 2, np.random.default_rng(0))
    assert groups["prosetime_top"] == [2, 0] and groups["prosetime_bottom"] == [1, 4]
    assert groups["emission_top"] == [1, 2]
    assert len(set(groups["random"])) == 2 and groups["random"] == sorted(groups["random"])
    assert groups == locus_groups(prose, emission, 2, np.random.default_rng(0))


def test_a_locus_group_mean_by_hand():
    """The region is the chapter's lines (own, category, chapter and near-miss lines); lift and n_eff average
    where defined."""
    locus = {"heads": [3, 7, 9],
             "shares": [_shares(own_line=0.1, chapter_lines=0.2, note=0.3, trace_prose=0.4),
                        _shares(category_lines=0.05, other_chapter_lines=0.5, sink=0.45),
                        _shares(note=1.0)],
             "lift": [2.0, None, 4.0], "n_eff": [10.0, 30.0, None]}
    got = locus_values(locus, [3, 7])
    assert got["region"] == pytest.approx((0.3 + 0.05) / 2) and got["other_chapters"] == pytest.approx(0.25)
    assert got["note"] == pytest.approx(0.15) and got["reasoning_prose"] == pytest.approx(0.2)
    assert got["sink"] == pytest.approx(0.225) and got["lift"] == 2.0 and got["n_eff"] == 20.0
    assert locus_values(locus, [9])["lift"] == 4.0 and np.isnan(locus_values(locus, [9])["n_eff"])


def test_the_summary_means_over_loci_and_counts_notes_by_hand():
    def locus(region_by_head):
        return {"heads": [0, 1], "shares": [_shares(own_line=r, note=1 - r) for r in region_by_head],
                "lift": [1.0, 1.0], "n_eff": [5.0, 5.0]}

    groups = {"prosetime_top": [0], "emission_top": [1], "prosetime_bottom": [1], "random": [1]}
    notes = {"a": {"groups": groups, "loci": [locus([0.4, 0.1]), locus([0.2, 0.3])]},   # top 0.3 vs 0.2: higher
             "b": {"groups": groups, "loci": [locus([0.0, 0.5])]},                      # lower
             "c": {"groups": groups, "loci": [locus([0.6, 0.2])]},                      # higher
             "d": {"groups": groups, "loci": []}}                                       # no locus: not counted
    got = summarize_locus_reads(notes)
    assert got["notes"] == 3
    assert got["groups"]["prosetime_top"]["loci"] == 4
    assert got["groups"]["prosetime_top"]["region"] == pytest.approx((0.4 + 0.2 + 0.0 + 0.6) / 4)
    assert got["groups"]["random"]["note"] == pytest.approx(1 - (0.1 + 0.3 + 0.5 + 0.2) / 4)
    beats = got["prosetime_region_beats_random"]
    assert (beats["notes_higher"], beats["notes_lower"], beats["notes"]) == (2, 1, 3)
    assert beats["p_value"] == pytest.approx(binomtest(2, 3).pvalue)
    assert set(got["groups"]) == set(GROUPS) and set(got["groups"]["random"]) == {"loci", *MEASURES}
