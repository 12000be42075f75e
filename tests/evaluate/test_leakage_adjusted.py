"""Hase et al.'s leakage-adjusted simulatability on App. K's multi-label notes: a table worked by hand, an
empty group, its properties, Hase et al.'s own 0/1 formula on single-code answers, and the LAS stage's
fidelity step that writes it beside App. K's LAS."""

import json
import random

import numpy as np
import pytest

from mistill.evaluate.fidelity import simulatability_gain, simulatability_gain_per_note
from mistill.evaluate.leakage_adjusted import leak_flags, leakage_adjusted, leaks

# note: (teacher answer a_T, sim(note ⊕ r), sim(note), sim(r))
TABLE = {
    "n1": (["A", "B"], ["A", "B"], ["A"], ["A", "B"]),          # F1 1 - 2/3 = 1/3; r alone gives a_T: leaks
    "n2": (["C"], ["C"], [], ["C"]),                             # 1 - 0 = 1; leaks
    "n3": (["D", "E"], ["D"], ["D", "E", "F"], ["D"]),           # 2/3 - 4/5 = -2/15; F1(r alone) 2/3: no leak
    "n4": ([], [], ["G"], []),                                   # 1 - 0 = 1; two empty sets agree: leaks
    "n5": (["H"], ["I"], ["H"], ["I", "H"]),                     # 0 - 1 = -1; F1(r alone) 2/3: no leak
    "n6": (["J", "K"], ["J", "K"], ["J", "K"], ["K", "J"]),      # 1 - 1 = 0; the same set in another order: leaks
}
GAINS = {"n1": 1 / 3, "n2": 1.0, "n3": -2 / 15, "n4": 1.0, "n5": -1.0, "n6": 0.0}
LEAKS = {"n1": True, "n2": True, "n3": False, "n4": True, "n5": False, "n6": True}


def leakage_adjusted_from_answers(with_r, note_only, alone, teacher):
    """The stage's path (`mistill evaluate fidelity`): App. K's per-note gains, each note's leak, the adjusted mean."""
    return leakage_adjusted(simulatability_gain_per_note(with_r, note_only, teacher), leak_flags(alone, teacher))


def columns(notes):
    """(with_rationale, note_only, rationale_only, teacher) answers of the table's notes, in order."""
    rows = [TABLE[n] for n in notes]
    return [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows], [r[0] for r in rows]


def test_the_table_by_hand():
    """Leaking group n1, n2, n4, n6: (1/3 + 1 + 1 + 0) / 4 = 7/12; the rest n3, n5: (-2/15 - 1) / 2 = -17/30;
    leakage-adjusted (7/12 - 17/30) / 2 = 1/120, where App. K's gain averages all six notes to 1/5."""
    with_r, note_only, alone, teacher = columns(TABLE)
    assert simulatability_gain_per_note(with_r, note_only, teacher) == pytest.approx(list(GAINS.values()))
    assert [leaks(r, a) for r, a in zip(alone, teacher)] == list(LEAKS.values())
    result = leakage_adjusted_from_answers(with_r, note_only, alone, teacher)
    assert (result.n_leaking, result.n_nonleaking) == (4, 2)
    assert result.leaking_gain == pytest.approx(7 / 12)
    assert result.nonleaking_gain == pytest.approx(-17 / 30)
    assert result.value == pytest.approx(1 / 120)
    assert simulatability_gain(with_r, note_only, teacher) == pytest.approx(1 / 5)
    assert result.as_dict() == {"value": result.value, "leaking": {"notes": 4, "mean_gain": result.leaking_gain},
                                "nonleaking": {"notes": 2, "mean_gain": result.nonleaking_gain}}


@pytest.mark.parametrize("notes, group, mean", [
    (["n3", "n5"], "leaking", -17 / 30),          # no rationale leaks
    (["n1", "n2"], "nonleaking", (1 / 3 + 1) / 2),  # every rationale leaks
])
def test_an_empty_group_leaves_the_other_groups_mean_which_is_app_ks_gain(notes, group, mean):
    with_r, note_only, alone, teacher = columns(notes)
    result = leakage_adjusted_from_answers(with_r, note_only, alone, teacher)
    assert getattr(result, f"{group}_gain") is None and getattr(result, f"n_{group}") == 0
    assert result.value == pytest.approx(mean)
    assert result.value == pytest.approx(simulatability_gain(with_r, note_only, teacher))


def test_leaks_is_set_equality():
    assert leaks(["A", "B"], ["B", "A"]) and leaks(["A", "A"], ["A"]) and leaks([], [])
    assert not leaks(["A"], ["A", "B"]) and not leaks(["A", "B"], ["A"]) and not leaks([], ["A"])


def test_each_group_weighs_half_however_many_notes_it_holds():
    """Repeating the leaking notes moves App. K's mean gain toward theirs, and leaves the adjusted value."""
    gains, leaking = list(GAINS.values()), list(LEAKS.values())
    base = leakage_adjusted(gains, leaking).value
    more = [g for g, k in zip(gains, leaking) if k] * 5
    assert leakage_adjusted(gains + more, leaking + [True] * len(more)).value == pytest.approx(base)
    assert np.mean(gains + more) != pytest.approx(np.mean(gains))


def test_equal_groups_give_app_ks_mean_gain_and_order_does_not_matter():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 6)
        gains = [rng.uniform(-1, 1) for _ in range(2 * n)]
        leaking = [True] * n + [False] * n
        assert leakage_adjusted(gains, leaking).value == pytest.approx(float(np.mean(gains)))
        order = list(range(2 * n))
        rng.shuffle(order)
        shuffled = leakage_adjusted([gains[i] for i in order], [leaking[i] for i in order])
        assert shuffled.value == pytest.approx(leakage_adjusted(gains, leaking).value)


def test_bounded_by_the_gains_and_by_one():
    rng = random.Random(1)
    for _ in range(200):
        n = rng.randint(1, 12)
        gains = [rng.choice([-1.0, 1.0, 0.0, rng.uniform(-1, 1)]) for _ in range(n)]
        value = leakage_adjusted(gains, [rng.random() < 0.5 for _ in range(n)]).value
        assert -1.0 <= min(gains) and max(gains) <= 1.0
        assert min(gains) - 1e-12 <= value <= max(gains) + 1e-12


def _hase_unweighted_mean(labels, xe, x, e) -> float:
    """Hase et al.'s `compute_sim` on 0/1 correctness: the mean over the leaked and non-leaked splits of
    mean(correct given x and e) - mean(correct given x)."""
    xe_correct, x_correct = np.array(labels) == np.array(xe), np.array(labels) == np.array(x)
    leaked = np.argwhere(np.array(labels) == np.array(e)).reshape(-1)
    nonleaked = np.setdiff1d(np.arange(len(labels)), leaked)
    return float(np.mean([np.mean(xe_correct[s]) - np.mean(x_correct[s]) for s in (leaked, nonleaked)]))


def test_single_code_answers_give_hase_et_als_formula():
    """With one code per answer, F1 is Hase et al.'s 0/1 correctness and F1 = 1 their leak indicator."""
    rng = random.Random(2)
    codes = ["A", "B", "C"]
    checked = 0
    for _ in range(300):
        n = rng.randint(2, 10)
        labels, xe, x, e = ([rng.choice(codes) for _ in range(n)] for _ in range(4))
        if len(set(a == b for a, b in zip(labels, e))) < 2:    # Hase et al.'s code gives NaN on an empty split
            continue
        ours = leakage_adjusted_from_answers([[c] for c in xe], [[c] for c in x], [[c] for c in e],
                                             [[c] for c in labels])
        assert ours.value == pytest.approx(_hase_unweighted_mean(labels, xe, x, e))
        checked += 1
    assert checked > 100


def test_inputs_of_unequal_length_and_no_notes_are_refused():
    with pytest.raises(ValueError, match="2 gains for 1"):
        leakage_adjusted([0.1, 0.2], [True])
    with pytest.raises(ValueError, match="no notes"):
        leakage_adjusted([], [])
    with pytest.raises(ValueError, match="rationale-only"):
        leakage_adjusted_from_answers([["A"]], [["A"]], [], [["A"]])


def test_the_las_stage_writes_it_beside_app_ks_las(tmp_path):
    """`mistill evaluate fidelity --simulator` on the table's answers: App. K's LAS as before, the leakage-adjusted
    LAS, its groups and each note's leak beside it; a file without rationale-only answers gives App. K's LAS alone."""
    from mistill.evaluate.commands import commands_parser
    from mistill.io import write_jsonl

    teacher = tmp_path / "teacher.jsonl"
    write_jsonl(teacher, [{"note_id": n, "answer": row[0], "valid": True} for n, row in TABLE.items()])
    rows = [{"note_id": n, "with_rationale": row[1], "note_only": row[2], "rationale_only": row[3]}
            for n, row in TABLE.items()]
    runs = {"three": rows, "two": [{k: v for k, v in r.items() if k != "rationale_only"} for r in rows]}
    out = {}
    for name, simulator_rows in runs.items():
        write_jsonl(tmp_path / f"{name}.jsonl", simulator_rows)
        args = commands_parser().parse_args(["fidelity", "--simulator", str(tmp_path / f"{name}.jsonl"),
                                             "--teacher-traces", str(teacher), "--out", str(tmp_path / f"{name}.json")])
        assert args.func(args) == 0
        out[name] = json.loads((tmp_path / f"{name}.json").read_text())
    three, two = out["three"], out["two"]
    assert three["metrics"]["las"] == two["metrics"]["las"] == pytest.approx(1 / 5)
    assert three["per_note"]["las"] == pytest.approx(GAINS) and three["per_note"]["leaks"] == LEAKS
    assert three["metrics"]["las_leakage_adjusted"] == pytest.approx(1 / 120)
    assert three["leakage_adjusted"]["leaking"]["notes"] == 4
    assert three["leakage_adjusted"]["nonleaking"]["mean_gain"] == pytest.approx(-17 / 30)
    assert "las_leakage_adjusted" not in two["metrics"] and "leakage_adjusted" not in two
