"""Training-set size (App. M.5): the learning curve's subsets are nested, keep the targets' order and depend on
the ids alone."""

from __future__ import annotations

import hashlib

import pytest

from mistill.distill.subsets import training_subset
from mistill.errors import UserError

IDS = [f"note-{i:03d}" for i in range(40)]


def test_the_subset_is_the_ids_with_the_smallest_digests_in_the_targets_order():
    digest = {i: hashlib.sha256(i.encode()).hexdigest() for i in IDS}
    expected = [i for i in IDS if digest[i] <= sorted(digest.values())[9]]   # the ten smallest digests
    assert training_subset(IDS, 10) == expected
    assert len(expected) == 10 and expected != IDS[:10]   # not simply the first notes of the file


def test_smaller_subsets_lie_inside_larger_ones_whatever_the_file_order():
    shuffled = IDS[::-1]
    for small, large in ((1, 8), (8, 25), (25, 40)):
        assert set(training_subset(IDS, small)) <= set(training_subset(IDS, large))
        assert set(training_subset(IDS, small)) == set(training_subset(shuffled, small))
    assert training_subset(IDS, 40) == IDS and training_subset(IDS, None) == IDS


@pytest.mark.parametrize("n", [0, -3, 41])
def test_a_size_outside_the_targets_is_refused(n):
    with pytest.raises(UserError, match="give 1 to 40"):
        training_subset(IDS, n)


def test_a_note_named_twice_is_refused():
    with pytest.raises(UserError, match="twice"):
        training_subset(["a", "b", "a"], 2)
