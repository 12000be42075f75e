"""A hand-made shortlist prompt, a teacher completion and its events, shared by the distill tests."""

import pytest

from mistill.world.prompt import build_prompt

LINES = [
    "N18.3 Chronic kidney disease, stage 3",
    "I10.0 Essential hypertension",
    "N18.9 Chronic kidney disease, unspecified",
    "E11.9 Type 2 diabetes mellitus without complications",
    "N17.9 Acute kidney failure, unspecified",
]
NOTE_TEXT = " ".join(f"word{i}" for i in range(70))
COMPLETION = ('<think>\nThe note describes kidney disease. Consider N18.3 first. '
              'Then N18.9 fits better than N18.3.\n</think>\n\n["N18.9"]')


def _anchor(sub, nth=0, offset=0):
    start = -1
    for _ in range(nth + 1):
        start = COMPLETION.index(sub, start + 1)
    return start + offset


def make_events():
    """P1 at each first mention's letter, P2 at the digits after the letter, P2C where N18.9 departs
    from its earlier sibling N18.3 (App. C event definitions)."""
    letters = [chr(c) for c in range(ord("A"), ord("Z") + 1) if chr(c) != "U"]
    events = []
    for code, nth in (("N18.3", 0), ("N18.9", 0)):
        a = _anchor(code, nth)
        events.append({"kind": "P1", "pos": -1, "target_id": -1, "competitor_ids": [], "anchor": a,
                       "code": code, "prefix": "", "competitors": [f" {x}" for x in letters if x != "N"]})
        for k, ch in enumerate(code[1:], start=1):
            if ch == ".":
                continue
            events.append({"kind": "P2", "pos": -1, "target_id": -1, "competitor_ids": [], "anchor": a + k,
                           "code": code, "prefix": code[:k], "competitors": ["7" if ch != "7" else "8"]})
    a = _anchor("N18.9") + 4
    events.append({"kind": "P2C", "pos": -1, "target_id": -1, "competitor_ids": [], "anchor": a, "code": "N18.9",
                   "prefix": "N18.", "near_miss": "N18.3", "competitors": ["3"]})
    return events


@pytest.fixture(scope="module")
def note_prompt():
    return build_prompt(NOTE_TEXT, LINES)


@pytest.fixture(scope="module")
def completion():
    return COMPLETION


@pytest.fixture(scope="module")
def events():
    return make_events()


@pytest.fixture(scope="module")
def lines():
    return LINES
