from __future__ import annotations

import json

import pytest
import simple_icd_10_cm as icd

from mistill.errors import UserError
from mistill.world.inventory import demo_inventory, load_inventory, shared_order, write_inventory
from mistill.world.types import Code


def test_demo_inventory_keeps_whole_categories_with_siblings(demo_inv):
    assert 180 <= len(demo_inv) <= 240
    for category, codes in demo_inv.categories().items():
        leaves = [d for d in icd.get_descendants(category) if icd.is_leaf(d)] or [category]
        assert sorted(codes) == sorted(leaves), category          # whole category kept
        assert 2 <= len(codes) <= 8
    for code in demo_inv.codes:
        assert icd.is_leaf(code)                                  # billable
        assert len(demo_inv.siblings(code)) >= 1                  # near-misses exist
        assert code not in demo_inv.siblings(code)
    assert len(demo_inv.chapter_letters()) >= 15                  # many chapters


def test_demo_inventory_deterministic_and_shuffled(demo_inv):
    again = demo_inventory(200, 0)
    assert again == demo_inv
    assert list(demo_inv.codes) != sorted(demo_inv.codes)        # the shuffle removes ICD order
    assert demo_inventory(200, 1).codes != demo_inv.codes


def test_shared_order_ignores_input_order():
    codes = [Code(f"A0{i}.{j}", "x") for i in range(3) for j in range(3)]
    assert shared_order(codes, 7) == shared_order(list(reversed(codes)), 7)


def test_lines_and_restrict_keep_the_shared_order(small_inv):
    assert small_inv.lines()[0] == "N18.9 chronic kidney disease unspecified"
    shortlist = small_inv.restrict(["E11.65", "N18.9", "I10"])
    assert shortlist.codes == ("N18.9", "I10", "E11.65")
    assert shortlist.lines() == [l for l in small_inv.lines() if l.split()[0] in {"E11.65", "N18.9", "I10"}]
    with pytest.raises(UserError):
        small_inv.restrict(["Z99.9"])


def test_lookup_siblings_letters(small_inv):
    assert small_inv.lookup("n189").code == "N18.9"
    assert small_inv.lookup("e1165") is small_inv["E11.65"]
    assert small_inv.siblings("N18.1") == ("N18.9",)
    assert small_inv.siblings("I10") == ()
    assert small_inv.chapter_letters() == ("E", "I", "N")
    assert small_inv.region("N") == ("N18.9", "N18.1")


def test_inventory_round_trip(tmp_path, small_inv):
    path = tmp_path / "inventory.jsonl"
    write_inventory(path, small_inv)
    assert load_inventory(path) == small_inv


@pytest.mark.parametrize("bad_line, message", [
    ("{not json", "not a JSON object"),
    ('{"code": "N18.9"}', "expected"),
    ('{"code": "n189", "description": "x"}', "dotted"),
    ('{"code": "N18.2", "description": "  "}', "empty description"),
    ('{"code": "N18.9", "description": "again"}', "duplicate"),
])
def test_malformed_inventory_line_names_file_and_line(tmp_path, small_inv, bad_line, message):
    path = tmp_path / "inventory.jsonl"
    rows = [json.dumps(r) for r in small_inv.to_rows()]
    rows.insert(2, bad_line)
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(UserError, match=rf"inventory.jsonl:3: .*{message}"):
        load_inventory(path)
