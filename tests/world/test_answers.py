from __future__ import annotations

import pytest

from mistill.world.answers import ascending_share, is_degenerate, last_json_list, parse_answer
from mistill.world.inventory import Inventory
from mistill.world.types import Code


def test_answer_is_the_last_list_after_think(small_inv):
    completion = ('<think>\nmaybe ["E11.9"] or N18.1 ... rejected N18.1\n</think>\n\n'
                  'draft ["I10"]\nfinal answer:\n["N18.9", "E11.65"]')
    parsed = parse_answer(completion, small_inv, hit_cap=False)
    assert parsed.valid and not parsed.degenerate and not parsed.hit_cap
    assert parsed.answer == ("N18.9", "E11.65")


def test_codes_in_reasoning_are_never_scraped(small_inv):
    parsed = parse_answer('<think>\n["N18.9", "I10"]\n</think>\nno list here', small_inv, hit_cap=False)
    assert parsed.valid and parsed.answer == ()


def test_normalised_restricted_deduplicated_in_emission_order(small_inv):
    completion = '<think>x</think>["i10", "n189", "N18.9", "Z99.9", 7, "e11.65", " I10 "]'
    parsed = parse_answer(completion, small_inv, hit_cap=False)
    assert parsed.answer == ("I10", "N18.9", "E11.65")
    assert parsed.emitted == ("i10", "n189", "N18.9", "Z99.9", "e11.65", " I10 ")


@pytest.mark.parametrize("completion, hit_cap", [
    ('<think>\nstill thinking ["N18.9"]', False),          # never closed
    ('<think>\n...</think>\n["N18.9"]', True),             # reached the cap
])
def test_invalid_generations_score_empty(small_inv, completion, hit_cap):
    parsed = parse_answer(completion, small_inv, hit_cap=hit_cap)
    assert not parsed.valid and parsed.answer == ()
    assert parsed.degenerate == hit_cap


def test_nested_and_malformed_lists():
    assert last_json_list('a ["x", ["y"]] b') == ["x", ["y"]]
    assert last_json_list("['N18.9']") is None              # no JSON repair
    assert last_json_list('["A"] [broken ["B"]') == ["B"]
    assert last_json_list("[1, 2] and [3") == [1, 2]


def _inventory(n: int) -> Inventory:
    return Inventory(Code(f"A{i:02d}.0", f"code {i}") for i in range(n))


def test_degenerate_guard_on_sorted_and_long_lists():
    inv = _inventory(60)
    sorted_ten = [f"A{i:02d}.0" for i in range(10)]
    assert ascending_share(sorted_ten) == 1.0
    listed = lambda codes: "<think>x</think>" + str(codes).replace("'", '"')
    assert parse_answer(listed(sorted_ten), inv, hit_cap=False).degenerate
    assert not parse_answer(listed(sorted_ten[:9]), inv, hit_cap=False).degenerate   # fewer than 10
    # one descending pair in ten codes: 8 of 9 pairs ascending = 0.889, not above 0.9
    mixed = sorted_ten[:8] + [sorted_ten[9], sorted_ten[8]]
    assert ascending_share(mixed) == pytest.approx(8 / 9)
    assert not is_degenerate(mixed, False)
    shuffled_51 = [f"A{(i * 37) % 60:02d}.0" for i in range(51)]
    assert ascending_share(shuffled_51) < 0.9 and len(set(shuffled_51)) == 51
    assert parse_answer(listed(shuffled_51), inv, hit_cap=False).degenerate          # more than 50
    assert not is_degenerate(shuffled_51[:50], False)
